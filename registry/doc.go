// Package registry is the discovery plane's data model: endpoint identity,
// the v1 etcd key schema, validation of every name that reaches a key, and
// the value codec.
//
// Invariants that every other package relies on:
//
//   - A key is built only from names that passed ValidateName, so no input can
//     produce a key outside its origin subtree (no "/", no NUL, no "." or "..",
//     no empty segment).
//   - ParseEndpointKey inverts EndpointKey exactly; a key it accepts rebuilds
//     to the same string.
//   - The value stored at a key is the binary ServiceEndpoint whose identity
//     is the key; DecodeEndpoint rejects a value that disagrees with its key.
//
// The schema is origin-first so that each region owns one contiguous subtree
// (the replicator mirrors it verbatim) and each cluster one slice of that
// (its sweep ranges it):
//
//	/aether/v1/regions/<region>/clusters/<cluster>/services/<service>/protocols/<proto>/endpoints/<ip>
package registry
