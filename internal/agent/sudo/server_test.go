package sudo

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agent/identity"
	"github.com/airlock-sandbox/airlock/internal/airlocktest"
)

// serveOne serves the agent's end of a connection, as an agent that is
// the sandbox's root; done is closed when it has answered.
func serveOne(t *testing.T, c *net.UnixConn) (done chan struct{}) {
	t.Helper()
	s := &server{log: slog.New(slog.NewTextHandler(t.Output(), nil)), users: identity.Users{Home: t.TempDir(), Root: true}}
	done = make(chan struct{})
	go func() { s.serve(c); close(done) }()
	t.Cleanup(func() { <-done })
	return done
}

// answer reads the agent's one answer on c.
func answer(t *testing.T, c *net.UnixConn) message {
	t.Helper()
	var m message
	if err := json.NewDecoder(c).Decode(&m); err != nil {
		t.Fatalf("no answer: %v", err)
	}
	return m
}

// TestServeRefusesOtherUsers: the peer check comes first, before a byte
// of the request is read: a uid that is neither the sandbox's user nor
// root gets nothing run.
func TestServeRefusesOtherUsers(t *testing.T) {
	var agent, caller *net.UnixConn
	var uid int
	switch os.Geteuid() {
	case 0:
		agent, caller = socketpairAs(t, nobody)
		uid = nobody.UID
	case identity.User.UID:
		t.Skip("the test runs as the sandbox's user, whom sudo serves")
	default:
		agent, caller = socketpair(t)
		uid = os.Geteuid()
	}
	serveOne(t, agent)
	m := answer(t, caller)
	if want := fmt.Sprintf("uid %d is not allowed to use sudo (only user is)", uid); m.Error != want || m.Exit != nil {
		t.Errorf("got %+v, want the refusal %q", m, want)
	}
}

// stdio are pipes for a command's stdin, stdout and stderr: the
// command's ends, and the test's.
type stdio struct {
	child          []*os.File
	stdin          *os.File
	out            *os.File // stdout's read end, under stdout
	stdout, stderr *bufio.Reader
}

func pipes(t *testing.T) *stdio {
	t.Helper()
	s := &stdio{}
	var parents []*os.File
	for i := range 3 {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		child, parent := r, w
		if i > 0 {
			child, parent = w, r
		}
		parents = append(parents, parent)
		s.child = append(s.child, child)
		t.Cleanup(func() { child.Close(); parent.Close() })
	}
	s.stdin, s.out = parents[0], parents[1]
	s.stdout, s.stderr = bufio.NewReader(parents[1]), bufio.NewReader(parents[2])
	return s
}

// fds are the command's ends' descriptors.
func (s *stdio) fds() []int {
	var fds []int
	for _, f := range s.child {
		fds = append(fds, int(f.Fd()))
	}
	return fds
}

// callerAsRoot is the caller's end of a connection to a new server,
// which root made.
func callerAsRoot(t *testing.T) *net.UnixConn {
	t.Helper()
	airlocktest.RequiresRoot(t)
	agent, caller := socketpair(t)
	serveOne(t, agent)
	return caller
}

// runAsRoot has a server run req, as root asks it.
func runAsRoot(t *testing.T, req *request, std *stdio, sigs <-chan os.Signal) (int, error) {
	t.Helper()
	return run(callerAsRoot(t), req, std.fds(), sigs)
}

func TestServeRuns(t *testing.T) {
	std := pipes(t)
	req := &request{User: "root", Argv: []string{"sh", "-c", "id -u; echo err >&2; exit 7"}, Env: []string{"PATH=/usr/bin:/bin"}, Dir: "/"}
	code, err := runAsRoot(t, req, std, nil)
	if err != nil || code != 7 {
		t.Fatalf("got %d, %v; want the command's exit status 7", code, err)
	}
	out, _ := std.stdout.ReadString('\n')
	errOut, _ := std.stderr.ReadString('\n')
	if out != "0\n" || errOut != "err\n" {
		t.Errorf("stdout %q, stderr %q; want the command's, as root", out, errOut)
	}
}

func TestServeAsUser(t *testing.T) {
	std := pipes(t)
	req := &request{User: "user", Argv: []string{"/bin/sh", "-c", "id -u; id -G"}, Dir: "/"}
	if code, err := runAsRoot(t, req, std, nil); err != nil || code != 0 {
		t.Fatalf("got %d, %v", code, err)
	}
	uid, _ := std.stdout.ReadString('\n')
	groups, _ := std.stdout.ReadString('\n')
	if uid != "1000\n" || groups != "1000\n" {
		t.Errorf("id: %q %q, want the user's 1000 and its group alone", uid, groups)
	}
}

// TestServeRelaysSignals: what sudo relays reaches the command; a signal
// sudo does not relay, sent anyway, does not.
func TestServeRelaysSignals(t *testing.T) {
	std := pipes(t)
	caller := callerAsRoot(t)
	sigs := make(chan os.Signal, 2)
	req := &request{User: "root", Argv: []string{"/bin/sh", "-c", "echo ready; exec sleep 60"}, Dir: "/"}
	type result struct {
		code int
		err  error
	}
	done := make(chan result)
	go func() { code, err := run(caller, req, std.fds(), sigs); done <- result{code, err} }()
	if line, err := std.stdout.ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("got %q, %v", line, err)
	}
	sigs <- syscall.SIGKILL // not relayed: sudo itself cannot be sent it
	sigs <- syscall.SIGTERM
	close(sigs)
	if r := <-done; r.err != nil || r.code != 128+int(syscall.SIGTERM) {
		t.Errorf("got %d, %v; want 143, the command ended by the relayed SIGTERM", r.code, r.err)
	}
}

