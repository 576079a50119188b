package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/airlocktest"
	"github.com/airlock-sandbox/airlock/internal/backend/namespaces"
	"golang.org/x/sys/unix"
)

// airlockBin is the binary under test, built once by TestMain into a
// directory anyone may enter, so that the non-root test can run it too.
var airlockBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "airlock-cli-test-")
	if err != nil {
		panic(err)
	}
	os.Chmod(dir, 0o755)
	airlockBin = filepath.Join(dir, "airlock")
	build := exec.Command("go", "build", "-o", airlockBin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		panic("build airlock: " + err.Error() + "\n" + string(out))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type cliResult struct {
	code           int
	stdout, stderr string
	maxRSSKiB      int64
}

func airlock(t *testing.T, stdin string, args ...string) cliResult {
	t.Helper()
	cmd := exec.Command(airlockBin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Stdin = strings.NewReader(stdin)
	err := cmd.Run()
	if err != nil && cmd.ProcessState == nil {
		t.Fatalf("airlock %q: %v", args, err)
	}
	return cliResult{
		code:      cmd.ProcessState.ExitCode(),
		stdout:    stdout.String(),
		stderr:    stderr.String(),
		maxRSSKiB: cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss,
	}
}

func TestBadInput(t *testing.T) {
	airlocktest.RequiresRoot(t) // as root, so that nothing is refused for privileges
	dir := t.TempDir()
	txt := filepath.Join(dir, "notes.txt")
	os.WriteFile(txt, []byte("x"), 0o644)
	// A mount source reached through a symlink, as an earlier sandbox with
	// the parent read-write could have left it: refused on both backends.
	os.Mkdir(filepath.Join(dir, "real"), 0o755)
	os.Symlink("real", filepath.Join(dir, "link"))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"serve", "--kubeconfig", "/nonexistent"}, "need --node-name"},
		{[]string{"serve", "--node-name", "Node_1"}, `--node-name "Node_1" is not a DNS name`},
		{[]string{"router"}, "AIRLOCK_API_KEY must be set"},
		{[]string{"router", "--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"run", "--bogus", "--", "true"}, "flag provided but not defined: -bogus"},
		{[]string{"run", "--memory", "0", "--", "true"}, "memory limit 0 is below the minimum"},
		{[]string{"run", "--memory", "12Q", "--", "true"}, `size "12Q" is not a number`},
		{[]string{"run", "--cpus", "-1", "--", "true"}, "cpus must be greater than 0"},
		{[]string{"run", "--pids", "0", "--", "true"}, "pids limit must be at least 1"},
		{[]string{"run", "--timeout", "-1s", "--", "true"}, "timeout must be positive"},
		{[]string{"run", "--file", filepath.Join(dir, "missing.py")}, "cannot read"},
		{[]string{"run", "--file", txt}, "cannot tell the language of notes.txt"},
		{[]string{"run", "--lang", "cobol", "--code", "x"}, `unknown language "cobol"`},
		{[]string{"run", "--mount", "/nonexistent-airlock-src:/data", "--", "true"}, "mount source /nonexistent-airlock-src does not exist"},
		{[]string{"run", "--mount", dir + ":/proc", "--", "true"}, "is reserved by the sandbox"},
		{[]string{"run", "--mount", dir + "/link:/data", "--", "true"}, "its path has a symbolic link"},
		{[]string{"run", "--mount", dir + "/link/:/data:rw", "--backend", "gvisor", "--", "true"}, "its path has a symbolic link"},
		{[]string{"run", "--mount", "nocolon", "--", "true"}, "is not SRC:DST"},
		{[]string{"run", "--env", "NOEQUALS", "--", "true"}, "is not KEY=VALUE"},
		{[]string{"run"}, "nothing to run"},
		{[]string{"run", "--code", "print(1)", "--", "true"}, "not both"},
		{[]string{"run", "--net", "wifi", "--", "true"}, "--net must be none or internet"},
		{[]string{"run", "--user", "root", "--", "true"}, "--user root needs --template"},
		{[]string{"run", "--user", "bob", "--", "true"}, "--user must be user or root"},
		{[]string{"run", "--deny-out", "203.0.113.7", "--", "true"}, "--deny-out needs a network"},
		{[]string{"run", "--net", "none", "--allow-out", "example.com", "--", "true"}, "--net none takes no"},
		{[]string{"run", "--allow-out", "::/0", "--", "true"}, "IPv6"},
		{[]string{"run", "--allow-out", "exa mple.com", "--", "true"}, "network rule"},
		{[]string{"run", "--dns", "203.0.113.53", "--", "true"}, "--dns needs a network"},
		{[]string{"run", "--net", "internet", "--dns", "resolver.example", "--", "true"}, "DNS upstream"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			r := airlock(t, "", tc.args...)
			if r.code != 2 {
				t.Errorf("exit code %d, want 2 (stderr %q)", r.code, r.stderr)
			}
			lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
			if len(lines) != 1 || !strings.HasPrefix(lines[0], "airlock: ") || !strings.Contains(lines[0], tc.want) {
				t.Errorf("stderr %q, want one line containing %q", r.stderr, tc.want)
			}
			if strings.Contains(r.stderr, "/run/airlock") || strings.Contains(r.stderr, "/sys/fs") {
				t.Errorf("error leaks internals: %q", r.stderr)
			}
			airlocktest.CheckNoLeftovers(t, namespaces.DefaultStateDir)
		})
	}
}

