// Package bench is Aether's benchmark harness: scenarios that start real
// registrars over a real etcd on this machine, drive them over real gRPC
// sockets, and report figures. It is run by "aether bench", which prints a
// summary, writes the figures into docs/benchmarks.md, and ends with one JSON
// line. Benchmarks measure; the test suite asserts behaviour.
package bench
