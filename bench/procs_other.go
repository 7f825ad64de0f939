//go:build !linux

package bench

import "os/exec"

// dieWithHarness: only Linux kills children with their parent.
func dieWithHarness(*exec.Cmd) {}
