package agent

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agent/identity"
	"github.com/airlock-sandbox/airlock/internal/agent/tasks"
)

// sudo, as E2B's templates give it to their user (passwordless, for
// everything), where the sandbox has a root: a template made from an
// image, whose agent runs as the sandbox's root.
//
// A setuid sudo cannot work here: every process of a sandbox runs with
// no_new_privs, which the seccomp filter relies on and which makes the
// kernel ignore setuid bits. So sudo is a client instead (the airlock
// binary under the name sudo, mounted read-only at layout.SudoPath): it
// asks the agent, over a unix socket, to run a command as root with its
// own stdin, stdout and stderr (passed as file descriptors), waits for it,
// relays the signals it gets, and exits as the command did. Nothing gains
// a privilege it did not have: the command runs with exactly what any
// process the agent starts for "root" has (the same capabilities,
// seccomp filter, no_new_privs and cgroups), and that root is the
// sandbox's, not the host's (a user namespace's, or gVisor's).
//
// The socket is abstract, in the sandbox's own network namespace (each
// sandbox has one; gVisor's network stack is its own), so no path of the
// sandbox's file system can be made to point elsewhere; the agent binds it
// before any code of the sandbox runs, and checks who connects: the
// sandbox's user or root, as E2B's sudoers lets only them.

// sudoSocket is where the agent listens for sudo.
const sudoSocket = "@airlock-sudo"

// sudoRequest is what sudo asks: run Argv as User in Dir with Env. Argv[0]
// is looked up in Env's PATH as the agent would for User.
type sudoRequest struct {
	User string   `json:"user"`
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
}

// sudoMessage is what goes either way after the request: the signals sudo
// relays, then how the command ended or why it did not start.
type sudoMessage struct {
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

// serveSudo listens for sudo, where the agent is the sandbox's root. It
// serves only once it has seen the kernel report a connecting peer's own
// uid (older gVisor releases reported the asker's, root, for every peer):
// the peer check is all that stands between another uid and root.
func (a *Agent) serveSudo() error {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sudoSocket, Net: "unix"})
	if err != nil {
		return fmt.Errorf("sudo socket: %w", err)
	}
	if err := probePeerCredentials(ln); err != nil {
		ln.Close()
		a.log.Warn("no sudo in this sandbox", "err", err)
		return nil
	}
	go func() {
		defer ln.Close() // never dropped while serving: the name stays the agent's
		for delay := time.Duration(0); ; {
			c, err := ln.AcceptUnix()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				// Out of descriptors, most likely: wait, and go on.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				a.log.Warn("sudo socket", "err", err)
				time.Sleep(delay)
				continue
			}
			delay = 0
			go a.sudo(c)
		}
	}()
	return nil
}

// probePeerCredentials connects to ln from a thread acting as nobody and
// checks that the accepted connection's peer is nobody.
func probePeerCredentials(ln *net.UnixListener) error {
	const nobody = 65534
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		restore, err := identity.ActAs(identity.ID{Name: "nobody", UID: nobody, GID: nobody})
		if err != nil {
			errc <- err
			return // the thread stays locked, and goes
		}
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sudoSocket, Net: "unix"})
		if restore() {
			runtime.UnlockOSThread()
		}
		if err == nil {
			defer c.Close()
		}
		errc <- err
	}()
	ln.SetDeadline(time.Now().Add(5 * time.Second))
	c, err := ln.AcceptUnix()
	ln.SetDeadline(time.Time{})
	if derr := <-errc; derr != nil {
		return fmt.Errorf("probe: %w", derr)
	}
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	defer c.Close()
	uid, err := peerUID(c)
	if err != nil {
		return err
	}
	if uid != nobody {
		return fmt.Errorf("the kernel reports uid %d for a peer that is %d: peers cannot be told apart", uid, nobody)
	}
	return nil
}

