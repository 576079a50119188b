package main

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/nettest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// startRunServer starts an airlock serve whose pool airlock run takes
// sandboxes from (base is the host's view), and waits until a run goes
// through it.
func startRunServer(t *testing.T) *server {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "config.json")
	os.WriteFile(cfg, []byte(`{"stock": {"root": "jail"}, "templates": {"code-interpreter-v1": {"poolSize": 0}}}`), 0o644)
	s := startServe(t, t.TempDir(), "--config", cfg)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		r := airlock(t, "", "run", "--daemon", "always", "--state-dir", s.stateDir, "--", "/bin/true")
		if r.code == 0 {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("no run went through the daemon in a minute: exit %d: %s", r.code, r.stderr)
		}
	}
}

// TestRunThroughDaemon: a command run in a sandbox of the daemon's pool
// behaves as one run directly, case by case: its output, exit code and
// the way it ended, its environment, and the errors of a command that
// cannot start.
func TestRunThroughDaemon(t *testing.T) {
	s := startRunServer(t)
	defer s.stop(t)
	echo := filepath.Join(t.TempDir(), "echo.py")
	os.WriteFile(echo, []byte("print(input()[::-1])\n"), 0o600)
	cases := []struct {
		name  string
		stdin string
		args  []string
	}{
		{"streams and exit code", "", []string{"--", "/bin/sh", "-c", "echo out; echo err >&2; exit 7"}},
		{"signal", "", []string{"--", "/bin/bash", "-c", "kill -TERM $$"}},
		{"timeout", "", []string{"--timeout", "1s", "--", "/bin/sleep", "60"}},
		{"oom at the pool's memory limit", "", []string{"--", "/usr/bin/python3", "-c", "b = bytearray(900 << 20)"}},
		{"who, where, umask, env", "", []string{"--env", "GREETING=hi", "--", "/bin/sh", "-c", "id -un; pwd; umask; echo $GREETING $HOME $PATH"}},
		{"workdir", "", []string{"--workdir", "/tmp", "--", "pwd"}},
		{"stdin", "stressed\n", []string{"--stdin", "--", "/usr/bin/python3", "-c", "print(input()[::-1])"}},
		{"no stdin", "ignored\n", []string{"--", "/bin/cat"}},
		{"not found", "", []string{"--", "no-such-command"}},
		{"missing workdir", "", []string{"--workdir", "/no/such/dir", "--", "/bin/true"}},
		{"background child dies with the command", "", []string{"--", "/bin/sh", "-c", "sleep 60 & echo started"}},
		{"output limit", "", []string{"--output-limit", "1K", "--", "/bin/sh", "-c", "head -c 100000 /dev/zero"}},
		{"json", "", []string{"--json", "--", "/bin/bash", "-c", `printf 'a\xffb'; echo e >&2; exit 3`}},
		{"code", "", []string{"--code", "print(__file__)"}},
		{"code file's owner and mode", "", []string{"--lang", "bash", "--code", "stat -c '%a %u %g %s %n' /.airlock/main.sh; touch /.airlock/main.sh"}},
		{"file and stdin", "stressed\n", []string{"--stdin", "--file", echo}},
		{"lower memory", "", []string{"--memory", "128M", "--json", "--", "/usr/bin/python3", "-c", "b = bytearray(300 << 20)"}},
		{"lower pids", "", []string{"--pids", "40", "--", "/usr/bin/python3", "-c", pidsProbe}},
		{"lower disk", "", []string{"--disk", "8M", "--", "/bin/sh", "-c", "df -k /tmp | tail -1 | awk '{print $2}'; head -c 20M /dev/zero > /tmp/f 2>/dev/null; echo $?"}},
	}
	for _, c := range cases {
		args := func(mode string) []string {
			return append([]string{"run", "--daemon", mode, "--state-dir", s.stateDir}, c.args...)
		}
		direct, daemon := airlock(t, c.stdin, args("never")...), whenPooled(t, c.stdin, args("always")...)
		if strings.Contains(daemon.stderr, "--daemon always") {
			t.Errorf("%s: not run through the daemon: %s", c.name, daemon.stderr)
			continue
		}
		if strings.HasPrefix(daemon.stdout, "{") {
			// The figures differ: compare what does not.
			direct.stdout, daemon.stdout = withoutFigures(t, direct.stdout), withoutFigures(t, daemon.stdout)
		}
		if daemon.code != direct.code || daemon.stdout != direct.stdout || daemon.stderr != direct.stderr {
			t.Errorf("%s: through the daemon exit %d, stdout %q, stderr %q; directly exit %d, stdout %q, stderr %q",
				c.name, daemon.code, daemon.stdout, daemon.stderr, direct.code, direct.stdout, direct.stderr)
		}
	}
	// What a pooled sandbox cannot give runs directly, or, with always,
	// is refused before anything runs.
	for _, args := range [][]string{
		{"--memory", "1G", "--", "/bin/true"},
		{"--mount", "/etc:/mnt", "--", "/bin/true"},
	} {
		r := airlock(t, "", append([]string{"run", "--daemon", "always", "--state-dir", s.stateDir}, args...)...)
		if r.code != 2 || !strings.HasPrefix(r.stderr, "airlock: --daemon always: ") {
			t.Errorf("always %q: exit %d %q, want it refused", args, r.code, r.stderr)
		}
		if r := airlock(t, "", append([]string{"run", "--state-dir", s.stateDir}, args...)...); r.code != 0 {
			t.Errorf("auto %q: exit %d %q, want it run directly", args, r.code, r.stderr)
		}
	}
}

