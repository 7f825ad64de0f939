//go:build !unix

package embedetcd

// checkDirFree cannot probe bbolt's lock portably here; a start on a dir in
// use then waits until ctx ends, as etcd does.
func checkDirFree(string) error { return nil }
