package bench

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestPinProcessPinsEveryThread pins a running Go program (this test
// binary, re-run as a helper that starts threads while it is pinned) and
// reads each thread's allowed CPUs back from /proc.
func TestPinProcessPinsEveryThread(t *testing.T) {
	if os.Getenv("AETHER_PIN_HELPER") != "" {
		// Threads blocked in syscalls make the runtime start more, also
		// while the pinning walks the task list.
		for i := 0; i < 16; i++ {
			go func() {
				for {
					f, err := os.Open("/proc/self/stat")
					if err == nil {
						f.Close()
					}
					runtime.Gosched()
				}
			}()
		}
		time.Sleep(time.Minute)
		return
	}
	cpu := runtime.NumCPU() - 1 // not CPU 0, which every thread may use unpinned
	cmd := exec.Command(os.Args[0], "-test.run=^TestPinProcessPinsEveryThread$")
	cmd.Env = append(os.Environ(), "AETHER_PIN_HELPER=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	pid := cmd.Process.Pid
	threads := func() map[string]string {
		out := map[string]string{}
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, e.Name()))
			if err != nil {
				continue // exited
			}
			for _, line := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
					out[e.Name()] = strings.TrimSpace(v)
				}
			}
		}
		return out
	}
	// Started: the runtime has more than its first thread.
	deadline := time.Now().Add(10 * time.Second)
	for len(threads()) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("helper has %d threads after 10 s", len(threads()))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := pinProcess(pid, []int{cpu}); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprint(cpu)
	got := threads()
	for tid, cpus := range got {
		if cpus != want {
			t.Errorf("thread %s may run on CPUs %s, want %s", tid, cpus, want)
		}
	}
	if runtime.NumCPU() > 1 && len(got) > 0 {
		t.Logf("%d threads pinned to CPU %d", len(got), cpu)
	}
}
