package agent_test

import (
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// event is one message of a process stream; exactly one field is set.
type event struct {
	Event struct {
		Start *struct {
			Pid uint32 `json:"pid"`
		} `json:"start"`
		Data *struct {
			Stdout []byte `json:"stdout"`
			Stderr []byte `json:"stderr"`
		} `json:"data"`
		End *struct {
			ExitCode int32   `json:"exitCode"`
			Exited   bool    `json:"exited"`
			Status   string  `json:"status"`
			Error    *string `json:"error"`
		} `json:"end"`
		Keepalive *struct{} `json:"keepalive"`
	} `json:"event"`
}

// run is what a process stream reported.
type run struct {
	pid            uint32
	stdout, stderr string
	exitCode       int32
	exited         bool
	status         string
	endErr         *string
}

// startProcess starts cmd with args and returns the stream, its start
// event read.
func startProcess(t *testing.T, url string, req map[string]any, user string) (*serverStream, uint32) {
	t.Helper()
	s := openStream(t, url, "process.Process/Start", req, user)
	var ev event
	more, err := s.next(&ev)
	if !more {
		t.Fatalf("Start %v: stream ended at once: %v", req, err)
	}
	if ev.Event.Start == nil || ev.Event.Start.Pid == 0 {
		t.Fatalf("Start %v: first event %+v, want start with a pid", req, ev.Event)
	}
	return s, ev.Event.Start.Pid
}

// finish reads s to its end, which must carry no error.
func finish(t *testing.T, s *serverStream, pid uint32) run {
	t.Helper()
	r := run{pid: pid}
	ended := false
	for {
		var ev event
		more, err := s.next(&ev)
		if !more {
			if err != nil {
				t.Fatalf("stream error %s", err)
			}
			break
		}
		switch e := ev.Event; {
		case e.Data != nil:
			r.stdout += string(e.Data.Stdout)
			r.stderr += string(e.Data.Stderr)
		case e.End != nil:
			ended = true
			r.exitCode, r.exited, r.status, r.endErr = e.End.ExitCode, e.End.Exited, e.End.Status, e.End.Error
		}
	}
	if !ended {
		t.Fatal("the stream ended without an end event")
	}
	return r
}

func process(cmd string, args ...string) map[string]any {
	return map[string]any{"process": map[string]any{"cmd": cmd, "args": args}}
}

func TestProcessStart(t *testing.T) {
	url, home := newAgent(t)
	for _, tc := range []struct {
		name       string
		req        map[string]any
		stdout     string
		stderr     string
		exitCode   int32
		wantEndErr bool
	}{
		{"echo", process("/bin/echo", "hello"), "hello\n", "", 0, false},
		{"stderr and an exit code", process("/bin/sh", "-c", "echo oops >&2; exit 3"), "", "oops\n", 3, true},
		{"the home is the working directory", process("/bin/pwd"), home + "\n", "", 0, false},
		{"a working directory", map[string]any{"process": map[string]any{"cmd": "/bin/pwd", "cwd": "/"}}, "/\n", "", 0, false},
		{"envs", map[string]any{"process": map[string]any{"cmd": "/bin/sh", "args": []string{"-c", `printf %s "$X"`}, "envs": map[string]string{"X": "y z"}}}, "y z", "", 0, false},
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

func TestProcessStartRefused(t *testing.T) {
	url, _ := newAgent(t)
	for _, tc := range []struct {
		name string
		req  map[string]any
		user string
		code string
	}{
		{"no command", map[string]any{"process": map[string]any{}}, "", "invalid_argument"},
		{"no such command", process("/no/such/command"), "", "invalid_argument"},
		{"no such cwd", map[string]any{"process": map[string]any{"cmd": "/bin/true", "cwd": "/no/such/dir"}}, "", "invalid_argument"},
		{"another user", process("/bin/true"), "root", "permission_denied"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openStream(t, url, "process.Process/Start", tc.req, tc.user)
			more, err := s.next(&event{})
			if more || err == nil || err.Code != tc.code {
				t.Errorf("got more %v, end error %v; want the stream to end with %s", more, err, tc.code)
			}
		})
	}
}

func TestProcessStdin(t *testing.T) {
	url, _ := newAgent(t)
	s, pid := startProcess(t, url, map[string]any{"process": map[string]any{"cmd": "/bin/cat"}, "stdin": true}, "")
	sel := map[string]any{"pid": pid}
	mustUnary(t, url, "process.Process/SendInput", map[string]any{"process": sel, "input": map[string]any{"stdin": []byte("to cat\n")}}, nil)
	mustUnary(t, url, "process.Process/CloseStdin", map[string]any{"process": sel}, nil)
	if r := finish(t, s, pid); r.stdout != "to cat\n" || r.exitCode != 0 {
		t.Errorf("cat: %+v, want its input back", r)
	}
}

// sleeper starts a process that waits until it is signalled.
func sleeper(t *testing.T, url, tag string) (*serverStream, uint32) {
	t.Helper()
	req := process("/bin/sleep", "60")
	req["tag"] = tag
	s, pid := startProcess(t, url, req, "")
	t.Cleanup(func() { syscall.Kill(int(pid), syscall.SIGKILL) }) // should the test fail first
	return s, pid
}

type listed struct {
	Processes []struct {
		Pid    uint32 `json:"pid"`
		Tag    string `json:"tag"`
		Config struct {
			Cmd  string   `json:"cmd"`
			Args []string `json:"args"`
		} `json:"config"`
	} `json:"processes"`
}

func TestProcessListConnectSignal(t *testing.T) {
	url, _ := newAgent(t)
	s, pid := sleeper(t, url, "sleeper")

	var l listed
	mustUnary(t, url, "process.Process/List", map[string]any{}, &l)
	if len(l.Processes) != 1 || l.Processes[0].Pid != pid || l.Processes[0].Tag != "sleeper" ||
		l.Processes[0].Config.Cmd != "/bin/sleep" || !slices.Equal(l.Processes[0].Config.Args, []string{"60"}) {
		t.Fatalf("List: %+v, want the sleeper", l)
	}

	// A second stream attached by tag sees the same process end.
	c := openStream(t, url, "process.Process/Connect", map[string]any{"process": map[string]any{"tag": "sleeper"}}, "")
	var ev event
	if more, _ := c.next(&ev); !more || ev.Event.Start == nil || ev.Event.Start.Pid != pid {
		t.Fatalf("Connect by tag: %+v, want the sleeper's start", ev.Event)
	}

	sel := map[string]any{"pid": pid}
	wantError(t, url, "process.Process/SendSignal", map[string]any{"process": sel, "signal": "SIGNAL_SIGHUP"}, "invalid_argument", 400)
	wantError(t, url, "process.Process/SendSignal", map[string]any{"process": map[string]any{"pid": pid + 100000}, "signal": "SIGNAL_SIGKILL"}, "not_found", 404)
	wantError(t, url, "process.Process/SendSignal", map[string]any{"process": map[string]any{}, "signal": "SIGNAL_SIGKILL"}, "invalid_argument", 400)
	mustUnary(t, url, "process.Process/SendSignal", map[string]any{"process": sel, "signal": "SIGNAL_SIGKILL"}, nil)

	for name, stream := range map[string]*serverStream{"Start": s, "Connect": c} {
		r := finish(t, stream, pid)
		if r.exited || !strings.Contains(r.status, "killed") || r.endErr == nil {
			t.Errorf("%s stream after SIGKILL: %+v, want killed by a signal", name, r)
		}
	}
	l = listed{}
	mustUnary(t, url, "process.Process/List", map[string]any{}, &l)
	if len(l.Processes) != 0 {
		t.Errorf("List after the end: %+v, want none", l)
	}
	gone := openStream(t, url, "process.Process/Connect", map[string]any{"process": map[string]any{"tag": "sleeper"}}, "")
	if more, err := gone.next(&event{}); more || err == nil || err.Code != "not_found" {
		t.Errorf("Connect after the end: more %v, err %v; want not_found", more, err)
	}
}

func TestProcessConnectToNothing(t *testing.T) {
	url, _ := newAgent(t)
	s := openStream(t, url, "process.Process/Connect", map[string]any{"process": map[string]any{"pid": 1 << 30}}, "")
	if more, err := s.next(&event{}); more || err == nil || err.Code != "not_found" {
		t.Errorf("Connect to an unknown pid: more %v, err %v; want not_found", more, err)
	}
}

func TestSetupEnvReachesProcesses(t *testing.T) {
	url, _ := newAgent(t)
	if err := client(url).Setup(t.Context(), agentproto.Setup{EnvVars: map[string]string{"FROM_SETUP": "1", "X": "setup"}}); err != nil {
		t.Fatalf("setup: %v", err)
	}
	// The request's envs win over the sandbox's.
	req := map[string]any{"process": map[string]any{"cmd": "/bin/sh", "args": []string{"-c", `printf '%s %s' "$FROM_SETUP" "$X"`}, "envs": map[string]string{"X": "request"}}}
	s, pid := startProcess(t, url, req, "")
	if r := finish(t, s, pid); r.stdout != "1 request" {
		t.Errorf("stdout %q, want the setup's variable and the request's X", r.stdout)
	}
}
