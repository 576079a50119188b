package namespaces

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/airlocktest"
	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/backend/backendtest"
	"github.com/airlock-sandbox/airlock/internal/cgroups"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/sandboxbin"
)

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == SpawnerArg {
		os.Exit(ServeSpawner(os.Args[2:])) // TestSpawnerProcess's
	}
	if os.Getenv(spawnerParentEnv) != "" {
		os.Exit(spawnerParent()) // TestSpawnerDiesWithDaemon's
	}
	lo, hi := HostUIDs()
	airlocktest.SandboxUIDs = [2]int{lo, hi}
	if airlocktest.DefaultStateDir != DefaultStateDir {
		panic("airlocktest.DefaultStateDir is not the backend's " + DefaultStateDir)
	}
	os.Exit(m.Run())
}

// testBackend keeps its state where airlock run does.
var testBackend = New(DefaultStateDir, slog.New(slog.DiscardHandler))

// testPolicy is the default policy with a shorter timeout, so a test that
// goes wrong fails instead of hanging.
func testPolicy() policy.Policy {
	p := policy.Default()
	p.Timeout = 30 * time.Second
	return p
}

type outcome struct {
	*backend.Result
	stdout, stderr string
}

// runIn runs argv under p and checks that nothing of the sandbox remains.
func runIn(t *testing.T, p policy.Policy, argv ...string) outcome {
	t.Helper()
	airlocktest.RequiresRoot(t)
	var stdout, stderr bytes.Buffer
	res, err := testBackend.Run(t.Context(), &backend.Spec{Policy: p, Argv: argv, Stdout: &stdout, Stderr: &stderr})
	if err != nil {
		t.Fatalf("Run(%q): %v", argv, err)
	}
	airlocktest.CheckNoLeftovers(t, DefaultStateDir)
	return outcome{res, stdout.String(), stderr.String()}
}

func python(t *testing.T, p policy.Policy, code string) outcome {
	t.Helper()
	return runIn(t, p, "/usr/bin/python3", "-c", code)
}

func sh(t *testing.T, p policy.Policy, script string) outcome {
	t.Helper()
	return runIn(t, p, "/bin/bash", "-c", script)
}

func (o outcome) mustSucceed(t *testing.T) outcome {
	t.Helper()
	if o.ExitCode != 0 || o.Signal != "" {
		t.Fatalf("exit %d signal %q; stdout %q stderr %q", o.ExitCode, o.Signal, o.stdout, o.stderr)
	}
	return o
}

