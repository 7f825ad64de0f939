package bench

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// pinProcess restricts every thread of process pid to cpus. A thread's
// affinity is its own (sched_setaffinity takes a thread id), and a new
// thread inherits its creator's: so each thread listed in /proc/<pid>/task
// is set, and the listing is walked again until a walk finds none it had
// not set (a thread started by one not yet pinned, meanwhile).
func pinProcess(pid int, cpus []int) error {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	done := map[int]bool{}
	for range 10 {
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return fmt.Errorf("pin process %d: %w", pid, err)
		}
		fresh := 0
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil || done[tid] {
				continue
			}
			if err := unix.SchedSetaffinity(tid, &set); err != nil && err != unix.ESRCH {
				return fmt.Errorf("pin thread %d of process %d to CPUs %v: %w", tid, pid, cpus, err)
			}
			done[tid] = true
			fresh++
		}
		if fresh == 0 {
			return nil
		}
	}
	return fmt.Errorf("pin process %d: it kept starting threads", pid)
}