func TestNotRoot(t *testing.T) {
	airlocktest.RequiresRoot(t) // to switch to an unprivileged user
	cmd := exec.Command(airlockBin, "run", "--", "/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, _ := cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), "needs root") {
		t.Errorf("as nobody: exit %d, output %q; want 2 and a message that root is needed", cmd.ProcessState.ExitCode(), out)
	}
}

func TestStreamingAndExitCode(t *testing.T) {
	airlocktest.RequiresRoot(t)
	r := airlock(t, "", "run", "--", "/bin/sh", "-c", "echo out; echo err >&2; exit 7")
	if r.code != 7 || r.stdout != "out\n" || r.stderr != "err\n" {
		t.Errorf("got exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	r = airlock(t, "", "run", "--", "/bin/bash", "-c", "kill -TERM $$")
	if r.code != 128+15 || !strings.Contains(r.stderr, "signal SIGTERM") {
		t.Errorf("SIGTERM: exit %d stderr %q, want 143", r.code, r.stderr)
	}
}

func TestJSON(t *testing.T) {
	airlocktest.RequiresRoot(t)
	r := airlock(t, "", "run", "--json", "--", "/bin/bash", "-c", `printf 'a\xffb'; echo e >&2; exit 3`)
	var got map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("not JSON: %v: %q", err, r.stdout)
	}
	for _, key := range []string{"stdout", "stderr", "exit_code", "signal", "timed_out", "oom_killed",
		"stdout_truncated", "stderr_truncated", "duration_ms", "cpu_ms", "max_memory_bytes"} {
		if _, ok := got[key]; !ok {
			t.Errorf("key %q missing from %s", key, r.stdout)
		}
	}
	if got["stdout"] != "a\ufffdb" || got["stderr"] != "e\n" || got["exit_code"] != 3.0 || got["signal"] != nil {
		t.Errorf("got %s", r.stdout)
	}
	if r.code != 3 {
		t.Errorf("exit code %d, want the program's 3", r.code)
	}
}

func TestTimeoutAndOOMExitCodes(t *testing.T) {
	airlocktest.RequiresRoot(t)
	r := airlock(t, "", "run", "--timeout", "1s", "--", "/bin/sleep", "60")
	if r.code != 124 || r.stderr != "airlock: killed: wall timeout 1s\n" {
		t.Errorf("timeout: exit %d stderr %q", r.code, r.stderr)
	}
	r = airlock(t, "", "run", "--memory", "64M", "--json", "--", "/usr/bin/python3", "-c", "b = bytearray(512 << 20)")
	if r.code != 137 || !strings.Contains(r.stdout, `"oom_killed":true`) {
		t.Errorf("oom: exit %d stdout %q", r.code, r.stdout)
	}
}

func TestCodeFilesAndStdin(t *testing.T) {
	airlocktest.RequiresRoot(t)
	dir := t.TempDir()
	echo := filepath.Join(dir, "echo.py")
	os.WriteFile(echo, []byte("print(input()[::-1])\n"), 0o600)
	script := filepath.Join(dir, "hi.sh")
	os.WriteFile(script, []byte("echo \"bash $BASH_VERSINFO in $PWD as $(id -un) with $GREETING\"\n"), 0o600)

	if r := airlock(t, "stressed\n", "run", "--stdin", "--file", echo); r.code != 0 || r.stdout != "desserts\n" {
		t.Errorf("--stdin --file echo.py: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := airlock(t, "", "run", "--env", "GREETING=hi", "--workdir", "/tmp", "--file", script); r.code != 0 ||
		!strings.HasSuffix(r.stdout, " in /tmp as user with hi\n") {
		t.Errorf("--file hi.sh: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := airlock(t, "", "run", "--lang", "python", "--code", "import numpy; print(numpy.arange(5))"); r.code != 0 || r.stdout != "[0 1 2 3 4]\n" {
		t.Errorf("--code numpy: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := airlock(t, "", "run", "--code", "1/0"); r.code != 1 || !strings.Contains(r.stderr, "ZeroDivisionError") {
		t.Errorf("--code 1/0: exit %d %q", r.code, r.stderr)
	}
	// Without --stdin the program reads end of file.
	if r := airlock(t, "ignored\n", "run", "--file", echo); r.code != 1 || !strings.Contains(r.stderr, "EOFError") {
		t.Errorf("no --stdin: exit %d %q", r.code, r.stderr)
	}
}

// TestOutputFloodKeepsAirlockSmall: output beyond the limit is dropped as
// it arrives, so airlock's own memory stays flat whatever the sandbox prints.
func TestOutputFloodKeepsAirlockSmall(t *testing.T) {
	airlocktest.RequiresRoot(t)
	r := airlock(t, "", "run", "--json", "--output-limit", "1M", "--", "/bin/sh", "-c", "head -c 300000000 /dev/zero")
	var got struct {
		Stdout    string `json:"stdout"`
		Truncated bool   `json:"stdout_truncated"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Stdout) != 1<<20 || !got.Truncated {
		t.Errorf("kept %d bytes, truncated=%v; want 1 MiB and true", len(got.Stdout), got.Truncated)
	}
	if r.maxRSSKiB > 64<<10 {
		t.Errorf("airlock's max RSS was %d KiB for 300 MB of output, want it bounded (< 64 MiB)", r.maxRSSKiB)
	}
	r = airlock(t, "", "run", "--output-limit", "1K", "--", "/bin/sh", "-c", "head -c 100000 /dev/zero")
	if len(r.stdout) != 1024 || !strings.Contains(r.stderr, "output truncated at 1K") {
		t.Errorf("streaming: %d bytes, stderr %q", len(r.stdout), r.stderr)
	}
}

func TestControlEscaper(t *testing.T) {
	var b strings.Builder
	e := &controlEscaper{w: &b}
	e.Write([]byte("ok\tline\r\n\x1b]52;c;x\x07 é \xc2"))
	e.Write([]byte("\x9b6n end\x7f"))
	if want := "ok\tline\r\n^[]52;c;x^G é ?6n end^?"; b.String() != want {
		t.Errorf("got %q, want %q", b.String(), want)
	}
}

func TestGVisorBackendFlags(t *testing.T) {
	airlocktest.RequiresRoot(t)
	if r := airlock(t, "", "run", "--backend", "firecracker", "--", "/bin/true"); r.code != 2 || !strings.Contains(r.stderr, `unknown backend "firecracker"`) {
		t.Errorf("unknown backend: exit %d %q", r.code, r.stderr)
	}
	if r := airlock(t, "", "run", "--backend", "gvisor", "--runsc", "/bin/ls", "--", "/bin/true"); r.code != 2 || !strings.Contains(r.stderr, "dynamically linked") {
		t.Errorf("dynamic runsc: exit %d %q", r.code, r.stderr)
	}
	if _, err := exec.LookPath("runsc"); err != nil && os.Getenv("AIRLOCK_RUNSC") == "" {
		t.Skip("no runsc (make test builds it)")
	}
	r := airlock(t, "hi\n", "run", "--backend", "gvisor", "--stdin", "--json", "--", "/bin/bash", "-c", "read x; echo $x $(uname -r); exit 4")
	if r.code != 4 || !strings.Contains(r.stdout, `"stdout":"hi 4.19.0-gvisor\n"`) {
		t.Errorf("gvisor run: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
}

// A signal sent to a sandbox's init reaches its command: init passes it
// on from the thread that forked the command, the one whose Landlock
// domain the command shares (a thread of another domain is refused by
// the signal scope).
func TestInitForwardsSignals(t *testing.T) {
	airlocktest.RequiresRoot(t)
	cmd := exec.Command(airlockBin, "run", "--timeout", "20s", "--", "/bin/sh", "-c",
		`trap "echo got TERM; exit 3" TERM; echo ready; while :; do sleep 0.05; done`)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	r := bufio.NewReader(out)
	if line, _ := r.ReadString('\n'); line != "ready\n" {
		t.Fatalf("the command did not start: %q", line)
	}
	if err := syscall.Kill(sandboxInit(t, cmd.Process.Pid), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(r)
	cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); string(rest) != "got TERM\n" || code != 3 {
		t.Errorf("after SIGTERM to init: %q, exit %d; want the command's trap, exit 3", rest, code)
	}
}

// sandboxInit is the pid of the sandbox's init: airlock run's only child
// (forked by any of its threads).
func sandboxInit(t *testing.T, airlockPid int) int {
	t.Helper()
	var kids []string
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", airlockPid))
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		kids = append(kids, strings.Fields(string(b))...)
	}
	if len(kids) != 1 {
		t.Fatalf("children of airlock run: %q, want its sandbox's init", kids)
	}
	pid, err := strconv.Atoi(kids[0])
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// A descriptor airlock inherited beyond stdio reaches no process it
// starts: not the sandbox's init, where the sandbox's own user could open
// it through /proc/1/fd.
func TestInheritedDescriptorsStayOut(t *testing.T) {
	airlocktest.RequiresRoot(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var fi syscall.Stat_t
	if err := syscall.Fstat(int(w.Fd()), &fi); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(airlockBin, "run", "--daemon", "never", "--timeout", "20s", "--", "/bin/sh", "-c", "echo ready; exec sleep 20")
	// Its descriptor 62, without close-on-exec: above those airlock hands
	// init on purpose (3, 4, …), which would replace it.
	cmd.ExtraFiles = make([]*os.File, 60)
	cmd.ExtraFiles[59] = w
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
		t.Fatalf("the command did not start: %q", line)
	}
	pipe := fmt.Sprintf("pipe:[%d]", fi.Ino)
	if target, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/62", cmd.Process.Pid)); target != pipe {
		t.Fatalf("airlock's descriptor 62 is %q, want the inherited %s", target, pipe)
	}
	init := sandboxInit(t, cmd.Process.Pid)
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", init))
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		if target, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", init, fd.Name())); target == pipe {
			t.Errorf("the sandbox's init holds airlock's inherited %s as its descriptor %s", pipe, fd.Name())
		}
	}
}

// The fallback for kernels without CLOSE_RANGE_CLOEXEC marks every
// descriptor, as close_range does.
func TestMarkInheritedOnExec(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	fd := int(r.Fd())
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0); err != nil {
		t.Fatal(err)
	}
	if err := markInheritedOnExec(); err != nil {
		t.Fatal(err)
	}
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	if err != nil {
		t.Fatal(err)
	}
	if flags&unix.FD_CLOEXEC == 0 {
		t.Fatalf("descriptor %d is not close-on-exec", fd)
	}
}