func statusFields(t *testing.T, status string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, line := range strings.Split(status, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

func TestIdentityAndPrivileges(t *testing.T) {
	o := sh(t, testPolicy(), "cat /proc/self/status; echo; id -un; pwd; echo $HOME; hostname").mustSucceed(t)
	st := statusFields(t, o.stdout)
	for key, want := range map[string]string{
		"Uid":        "1000\t1000\t1000\t1000",
		"Gid":        "1000\t1000\t1000\t1000",
		"CapInh":     "0000000000000000",
		"CapPrm":     "0000000000000000",
		"CapEff":     "0000000000000000",
		"CapBnd":     "0000000000000000",
		"CapAmb":     "0000000000000000",
		"NoNewPrivs": "1",
		"Seccomp":    "2",
	} {
		if st[key] != want {
			t.Errorf("%s = %q, want %q", key, st[key], want)
		}
	}
	if !strings.Contains(o.stdout, "\nuser\n/home/user\n/home/user\nsandbox\n") {
		t.Errorf("user/cwd/HOME/hostname: got %q", o.stdout)
	}
}

// TestNamespaces compares each namespace of the sandbox with the host's.
func TestNamespaces(t *testing.T) {
	o := sh(t, testPolicy(), "for n in user mnt pid net ipc uts cgroup; do echo $n $(readlink /proc/self/ns/$n); done; exec python3 -c 'import os; print(\"pids=\" + \",\".join(sorted(p for p in os.listdir(\"/proc\") if p.isdigit())), \"self=%d\" % os.getpid())'").mustSucceed(t)
	for _, line := range strings.Split(strings.TrimSpace(o.stdout), "\n") {
		name, inside, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(line, "pids=") {
			continue
		}
		host, err := os.Readlink("/proc/self/ns/" + name)
		if err != nil {
			t.Fatal(err)
		}
		if inside == host {
			t.Errorf("%s namespace is the host's (%s)", name, host)
		}
	}
	// init (pid 1) and the command itself, whatever pid bash's subshells
	// left it: no host process is visible.
	var self int
	for _, line := range strings.Split(o.stdout, "\n") {
		if v, ok := strings.CutPrefix(line, "pids="); ok {
			pids, selfField, _ := strings.Cut(v, " ")
			fmt.Sscanf(selfField, "self=%d", &self)
			if want := fmt.Sprintf("1,%d", self); self < 2 || pids != want {
				t.Errorf("the sandbox sees other processes: pids %s, want %s", pids, want)
			}
		}
	}
	if self == 0 {
		t.Errorf("no process listing: %q", o.stdout)
	}
}

// TestHostView checks from outside what the sandbox runs as: an
// unprivileged host uid, never root, and inside its cgroups.
func TestHostView(t *testing.T) {
	airlocktest.RequiresRoot(t)
	done := make(chan outcome, 1)
	go func() { done <- sh(t, testPolicy(), "sleep 30 & wait") }()
	// Wait for the sleep itself: before its exec, init's threads are
	// still moving into place.
	var pids []int
	for deadline := time.Now().Add(10 * time.Second); len(pids) == 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		for _, pid := range airlocktest.SandboxProcs() {
			if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); string(comm) == "sleep\n" {
				pids = append(pids, pid)
			}
		}
	}
	if len(pids) == 0 {
		t.Fatal("no process of the sandbox user seen from the host")
	}
	for _, pid := range pids {
		status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		st := statusFields(t, string(status))
		f := strings.Fields(st["Uid"])
		uid, _ := strconv.Atoi(f[0])
		lo, hi := HostUIDs()
		if len(f) != 4 || f[1] != f[0] || f[2] != f[0] || f[3] != f[0] || uid < lo || uid >= hi || (uid-lo)%hostIDRange != layout.UID {
			t.Errorf("pid %d host uids %q, want all the same, user 1000 of a sandbox range in [%d, %d)", pid, st["Uid"], lo, hi)
		}
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		for _, c := range []string{"memory", "pids", "cpu"} {
			if !cgroups.Unified() && !inCgroup(string(cg), c, "/"+cgroups.Prefix) {
				t.Errorf("pid %d is not in a sandbox %s cgroup:\n%s", pid, c, cg)
			}
		}
		_ = killPid(pid)
	}
	<-done
}

// inCgroup reports whether a /proc/PID/cgroup listing puts the process
// below prefix in the v1 hierarchy of controller (which may share its
// hierarchy with others: "4:cpu,cpuacct:/airlock-…").
func inCgroup(listing, controller, prefix string) bool {
	for _, line := range strings.Split(listing, "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) == 3 && slices.Contains(strings.Split(f[1], ","), controller) && strings.HasPrefix(f[2], prefix) {
			return true
		}
	}
	return false
}

func killPid(pid int) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	return p.Kill()
}

func TestRootFileSystem(t *testing.T) {
	p := testPolicy()
	o := sh(t, p, `
ls -A /; echo ---
ls /etc | tr '\n' ' '; echo; echo ---
for f in /root /work /var /home/user/../../run /etc/shadow /boot /sys; do [ -e $f ] && echo "visible $f"; done
touch /usr/x 2>/dev/null && echo "wrote /usr"
echo x >> /etc/passwd 2>/dev/null && echo "wrote /etc/passwd"
touch /x 2>/dev/null && echo "wrote /"
touch /tmp/ok /home/user/ok /dev/shm/ok && echo "writable places ok"
echo hidden > /proc/self/comm 2>/dev/null && echo "landlock missing: wrote /proc/self/comm"
ls /dev | tr '\n' ' '; echo
cat /etc/resolv.conf /etc/hosts
`).mustSucceed(t)
	sections := strings.Split(o.stdout, "---\n")
	// The merged-/usr links are those the host has (lib32 and libx32 on
	// some hosts only).
	want := []string{".airlock", "dev", "etc", "home", "proc", "tmp", "usr"}
	for _, name := range layout.HostRootLinks {
		if _, err := os.Lstat("/" + name); err == nil {
			want = append(want, name)
		}
	}
	slices.Sort(want)
	if got := strings.Fields(sections[0]); !slices.Equal(got, want) {
		t.Errorf("root contains %v, want %v", got, want)
	}
	bad := []string{"visible", "wrote /"}
	// Landlock is applied where the kernel has it: only there can a write
	// to /proc/self/comm be refused.
	if airlocktest.LandlockABI() > 0 {
		bad = append(bad, "landlock missing")
	} else {
		t.Log("this kernel has no Landlock: /proc/self/comm stays writable")
	}
	for _, b := range bad {
		if strings.Contains(o.stdout, b) {
			t.Errorf("%s:\n%s", b, o.stdout)
		}
	}
	if !strings.Contains(o.stdout, "writable places ok") {
		t.Errorf("/tmp, /home/user or /dev/shm not writable: %s %s", o.stdout, o.stderr)
	}
	if strings.Contains(sections[1], "shadow") || !strings.Contains(sections[1], "passwd") {
		t.Errorf("/etc holds %s", sections[1])
	}
}

