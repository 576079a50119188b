package namespaces

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/backend/namespaces/nsinit"
)

// How a sandbox's init comes to be: a fork, by whichever process forks
// inits (forkInit), of what initFork describes.

// initFork is everything a fork of init needs, whichever process forks it.
type initFork struct {
	base  int      // the owner of init's user namespace, and its root (asOwner)
	netns *os.File // the namespace to fork init in; nil: a new, empty one
	// path is the executable, a /proc/self/fd magic link to files' last
	// (nsinit.FDs.Self), resolved by init itself.
	path string
	// stdin is nil for none (/dev/null); stdout and stderr may be one.
	stdin, stdout, stderr *os.File
	cgroupFD              int        // the cgroup to be born in (CLONE_INTO_CGROUP), or -1
	files                 []*os.File // init's descriptors 3, 4, … (nsinit.FDs)
}

// initProc is a running init, however it was forked.
type initProc interface {
	Pid() int
	// Signal sends sig to init alone, through a pidfd: never through a pid
	// that may name another process by now.
	Signal(sig syscall.Signal) error
	// Wait returns once init has ended and been reaped: its wait status,
	// and the CPU time of init and of every descendant reaped (at the end
	// of a pid namespace, every process of it).
	Wait() (unix.WaitStatus, time.Duration, error)
}

// forkInit forks init. This process forks each on its spawner thread
// (spawn.go); a daemon forks them through a spawner process instead
// (ForkThroughSpawner).
var forkInit = forkOnThread

// forkOnThread forks f as a child of this process, on its spawner thread.
func forkOnThread(f *initFork) (initProc, error) {
	cmd := initCmd(f)
	if err := asOwner(f.base, f.netns, cmd.Start); err != nil {
		return nil, err
	}
	return childInit{cmd}, nil
}

// initCmd is the exec.Cmd of f: in new namespaces, as the root of its own
// host id range from f.base.
func initCmd(f *initFork) *exec.Cmd {
	// A sandbox with a network is forked inside the namespace the host
	// made for it; one without gets a new, empty one.
	clone := uintptr(unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS)
	if f.netns == nil {
		clone |= unix.CLONE_NEWNET
	}
	cmd := &exec.Cmd{
		// Init is the sandbox binary, executed through a descriptor of it
		// (the last of the files handed over, nsinit.FDs.Self), not by
		// its path: the exec happens after the child became the
		// sandbox's root, an unprivileged host uid that may not traverse
		// the state directory. The magic link skips that lookup.
		Path:       f.path,
		Args:       []string{"airlock-sandbox", nsinit.Arg},
		Env:        []string{},
		Stdout:     f.stdout,
		Stderr:     f.stderr,
		ExtraFiles: f.files,
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags: clone,
			// The sandbox's own 65,536 ids: its root, its user, and
			// whatever ids an image's files have.
			UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: f.base, Size: hostIDRange}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: f.base, Size: hostIDRange}},
			// Without an explicit credential the child would keep host
			// uid 0 (unmapped, but still the owner of root's files).
			// Empty Groups drops host root's supplementary groups.
			Credential:                 &syscall.Credential{Uid: 0, Gid: 0, Groups: []uint32{}},
			GidMappingsEnableSetgroups: true,
			// A new session: no controlling terminal to inject input into.
			Setsid: true,
			// If the process that forks it dies, the kernel kills the
			// sandbox's init, and with it every process of its pid
			// namespace.
			Pdeathsig: syscall.SIGKILL,
		},
	}
	if f.stdin != nil { // a nil *os.File in the interface would not be nil
		cmd.Stdin = f.stdin
	}
	if f.cgroupFD >= 0 {
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, f.cgroupFD
	}
	return cmd
}

// childInit is an init this process forked.
type childInit struct{ cmd *exec.Cmd }

func (c childInit) Pid() int                        { return c.cmd.Process.Pid }
func (c childInit) Signal(sig syscall.Signal) error { return c.cmd.Process.Signal(sig) }

func (c childInit) Wait() (unix.WaitStatus, time.Duration, error) {
	backend.AwaitExit(c.cmd.Process)
	// Its files are the caller's: Wait only reaps.
	if err := c.cmd.Wait(); err != nil && !errors.As(err, new(*exec.ExitError)) {
		return 0, 0, err
	}
	st := c.cmd.ProcessState
	return unix.WaitStatus(st.Sys().(syscall.WaitStatus)), st.UserTime() + st.SystemTime(), nil
}