// whenPooled runs airlock run --daemon always once the daemon has a pooled
// sandbox: it declines a run, before anything runs, while its pool is
// refilling from the run before, which under load may outlast a direct run.
func whenPooled(t *testing.T, stdin string, args ...string) cliResult {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		r := airlock(t, stdin, args...)
		if !strings.Contains(r.stderr, sandbox.ErrPoolEmpty.Error()) || time.Now().After(deadline) {
			return r
		}
	}
}

// pidsProbe starts processes until it may not, and says whether it was
// stopped before 100.
const pidsProbe = `
import subprocess
procs = []
try:
    for _ in range(100):
        procs.append(subprocess.Popen(["/bin/sleep", "5"]))
    print("not limited")
except OSError as e:
    print("limited:", e.strerror)
for p in procs:
    p.kill()
`

// withoutFigures is a --json result with its measurements zeroed.
func withoutFigures(t *testing.T, s string) string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("not JSON: %q", s)
	}
	for _, k := range []string{"duration_ms", "cpu_ms", "max_memory_bytes"} {
		if v, ok := m[k].(float64); !ok || v <= 0 {
			t.Errorf("%s is %v in %s", k, m[k], s)
		}
		m[k] = 0
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// TestRunThroughDaemonEnds: an interrupted run through the daemon kills
// its sandbox as a direct one does; a client that is not root is not
// answered; a daemon killed leaves a socket that airlock run goes past
// (directly), and that the next daemon takes over.
func TestRunThroughDaemonEnds(t *testing.T) {
	s := startRunServer(t)
	cmd := exec.Command(airlockBin, "run", "--daemon", "always", "--state-dir", s.stateDir, "--", "/bin/sh", "-c", "echo ready; sleep 60")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
		t.Fatalf("the command did not start: %q", line)
	}
	// The run's sandbox is its alone: the API's clients do not find it.
	if _, body := s.do(t, "GET", "/v2/sandboxes", nil, map[string]string{"X-API-KEY": s.key}); strings.TrimSpace(string(body)) != "[]" {
		t.Errorf("the API lists the run's sandbox: %s", body)
	}
	cmd.Process.Signal(os.Interrupt)
	cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 130 || stderr.String() != "airlock: interrupted; sandbox killed\n" {
		t.Errorf("interrupted: exit %d, %q; want 130", code, stderr.String())
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, body := s.do(t, "GET", "/v2/sandboxes", nil, map[string]string{"X-API-KEY": s.key})
		if strings.TrimSpace(string(body)) == "[]" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the interrupted run's sandbox is still there: %s", body)
		}
	}

	// A peer that is not root: the socket opened to it, it gets no answer.
	for dir := s.stateDir; dir != os.TempDir(); dir = filepath.Dir(dir) {
		os.Chmod(dir, 0o755)
	}
	os.Chmod(filepath.Join(s.stateDir, "run.sock"), 0o666)
	// (airlock run itself refuses to start as nobody: a client of its
	// own sends the request.)
	nobody := exec.Command("/usr/bin/python3", "-c", `import json, socket, struct, sys
req = json.dumps({"v": 1, "backend": "namespaces", "argv": ["/bin/true"], "env": [], "cwd": "/home/user", "umask": 18, "stdin": False,
	"memoryBytes": 512 << 20, "pids": 256, "cpus": 1, "diskBytes": 1 << 30, "timeout": 10**10, "outputLimit": 1024}).encode()
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
try:
	s.sendall(b"R" + struct.pack(">I", len(req)) + req)
	print(repr(s.recv(100)))
except (BrokenPipeError, ConnectionResetError):
	print(repr(b""))`, filepath.Join(s.stateDir, "run.sock"))
	nobody.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if msg, err := nobody.CombinedOutput(); err != nil || string(msg) != "b''\n" {
		t.Errorf("as nobody: %v %q, want the connection closed unanswered", err, msg)
	}

	// Killed, the daemon leaves its socket; runs go past it.
	s.cmd.Process.Kill()
	s.cmd.Wait()
	if _, err := os.Stat(filepath.Join(s.stateDir, "run.sock")); err != nil {
		t.Fatalf("the killed daemon's socket: %v", err)
	}
	if r := airlock(t, "", "run", "--state-dir", s.stateDir, "--", "/bin/echo", "direct"); r.code != 0 || r.stdout != "direct\n" {
		t.Errorf("past a dead daemon's socket: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	// The next daemon cleans up after it, and serves the socket.
	s2 := startServe(t, s.stateDir, "--config", s.cmd.Args[slices.Index(s.cmd.Args, "--config")+1])
	defer s2.stop(t)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if r := airlock(t, "", "run", "--daemon", "always", "--state-dir", s.stateDir, "--", "/bin/true"); r.code == 0 {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the next daemon did not serve runs: %s", r.stderr)
		}
	}
}

