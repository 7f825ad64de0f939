//go:build unix

package embedetcd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// checkDirFree fails if another etcd (in this process or another) has the
// data dir open. etcd itself would block forever on the bbolt file lock
// without a word, which to an operator looks like a hung start. The probe
// takes the same flock bbolt takes, without waiting, and releases it at
// once; a start that races past it still ends with ctx.
func checkDirFree(dir string) error {
	db := filepath.Join(dir, "member", "snap", "db")
	f, err := os.OpenFile(db, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil // a new data dir: nobody can be holding it yet
	}
	if err != nil {
		return fmt.Errorf("embedded etcd: open %s: %w", db, err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("embedded etcd: data dir %s is in use by another etcd; stop it or use another data dir", dir)
		}
		return fmt.Errorf("embedded etcd: probe lock on %s: %w", db, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_UN); err != nil {
		return fmt.Errorf("embedded etcd: release probe lock on %s: %w", db, err)
	}
	return nil
}
