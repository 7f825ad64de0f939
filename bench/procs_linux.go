package bench

import (
	"os/exec"
	"syscall"
)

// dieWithHarness has the kernel kill a child process when the harness
// dies, so an interrupted run leaves no etcd or registrar behind.
func dieWithHarness(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
