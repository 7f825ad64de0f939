//go:build !unix

package etcdtest

import "errors"

// reserve is not implemented here: a stopped member's ports are left
// free, and Restart retries if another socket took one meanwhile.
func reserve(string) (func(), error) { return nil, errors.ErrUnsupported }