// TestRunThroughDaemonNetwork: a run with a network goes through the
// daemon's network for sandboxes, as a direct run goes through its own:
// the same reach under each policy, in the fake internet. A sealed
// server declines it.
func TestRunThroughDaemonNetwork(t *testing.T) {
	lab := newLab(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.json")
	os.WriteFile(cfg, []byte(`{"network": {"dns": ["`+nettest.DNSAddr.String()+`"]}, "stock": {"root": "jail"}, "templates": {"code-interpreter-v1": {"poolSize": 0}}}`), 0o644)
	s := startServeIn(t, lab, filepath.Join(dir, "state"), "--config", cfg)
	run := func(args ...string) cliResult {
		return airlockIn(t, lab, append([]string{"run", "--daemon", "always", "--state-dir", s.stateDir}, args...)...)
	}
	for _, net := range [][]string{{"--net", "internet"}, nil} {
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
			r := run(append(net, "--", "/bin/true")...)
			if r.code == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%v: no run went through the daemon in a minute: %s", net, r.stderr)
			}
		}
	}
	for _, tc := range netCases {
		r := run(append(tc.flags, "--", "/usr/bin/python3", "-c", netProbe)...)
		if got := strings.ReplaceAll(strings.TrimSpace(r.stdout), "\n", "|"); r.code != 0 || got != tc.want {
			t.Errorf("%v: exit %d, got %s, want %s; stderr %s", tc.flags, r.code, got, tc.want, r.stderr)
		}
	}
	if r := run("--dns", nettest.DNSAddr.String(), "--net", "internet", "--", "/bin/true"); r.code != 2 || !strings.Contains(r.stderr, "--dns runs only directly") {
		t.Errorf("--dns: exit %d %q, want it refused", r.code, r.stderr)
	}

	s.stop(t)

	sealed := startRunServer(t)
	defer sealed.stop(t)
	if r := airlock(t, "", "run", "--daemon", "always", "--state-dir", sealed.stateDir, "--net", "internet", "--", "/bin/true"); r.code != 2 || !strings.Contains(r.stderr, "sealed") {
		t.Errorf("a sealed server: exit %d %q, want the run declined", r.code, r.stderr)
	}
}

// TestRunThroughDaemonHangUp: a client interrupted while it sends stdin
// that the command never reads is seen gone, and its sandbox ends.
func TestRunThroughDaemonHangUp(t *testing.T) {
	s := startRunServer(t)
	defer s.stop(t)
	cmd := exec.Command(airlockBin, "run", "--daemon", "always", "--stdin", "--state-dir", s.stateDir, "--", "/bin/sh", "-c", "echo ready; sleep 60")
	cmd.Stdin = strings.NewReader(strings.Repeat("y\n", 16<<20)) // 32 MiB, never read
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
		t.Fatalf("the command did not start: %q", line)
	}
	time.Sleep(500 * time.Millisecond) // the stdin queue fills
	cmd.Process.Signal(os.Interrupt)
	cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 130 {
		t.Errorf("interrupted: exit %d, want 130", code)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, body := s.do(t, "GET", "/metrics", nil, map[string]string{"X-API-KEY": s.key})
		if !strings.Contains(string(body), `airlock_sandboxes_running{template="base"} 1`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the interrupted run's sandbox still runs")
		}
	}
}
