package systemd_test

import (
	"os/exec"
	"syscall"

	"github.com/batonhq/baton/internal/proctest"
)

// process is one running or finished process of a deployment, with every
// line it wrote.
type process = proctest.Process

// start runs cmd as a process of the deployment, as systemd runs a unit's
// command: in a process group of its own, so that a signal reaches only
// it, and as the user cred when it is not nil. Every line it quotes in a
// failure is masked. It refuses once the deployment stops.
func (d *deployment) start(name string, cmd *exec.Cmd, cred *syscall.Credential, opts proctest.Options) (*process, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cred}
	opts.Mask = d.mask
	return d.group.Start(name, cmd, opts)
}