// sudo serves one sudo: checks who asks, starts the command with the
// caller's stdio, relays its signals, answers how it ended. The caller
// going away (killed, or its command's timeout) kills the command's
// process group while the command lives (what leaves the group, or
// outlives its leader, is not followed, as with any process).
func (a *Agent) sudo(c *net.UnixConn) {
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second)) // for the request
	fail := func(format string, args ...any) {
		json.NewEncoder(c).Encode(sudoMessage{Error: fmt.Sprintf(format, args...)})
	}
	uid, err := peerUID(c)
	if err != nil {
		fail("cannot tell who is asking: %v", err)
		return
	}
	if uid != identity.User.UID && uid != identity.Root.UID {
		fail("uid %d is not allowed to use sudo (only %s is)", uid, identity.User.Name)
		return
	}
	req, stdio, rest, err := readSudoRequest(c)
	defer func() { closeFiles(stdio) }()
	if err != nil {
		fail("%v", err)
		return
	}
	var id identity.ID
	switch req.User {
	case "root":
		id = identity.Root
	case identity.User.Name:
		id = a.users.User()
	default:
		fail("unknown user %s", req.User)
		return
	}
	cmd, err := sudoCommand(req, stdio)
	if err != nil {
		fail("%v", err)
		return
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: a.users.Credential(id)}
	if err := tasks.Start(cmd); err != nil {
		fail("%s: %v", req.Argv[0], errors.Unwrap(err))
		return
	}
	closeFiles(stdio)
	stdio = nil
	c.SetReadDeadline(time.Time{})
	pgid := cmd.Process.Pid

	// Until the command has been waited for, its pid (the group's id) is
	// its own: a signal sent under mu cannot reach a process that reused it.
	var mu sync.Mutex
	exited := false
	signal := func(sig syscall.Signal) {
		mu.Lock()
		defer mu.Unlock()
		if !exited {
			unix.Kill(-pgid, sig)
		}
	}
	go func() {
		// Relayed signals only: a few bytes each.
		dec := json.NewDecoder(io.LimitReader(rest, 1<<20))
		for {
			var m sudoMessage
			if err := dec.Decode(&m); err != nil {
				signal(unix.SIGKILL) // sudo is gone
				return
			}
			if s := syscall.Signal(m.Signal); relayedSignals[s] {
				signal(s)
			}
		}
	}()
	// Waited for without reaping first: the pid stays the command's
	// until no signal can be sent to its group any more.
	var info unix.Siginfo
	for {
		if err := unix.Waitid(unix.P_PID, pgid, &info, unix.WEXITED|unix.WNOWAIT, nil); !errors.Is(err, unix.EINTR) {
			break
		}
	}
	mu.Lock()
	exited = true
	mu.Unlock()
	code := 1
	if state, err := cmd.Process.Wait(); err == nil {
		code = state.ExitCode()
		if ws, ok := state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal())
		}
	}
	json.NewEncoder(c).Encode(sudoMessage{Exit: &code})
}

// sudoCommand is req as a command: argv[0] found in the request's PATH
// (relative to its directory when it has a slash), stdio sudo's.
func sudoCommand(req *sudoRequest, stdio []*os.File) (*exec.Cmd, error) {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return nil, errors.New("no command")
	}
	if fi, err := os.Stat(req.Dir); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("unable to change directory to %s", req.Dir)
	}
	path := req.Argv[0]
	if !strings.Contains(path, "/") {
		var pathEnv string
		for _, kv := range req.Env {
			if v, ok := strings.CutPrefix(kv, "PATH="); ok {
				pathEnv = v
			}
		}
		path = lookPath(path, pathEnv)
		if path == "" {
			return nil, fmt.Errorf("%s: command not found", req.Argv[0])
		}
	}
	return &exec.Cmd{
		Path: path, Args: req.Argv, Env: req.Env, Dir: req.Dir,
		Stdin: stdio[0], Stdout: stdio[1], Stderr: stdio[2],
	}, nil
}

// lookPath finds an executable file in pathEnv, as a shell would (the
// agent's own PATH is not the command's).
func lookPath(file, pathEnv string) string {
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, file)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// peerUID is the uid of the process at the other end of c, as the kernel
// recorded it when it connected.
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

// maxSudoRequest bounds a request (argv and environment: the kernel's
// own limit for them is about as large).
const maxSudoRequest = 4 << 20

// readSudoRequest reads the request, one JSON line whose first bytes
// carry sudo's stdin, stdout and stderr, and returns what follows it.
func readSudoRequest(c *net.UnixConn) (*sudoRequest, []*os.File, io.Reader, error) {
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(3*4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, nil, nil, err
	}
	var stdio []*os.File
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return nil, nil, nil, err
	}
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			unix.CloseOnExec(fd) // no other command may inherit them
			stdio = append(stdio, os.NewFile(uintptr(fd), "sudo stdio"))
		}
	}
	if len(stdio) != 3 {
		return nil, stdio, nil, fmt.Errorf("expected stdin, stdout and stderr, got %d descriptors", len(stdio))
	}
	r := bufio.NewReader(io.MultiReader(bytes.NewReader(buf[:n]), c))
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		if line = append(line, chunk...); len(line) > maxSudoRequest {
			return nil, stdio, nil, fmt.Errorf("the request is larger than %d bytes", maxSudoRequest)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			return nil, stdio, nil, fmt.Errorf("reading the request: %v", err)
		}
		break
	}
	var req sudoRequest
	if err := json.Unmarshal(line, &req); err != nil {
		return nil, stdio, nil, fmt.Errorf("bad request: %v", err)
	}
	return &req, stdio, r, nil
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}