// TestServeKillsWhenSudoGoes: sudo going away (killed, or its own
// command's timeout) kills the command's group.
func TestServeKillsWhenSudoGoes(t *testing.T) {
	airlocktest.RequiresRoot(t)
	std := pipes(t)
	agent, caller := socketpair(t)
	done := serveOne(t, agent)
	req := &request{User: "root", Argv: []string{"/bin/sh", "-c", "sleep 60 & echo ready; wait"}, Dir: "/"}
	if err := send(caller, req, std.fds()); err != nil {
		t.Fatal(err)
	}
	for _, f := range std.child { // the server has its own now
		f.Close()
	}
	if line, err := std.stdout.ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("got %q, %v", line, err)
	}
	caller.Close()
	// Every writer of stdout gone, the shell and its background sleep,
	// stdout ends; a bound on the wait only, not a measure.
	std.out.SetReadDeadline(time.Now().Add(10 * time.Second))
	if rest, err := std.stdout.ReadString('\n'); err != io.EOF {
		t.Errorf("stdout after sudo went away: %q, %v; want its end, every process of the group killed", rest, err)
	}
	<-done
}

func TestServeRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  request
		want string
	}{
		{"another user", request{User: "mallory", Argv: []string{"/bin/true"}, Dir: "/"}, "unknown user mallory"},
		{"no command", request{User: "root", Dir: "/"}, "no command"},
		{"no directory", request{User: "root", Argv: []string{"/bin/true"}, Dir: "/no/such/dir"}, "unable to change directory to /no/such/dir"},
		{"not found", request{User: "root", Argv: []string{"nosuchcommand"}, Env: []string{"PATH=/bin"}, Dir: "/"}, "nosuchcommand: command not found"},
		{"not executable", request{User: "root", Argv: []string{"/etc/passwd"}, Dir: "/"}, "/etc/passwd: permission denied"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := runAsRoot(t, &tc.req, pipes(t), nil)
			if err == nil || err.Error() != tc.want {
				t.Errorf("got %v, want %q", err, tc.want)
			}
		})
	}
}

func TestCommand(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "tool")
	os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(filepath.Join(dir, "data"), nil, 0o644)
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	files := []*os.File{os.Stdin, os.Stdout, os.Stderr}
	for _, tc := range []struct {
		argv []string
		path string // "": refused
	}{
		{[]string{"tool", "-x"}, exe},
		{[]string{"data"}, ""},
		{[]string{"sub"}, ""},
		{[]string{"./tool"}, "./tool"}, // a slash: as given, from Dir
		{[]string{"missing"}, ""},
	} {
		cmd, err := command(&request{Argv: tc.argv, Env: []string{"PATH=/nonexistent:" + dir}, Dir: dir}, files)
		switch {
		case tc.path == "" && err == nil:
			t.Errorf("%q: found %s, want it refused", tc.argv, cmd.Path)
		case tc.path != "" && (err != nil || cmd.Path != tc.path || !slices.Equal(cmd.Args, tc.argv) || cmd.Dir != dir):
			t.Errorf("%q: %+v, %v; want %s", tc.argv, cmd, err, tc.path)
		}
	}
	if got := lookPath("tool", "::"+dir); got != exe {
		t.Errorf("lookPath with empty entries: %q", got)
	}
}

// TestReadRequest: the request's first bytes carry exactly three
// descriptors; what follows the request's line is the caller's.
func TestReadRequest(t *testing.T) {
	std := pipes(t)
	agent, caller := socketpair(t)
	long := strings.Repeat("x", 200<<10) // past the first read
	req := &request{User: "root", Argv: []string{"echo", long}, Dir: "/"}
	go func() {
		send(caller, req, std.fds())
		caller.Write([]byte(`{"signal":15}` + "\n"))
	}()
	got, files, rest, err := readRequest(agent)
	defer closeFiles(files)
	if err != nil || got.User != "root" || len(got.Argv) != 2 || got.Argv[1] != long || len(files) != 3 {
		t.Fatalf("got %d descriptors, %v", len(files), err)
	}
	var m message
	if err := json.NewDecoder(rest).Decode(&m); err != nil || m.Signal != 15 {
		t.Errorf("what followed the request: %+v, %v", m, err)
	}
}

func TestReadRequestRefused(t *testing.T) {
	fds := pipes(t).fds()
	for _, tc := range []struct {
		name string
		fds  []int
		line string
		want string
	}{
		{"two descriptors", fds[:2], "{}\n", "expected stdin, stdout and stderr, got 2 descriptors"},
		{"bad JSON", fds, "{\n", "bad request: unexpected end of JSON input"},
		{"no end of line", fds, "{}", "reading the request: EOF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			agent, caller := socketpair(t)
			go func() {
				caller.WriteMsgUnix([]byte(tc.line), syscall.UnixRights(tc.fds...), nil)
				caller.CloseWrite()
			}()
			_, files, _, err := readRequest(agent)
			closeFiles(files)
			if err == nil || err.Error() != tc.want {
				t.Errorf("got %v, want %q", err, tc.want)
			}
		})
	}
}

// TestProbePeerCredentials: where the kernel tells peers apart (here),
// the probe passes; it needs root to act as nobody.
func TestProbePeerCredentials(t *testing.T) {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: fmt.Sprintf("@airlock-sudo-test-%d", os.Getpid()), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	err = probePeerCredentials(ln)
	if os.Geteuid() == 0 && err != nil {
		t.Errorf("probe as root: %v", err)
	}
	if os.Geteuid() != 0 && err == nil {
		t.Error("probe without root passed: it cannot have acted as nobody")
	}
}
