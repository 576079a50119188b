// Package sudo is sudo inside a sandbox that has a root: a client (the
// sandbox binary under the name sudo) that asks the agent to run a
// command as root, and the agent's side, which checks who asks.
//
// This is sudo as E2B's templates give it to their user (passwordless,
// for everything), where the sandbox has a root: a template made from an
// image, whose agent runs as the sandbox's root.
//
// A setuid sudo cannot work here: every process of a sandbox runs with
// no_new_privs, which the seccomp filter relies on and which makes the
// kernel ignore setuid bits. So sudo is a client instead (mounted
// read-only at layout.SudoPath): it asks the agent, over a unix socket,
// to run a command as root with its own stdin, stdout and stderr (passed
// as file descriptors), waits for it, relays the signals it gets, and
// exits as the command did. Nothing gains a privilege it did not have:
// the command runs with exactly what any process the agent starts for
// "root" has (the same capabilities, seccomp filter, no_new_privs and
// cgroups), and that root is the sandbox's, not the host's (a user
// namespace's, or gVisor's).
//
// The socket is abstract, in the sandbox's own network namespace (each
// sandbox has one; gVisor's network stack is its own), so no path of the
// sandbox's file system can be made to point elsewhere; the agent binds
// it before any code of the sandbox runs, and checks who connects: the
// sandbox's user or root, as E2B's sudoers lets only them.
package sudo

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// socket is where the agent listens for sudo.
const socket = "@airlock-sudo"

// request is what sudo asks: run Argv as User in Dir with Env. Argv[0]
// is looked up in Env's PATH as the agent would for User.
type request struct {
	User string   `json:"user"`
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
}

// message is what goes either way after the request: the signals sudo
// relays, then how the command ended or why it did not start.
type message struct {
	Signal int    `json:"signal,omitempty"` // sudo → agent: send it to the command's process group
	Exit   *int   `json:"exit,omitempty"`   // agent → sudo: the command's exit status (128+n for signal n)
	Error  string `json:"error,omitempty"`  // agent → sudo: it did not run
}

// relayedSignals are what sudo passes on (as sudo does); anything else
// sent over the socket is ignored.
var relayedSignals = map[syscall.Signal]bool{
	unix.SIGINT: true, unix.SIGTERM: true, unix.SIGHUP: true, unix.SIGQUIT: true,
	unix.SIGUSR1: true, unix.SIGUSR2: true, unix.SIGWINCH: true, unix.SIGCONT: true,
}

// peerUID is the uid of the process at the other end of c, as the kernel
// recorded it when it connected: the one fact the agent trusts about
// who asks.
func peerUID(c *net.UnixConn) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) { cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return 0, err
	}
	if serr != nil {
		return 0, serr
	}
	return int(cred.Uid), nil
}
