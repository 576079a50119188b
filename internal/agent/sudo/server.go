package sudo

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agent/identity"
	"github.com/airlock-sandbox/airlock/internal/agent/tasks"
)

// Serve listens for sudo, where the agent is the sandbox's root, and
// serves it in the background for as long as the agent runs. It serves
// only once it has seen the kernel report a connecting peer's own uid
// (older gVisor releases reported the asker's, root, for every peer):
// the peer check is all that stands between another uid and root.
func Serve(log *slog.Logger, users identity.Users) error {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return fmt.Errorf("sudo socket: %w", err)
	}
	if err := probePeerCredentials(ln); err != nil {
		ln.Close()
		log.Warn("no sudo in this sandbox", "err", err)
		return nil
	}
	s := &server{log: log, users: users}
	go s.accept(ln)
	return nil
}

// server runs the commands sudo asks for.
type server struct {
	log   *slog.Logger
	users identity.Users
}

// accept serves ln until it is closed.
func (s *server) accept(ln *net.UnixListener) {
	defer ln.Close() // never dropped while serving: the name stays the agent's
	for delay := time.Duration(0); ; {
		c, err := ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors, most likely: wait, and go on.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			s.log.Warn("sudo socket", "err", err)
			time.Sleep(delay)
			continue
		}
		delay = 0
		go s.serve(c)
	}
}

// probePeerCredentials connects to ln from a thread acting as nobody and
// checks that the accepted connection's peer is nobody.
func probePeerCredentials(ln *net.UnixListener) error {
	const nobody = 65534
	var dialed *net.UnixConn
	err := identity.OnThreadAs(identity.ID{Name: "nobody", UID: nobody, GID: nobody}, func() (err error) {
		// Connected before it is accepted: the listener's backlog holds it.
		dialed, err = net.DialUnix("unix", nil, ln.Addr().(*net.UnixAddr))
		return err
	})
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	// Open until the peer is checked: a closed peer's credentials are
	// not every kernel's to report.
	defer dialed.Close()
	ln.SetDeadline(time.Now().Add(5 * time.Second))
	c, err := ln.AcceptUnix()
	ln.SetDeadline(time.Time{})
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

// serve serves one sudo: checks who asks, starts the command with the
// caller's stdio, relays its signals, answers how it ended. The caller
// going away (killed, or its command's timeout) kills the command's
// process group while the command lives (what leaves the group, or
// outlives its leader, is not followed, as with any process).
func (s *server) serve(c *net.UnixConn) {
	defer c.Close()
	cmd, rest, err := s.start(c)
	if err != nil {
		json.NewEncoder(c).Encode(message{Error: err.Error()})
		return
	}
	code := wait(cmd, rest)
	json.NewEncoder(c).Encode(message{Exit: &code})
}

// start checks who is at the other end of c, reads the request and
// starts its command. It returns what follows the request on c.
func (s *server) start(c *net.UnixConn) (*exec.Cmd, io.Reader, error) {
	c.SetReadDeadline(time.Now().Add(10 * time.Second)) // for the request
	uid, err := peerUID(c)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot tell who is asking: %v", err)
	}
	if uid != identity.User.UID && uid != identity.Root.UID {
		return nil, nil, fmt.Errorf("uid %d is not allowed to use sudo (only %s is)", uid, identity.User.Name)
	}
	req, stdio, rest, err := readRequest(c)
	defer closeFiles(stdio)
	if err != nil {
		return nil, nil, err
	}
	var id identity.ID
	switch req.User {
	case identity.Root.Name:
		id = identity.Root
	case identity.User.Name:
		id = s.users.User()
	default:
		return nil, nil, fmt.Errorf("unknown user %s", req.User)
	}
	cmd, err := command(req, stdio)
	if err != nil {
		return nil, nil, err
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: s.users.Credential(id)}
	if err := tasks.Start(cmd); err != nil {
		return nil, nil, fmt.Errorf("%s: %v", req.Argv[0], errors.Unwrap(err))
	}
	c.SetReadDeadline(time.Time{})
	return cmd, rest, nil
}

// wait relays the signals that rest carries to cmd's process group until
// cmd ends, and returns its exit status; rest ending (sudo gone) kills
// the group.
func wait(cmd *exec.Cmd, rest io.Reader) int {
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
			var m message
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
	return code
}

// command is req as a command: argv[0] found in the request's PATH
// (relative to its directory when it has a slash), stdio sudo's.
func command(req *request, stdio []*os.File) (*exec.Cmd, error) {
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

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}