func TestPythonScientificStack(t *testing.T) {
	if _, err := os.Stat("/usr/lib/python3/dist-packages/matplotlib"); err != nil {
		t.Skip("python3-matplotlib not installed (make test installs it)")
	}
	o := python(t, testPolicy(), `
import numpy, pandas, matplotlib.pyplot as plt, ssl, os
print(numpy.arange(5).sum())
print(pandas.DataFrame({"a": [1, 2]}).a.sum())
plt.plot([1, 2, 3]); plt.savefig("/tmp/p.png")
print(os.path.getsize("/tmp/p.png") > 1000)
print(ssl.create_default_context().cert_store_stats()["x509_ca"] > 0)
`).mustSucceed(t)
	if o.stdout != "10\n3\nTrue\nTrue\n" {
		t.Errorf("got %q, stderr %q", o.stdout, o.stderr)
	}
}

func TestNetworkIsLoopbackOnly(t *testing.T) {
	airlocktest.RequiresRoot(t)
	// A listener on the host's loopback: the sandbox must not reach it.
	port, accepted := backendtest.HostListener(t)
	o := python(t, testPolicy(), fmt.Sprintf(`
import socket, os
try:
    socket.create_connection(("127.0.0.1", %d), timeout=2)
    print("reached host")
except OSError as e:
    print("refused", e.errno)
# the sandbox's own loopback works
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
c = socket.create_connection(s.getsockname()); print("own loopback ok")
print(sorted(os.listdir("/sys/class/net")) if os.path.exists("/sys/class/net") else "no sysfs")
print(open("/proc/net/route").read().count("\n"))
`, port)).mustSucceed(t)
	if !strings.Contains(o.stdout, "refused") || !strings.Contains(o.stdout, "own loopback ok") {
		t.Errorf("got %q %q", o.stdout, o.stderr)
	}
	if !strings.HasSuffix(o.stdout, "\n1\n") { // header line only: no routes
		t.Errorf("routing table not empty: %q", o.stdout)
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("host listener accepted %d connections from the sandbox", n)
	}
}

