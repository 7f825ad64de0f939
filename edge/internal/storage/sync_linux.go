package storage

import (
	"os"
	"syscall"
)

// fdatasync makes f's data durable without its timestamps: the one flush
// an acknowledged batch costs (etcd's WAL does the same).
func fdatasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if err != syscall.EINTR {
			return err
		}
	}
}
