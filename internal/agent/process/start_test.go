package process

import (
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agent/rpc/rpctest"
)

func TestStart(t *testing.T) {
	_, url, home := newService(t)
	for _, tc := range []struct {
		name       string
		req        map[string]any
		stdout     string
		stderr     string
		exitCode   int32
		wantEndErr bool
	}{
		{"echo", command("/bin/echo", "hello"), "hello\n", "", 0, false},
		{"stderr and an exit code", command("/bin/sh", "-c", "echo oops >&2; exit 3"), "", "oops\n", 3, true},
		{"the home is the working directory", command("/bin/pwd"), home + "\n", "", 0, false},
		{"a working directory", map[string]any{"process": map[string]any{"cmd": "/bin/pwd", "cwd": "/"}}, "/\n", "", 0, false},
		{"a working directory in the home", map[string]any{"process": map[string]any{"cmd": "/bin/pwd", "cwd": "~"}}, home + "\n", "", 0, false},
		{"envs", map[string]any{"process": map[string]any{"cmd": "/bin/sh", "args": []string{"-c", `printf %s "$X"`}, "envs": map[string]string{"X": "y z"}}}, "y z", "", 0, false},
		{"stdin closed when asked", map[string]any{"process": map[string]any{"cmd": "/bin/cat"}, "stdin": false}, "", "", 0, false},
		{"its own process group", command("/bin/sh", "-c", `[ "$(cut -d' ' -f5 /proc/$$/stat)" -eq $$ ] && echo leader`), "leader\n", "", 0, false},
		// A child holding stdout does not hold the stream past the grace.
		{"a background child", command("/bin/sh", "-c", "sleep 60 & echo started"), "started\n", "", 0, false},
		{"output larger than a chunk", command("/bin/sh", "-c", "head -c 100000 /dev/zero | tr '\\0' x"), strings.Repeat("x", 100000), "", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, pid := startProcess(t, url, tc.req, "")
			r := finish(t, s, pid)
			if r.stdout != tc.stdout || r.stderr != tc.stderr || r.exitCode != tc.exitCode || !r.exited || (r.endErr != nil) != tc.wantEndErr {
				t.Errorf("got %+v, want stdout %q stderr %q exit %d", r, tc.stdout, tc.stderr, tc.exitCode)
			}
		})
	}
}

func TestStartRefused(t *testing.T) {
	_, url, _ := newService(t)
	for _, tc := range []struct {
		name string
		req  map[string]any
		user string
		code string
	}{
		{"no command", map[string]any{"process": map[string]any{}}, "", "invalid_argument"},
		{"no process", map[string]any{}, "", "invalid_argument"},
		{"no such command", command("/no/such/command"), "", "invalid_argument"},
		{"no such cwd", map[string]any{"process": map[string]any{"cmd": "/bin/true", "cwd": "/no/such/dir"}}, "", "invalid_argument"},
		{"a file as cwd", map[string]any{"process": map[string]any{"cmd": "/bin/true", "cwd": "/bin/true"}}, "", "invalid_argument"},
		{"another user", command("/bin/true"), "root", "permission_denied"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := rpctest.OpenStream(t, url, "process.Process/Start", tc.req, tc.user)
			more, err := s.Next(&event{})
			if more || err == nil || err.Code != tc.code {
				t.Errorf("got more %v, end error %v; want the stream to end with %s", more, err, tc.code)
			}
		})
	}
}

// TestStartTimeout: the call's deadline (the SDK's timeoutMs) kills the
// process, and its stream ends with the deadline.
func TestStartTimeout(t *testing.T) {
	s, url, _ := newService(t)
	st, pid := startProcess(t, url, command("/bin/sleep", "60"), "", "Connect-Timeout-Ms", "50")
	for {
		more, err := st.Next(&event{})
		if !more {
			if err == nil || err.Code != "deadline_exceeded" {
				t.Errorf("the stream ended with %v, want deadline_exceeded", err)
			}
			break
		}
	}
	// The process was killed: its end removes it from the table.
	p, err := s.find(&selector{Pid: &pid})
	if err == nil {
		<-p.done
	}
	if _, err := s.find(&selector{Pid: &pid}); err == nil {
		t.Errorf("process %d still runs after its deadline", pid)
	}
}

// TestStartPTY: a PTY process is a terminal's session leader, its
// output arrives as pty data, and the size asked for is the terminal's.
func TestStartPTY(t *testing.T) {
	_, url, _ := newService(t)
	req := command("/bin/sh", "-c", "test -t 0 && stty size")
	req["pty"] = map[string]any{"size": map[string]any{"cols": 100, "rows": 40}}
	s, pid := startProcess(t, url, req, "")
	r := finish(t, s, pid)
	if strings.TrimSpace(r.pty) != "40 100" || r.stdout != "" || r.exitCode != 0 {
		t.Errorf("got %+v, want the terminal's size 40 100 as pty output", r)
	}
}
