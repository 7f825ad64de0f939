//go:build !linux

package bench

import "errors"

func pinProcess(pid int, cpus []int) error {
	return errors.New("pinning a process to CPUs needs Linux")
}