func TestMountsEnvWorkdir(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil { // the sandbox user is "other" on the host
		t.Fatal(err)
	}
	ro := filepath.Join(dir, "ro")
	rw := filepath.Join(dir, "rw")
	for _, d := range []string{ro, rw} {
		if err := os.Mkdir(d, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(ro, "in.txt"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := testPolicy()
	p.Mounts = []policy.Mount{{Source: ro, Target: "/data", ReadOnly: true}, {Source: rw, Target: "/out"}}
	p.Env = []string{"GREETING=hello world", "HOME=/tmp"}
	p.Workdir = "/data"
	o := sh(t, p, `cat in.txt; echo; echo "$GREETING $HOME $PWD"; touch /data/x 2>/dev/null && echo "wrote ro"; echo result > /out/r.txt`).mustSucceed(t)
	if o.stdout != "data\nhello world /tmp /data\n" {
		t.Errorf("got %q (stderr %q)", o.stdout, o.stderr)
	}
	if got, _ := os.ReadFile(filepath.Join(rw, "r.txt")); string(got) != "result\n" {
		t.Errorf("rw mount: host sees %q", got)
	}
}

// TestIDMappedMount: a volume's mount is idmapped for the sandbox's user
// namespace: files the disk says uid 1000 owns are the sandbox user's,
// and what the sandbox writes is stored as 1000, not as its host uid,
// so the next sandbox (another host id range) sees it as its own too.
func TestIDMappedMount(t *testing.T) {
	airlocktest.RequiresRoot(t)
	vol := filepath.Join(t.TempDir(), "vol")
	if err := os.Mkdir(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(vol, "old"), []byte("old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{vol, filepath.Join(vol, "old")} {
		if err := os.Chown(p, 1000, 1000); err != nil {
			t.Fatal(err)
		}
	}
	p := testPolicy()
	p.Mounts = []policy.Mount{{Source: vol, Target: "/data", IDMapped: true}}
	for i := range 2 {
		o := sh(t, p, fmt.Sprintf(`stat -c '%%u:%%g' /data /data/old; echo %d >> /data/old; echo %d > /data/new%d`, i, i, i)).mustSucceed(t)
		if o.stdout != "1000:1000\n1000:1000\n" {
			t.Errorf("sandbox %d sees the owners as %q, want the user's", i, o.stdout)
		}
	}
	for _, name := range []string{"old", "new0", "new1"} {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(vol, name), &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != 1000 || st.Gid != 1000 {
			t.Errorf("%s is stored as %d:%d, want 1000:1000", name, st.Uid, st.Gid)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(vol, "old")); string(b) != "old\n0\n1\n" {
		t.Errorf("old: %q", b)
	}
}

func TestExitCodesAndSignals(t *testing.T) {
	if o := sh(t, testPolicy(), "exit 3"); o.ExitCode != 3 || o.Signal != "" {
		t.Errorf("exit 3: got %d %q", o.ExitCode, o.Signal)
	}
	if o := sh(t, testPolicy(), "kill -SEGV $$"); o.Signal != "SIGSEGV" || o.TimedOut || o.OOMKilled {
		t.Errorf("SIGSEGV: got %+v", o.Result)
	}
}

func TestStdin(t *testing.T) {
	airlocktest.RequiresRoot(t)
	var stdout bytes.Buffer
	res, err := testBackend.Run(t.Context(), &backend.Spec{
		Policy: testPolicy(),
		Argv:   []string{"/usr/bin/python3", layout.CodePath("echo.py")},
		Files:  []backend.File{{Name: "echo.py", Data: []byte("print(input().upper())")}},
		Stdin:  strings.NewReader("hello\n"),
		Stdout: &stdout,
	})
	if err != nil || res.ExitCode != 0 || stdout.String() != "HELLO\n" {
		t.Errorf("got %q, %+v, %v", stdout.String(), res, err)
	}
}

func TestSetupFailureIsAnError(t *testing.T) {
	airlocktest.RequiresRoot(t)
	_, err := testBackend.Run(t.Context(), &backend.Spec{Policy: testPolicy(), Argv: []string{"no-such-command"}})
	if err == nil || !strings.Contains(err.Error(), `"no-such-command" not found`) {
		t.Errorf("got %v, want a setup error naming the command", err)
	}
	airlocktest.CheckNoLeftovers(t, DefaultStateDir)
}

func TestContextCancelKills(t *testing.T) {
	airlocktest.RequiresRoot(t)
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	_, err := testBackend.Run(ctx, &backend.Spec{Policy: testPolicy(), Argv: []string{"/bin/sleep", "60"}})
	if err != context.DeadlineExceeded {
		t.Errorf("got %v, want context.DeadlineExceeded", err)
	}
	airlocktest.CheckNoLeftovers(t, DefaultStateDir)
}

// TestCleanupAfterCrash kills the airlock process (here a child process
// running this test binary's helper) with SIGKILL mid-run and checks that
// the sandbox dies with it and that Cleanup removes the rest.
func TestCleanupAfterCrash(t *testing.T) {
	airlocktest.RequiresRoot(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperLongRun$")
	cmd.Env = append(os.Environ(), "AIRLOCK_HELPER=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); len(airlocktest.SandboxProcs()) == 0; {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatal("helper's sandbox never started")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cmd.Process.Kill()
	cmd.Wait()
	// The parent-death signal takes the sandbox down.
	for deadline := time.Now().Add(10 * time.Second); len(airlocktest.SandboxProcs()) > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("sandbox processes outlived their airlock: %v", airlocktest.SandboxProcs())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(airlocktest.Cgroups()) == 0 {
		t.Fatal("expected the killed run's cgroups to remain until cleanup")
	}
	if err := testBackend.Cleanup(t.Context()); err != nil {
		t.Fatal(err)
	}
	airlocktest.CheckNoLeftovers(t, DefaultStateDir)
}

// TestHelperLongRun is not a test: TestCleanupAfterCrash runs it in a child.
func TestHelperLongRun(t *testing.T) {
	if os.Getenv("AIRLOCK_HELPER") == "" {
		t.Skip("helper for TestCleanupAfterCrash")
	}
	testBackend.Run(context.Background(), &backend.Spec{Policy: testPolicy(), Argv: []string{"/bin/sleep", "60"}})
}

func TestInvalidUTF8Output(t *testing.T) {
	o := sh(t, testPolicy(), `printf 'ok \xff\xfe end'`).mustSucceed(t)
	if _, err := json.Marshal(o.stdout); err != nil || !strings.HasPrefix(o.stdout, "ok ") {
		t.Errorf("stdout %q: %v", o.stdout, err)
	}
}

// TestStartWithFilesAndSelf starts a long-lived sandbox the way the daemon
// does: a file handed to the command, the sandbox binary mounted inside.
func TestStartWithFilesAndSelf(t *testing.T) {
	airlocktest.RequiresRoot(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	bin, err := sandboxbin.Install(DefaultStateDir)
	if err != nil {
		t.Fatal(err)
	}
	self, _ := os.Stat(bin.Path)
	var stdout bytes.Buffer
	sb, err := testBackend.start(t.Context(), &spec{
		Spec: &backend.Spec{
			Policy: testPolicy(),
			Argv:   []string{"/bin/bash", "-c", `echo through-fd3 >&3; stat -c %s /.airlock/bin/airlock; touch /.airlock/bin/airlock 2>/dev/null && echo writable; read line; echo "$line"`},
			Stdin:  strings.NewReader("from-stdin\n"),
			Stdout: &stdout,
		},
		extraFiles: []*os.File{w},
		selfMounts: []string{"/.airlock/bin/airlock"},
	})
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(r)
	res, err := sb.Wait()
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("Wait: %+v %v", res, err)
	}
	if string(got) != "through-fd3\n" {
		t.Errorf("fd 3 carried %q", got)
	}
	if want := fmt.Sprintf("%d\nfrom-stdin\n", self.Size()); stdout.String() != want {
		t.Errorf("stdout %q, want %q (binary size, then stdin; never writable)", stdout.String(), want)
	}
	airlocktest.CheckNoLeftovers(t, DefaultStateDir)
}

// TestUserNamespaceOwner: the sandbox's user namespace belongs to an
// unprivileged host uid, so what the sandbox uses of per-user kernel
// budgets is not charged to host root. Here the sandbox takes every
// inotify instance it may have while the host (root) still gets one.
func TestUserNamespaceOwner(t *testing.T) {
	airlocktest.RequiresRoot(t)
	r, w, _ := os.Pipe()
	defer r.Close()
	sb, err := testBackend.start(t.Context(), &spec{extraFiles: []*os.File{w}, Spec: &backend.Spec{Policy: testPolicy(), Argv: []string{"/usr/bin/python3", "-c", `
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
fds = []
while True:
    fd = libc.inotify_init1(0)
    if fd < 0: break
    fds.append(fd)
os.write(3, b"%d\n" % len(fds))
time.sleep(30)
`}}})
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { sb.Kill(); sb.Wait() }()
	line := make([]byte, 32)
	n, _ := r.Read(line)
	if got, _ := strconv.Atoi(strings.TrimSpace(string(line[:n]))); got < 100 {
		t.Fatalf("sandbox got %q inotify instances, expected its whole budget", line[:n])
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Fatalf("host root cannot create an inotify instance while a sandbox holds its own: %v", err)
	}
	unix.Close(fd)
	// NS_GET_OWNER_UID on the sandbox's user namespace.
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", sb.proc.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	var owner uint32
	const nsGetOwnerUID = 0xb704
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, ns.Fd(), nsGetOwnerUID, uintptr(unsafe.Pointer(&owner))); e != 0 {
		t.Fatal(e)
	}
	if int(owner) != sb.HostUID-layout.UID {
		t.Errorf("user namespace owned by host uid %d, want the sandbox's %d", owner, sb.HostUID-layout.UID)
	}
}

// TestNoLeakedFiles: the command gets stdin, stdout, stderr and nothing
// else, even when the airlock process holds inheritable descriptors.
func TestNoLeakedFiles(t *testing.T) {
	airlocktest.RequiresRoot(t)
	dir, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY, 0) // no O_CLOEXEC
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dir)
	o := python(t, testPolicy(), `import os; print(sorted(int(f) for f in os.listdir("/proc/self/fd")))`).mustSucceed(t)
	// 0-2, plus the descriptor listdir itself holds open.
	if o.stdout != "[0, 1, 2, 3]\n" {
		t.Errorf("descriptors in the sandbox: %s", o.stdout)
	}
}

func TestFileNamesAreSingleElements(t *testing.T) {
	airlocktest.RequiresRoot(t)
	for _, name := range []string{"../escape", "a/b", "..", ""} {
		_, err := testBackend.Run(t.Context(), &backend.Spec{Policy: testPolicy(), Argv: []string{"/bin/true"}, Files: []backend.File{{Name: name, Data: []byte("x")}}})
		if err == nil || !strings.Contains(err.Error(), "single path element") {
			t.Errorf("file name %q: got %v, want a refusal", name, err)
		}
	}
}

// TestMountPropagationStaysInside: mounts made inside a bound directory
// never appear on the host, even when the host mount is shared.
func TestMountPropagationStaysInside(t *testing.T) {
	airlocktest.RequiresRoot(t)
	dir := t.TempDir()
	os.Chmod(dir, 0o777)
	// Make dir a shared mount point of its own, like / on systemd hosts.
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	if err := unix.Mount("", dir, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	p := testPolicy()
	p.Mounts = []policy.Mount{{Source: dir, Target: "/data"}}
	// Init itself mounts nothing below /data, but the tree must be private
	// before anything could: check the propagation the sandbox sees.
	o := sh(t, p, `grep ' /data ' /proc/self/mountinfo`).mustSucceed(t)
	if strings.Contains(o.stdout, "shared:") {
		t.Errorf("the bound tree is still shared with the host: %s", o.stdout)
	}
}

// The properties every backend must have (the same table as gVisor's).
func TestIsolationProperties(t *testing.T) {
	backendtest.Properties(t, func(t *testing.T, p policy.Policy, script string) backendtest.Outcome {
		o := sh(t, p, script)
		return backendtest.Outcome{ExitCode: o.ExitCode, Signal: o.Signal, TimedOut: o.TimedOut, OOMKilled: o.OOMKilled,
			StdoutTruncated: o.StdoutTruncated, Stdout: o.stdout, Stderr: o.stderr}
	})
}

// Live sandboxes never share a host id range: a claimed range is refused
// to every other claim, in this process or another, until released.
func TestHostIDRangesAreExclusive(t *testing.T) {
	airlocktest.RequiresRoot(t)
	held := map[int]func(){}
	defer func() {
		for _, release := range held {
			release()
		}
	}()
	for range 300 {
		base, release, err := claimIDBase()
		if err != nil {
			t.Fatal(err)
		}
		if _, dup := held[base]; dup {
			t.Fatalf("range %d handed out twice", base)
		}
		held[base] = release
	}
	// A slot held here is locked for any other open file too, such as
	// another process's.
	for base := range held {
		other, err := os.OpenFile(uidLockFile, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		slot := (base - hostIDBase) / hostIDRange
		lk := unix.Flock_t{Type: unix.F_WRLCK, Start: int64(slot), Len: 1}
		if err := unix.FcntlFlock(other.Fd(), unix.F_OFD_SETLK, &lk); err == nil {
			t.Errorf("slot %d locked twice", slot)
		}
		held[base]()
		if err := unix.FcntlFlock(other.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
			t.Errorf("slot %d still locked after its release: %v", slot, err)
		}
		other.Close()
		delete(held, base)
		break
	}
	// The locks cost the process one descriptor, however many it holds.
	if n := countFDs(t, uidLockFile); n != 1 {
		t.Errorf("%d descriptors of %s open, want 1", n, uidLockFile)
	}
}

// countFDs counts this process's descriptors of the file at path.
func countFDs(t *testing.T, path string) int {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if target, _ := os.Readlink("/proc/self/fd/" + e.Name()); target == path {
			n++
		}
	}
	return n
}
