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
	"runtime"
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
	lo, hi := HostUIDs()
	airlocktest.SandboxUIDs = [2]int{lo, hi}
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

// TestSeccomp calls refused syscalls through ctypes and checks the errno.
func TestSeccomp(t *testing.T) {
	o := python(t, testPolicy(), `
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def call(name, nr, *args):
    r = libc.syscall(nr, *args)
    print(name, errno.errorcode.get(ctypes.get_errno(), "OK") if r == -1 else "OK")
call("unshare", 272, 0x10000000)
call("mount", 165, 0, 0, 0, 0, 0)
call("ptrace", 101, 16, 1, 0, 0)
call("bpf", 321, 0, 0, 0)
call("perf_event_open", 298, 0, 0, -1, -1, 0)
call("keyctl", 250, 0, 0, 0, 0, 0)
call("add_key", 248, 0, 0, 0, 0, 0)
call("userfaultfd", 323, 0)
call("io_uring_setup", 425, 1, 0)
call("setns", 308, 0, 0)
call("open_by_handle_at", 304, 0, 0, 0)
call("kexec_load", 246, 0, 0, 0, 0)
call("init_module", 175, 0, 0, 0)
call("reboot", 169, 0, 0, 0, 0)
call("swapon", 167, 0, 0)
call("iopl", 172, 3)
call("clone_newuser", 56, 0x10000000 | 17, 0, 0, 0, 0)
call("clone3", 435, 0, 0)
call("x32_getpid", 0x40000000 | 39)
call("mbind", 237, 0, 0, 0, 0, 0, 0)
call("personality_noaslr", 135, 0x0040000)
call("socket_vsock", 41, 40, 1, 0)
call("socket_alg", 41, 38, 5, 0)
call("socketpair_vsock", 53, 40, 1, 0, 0)
import fcntl, termios
m, s = os.openpty()
try:
    fcntl.ioctl(s, termios.TIOCSTI, b"x"); print("TIOCSTI OK")
except OSError as e:
    print("TIOCSTI", errno.errorcode[e.errno])
call("getpid", 39)
call("personality_query", 135, 0xffffffff)
call("socket_inet", 41, 2, 1, 0)
call("socket_unix", 41, 1, 1, 0)
`).mustSucceed(t)
	want := map[string]string{"clone3": "ENOSYS", "getpid": "OK", "personality_query": "OK", "socket_inet": "OK",
		"socket_unix": "OK", "socket_vsock": "EAFNOSUPPORT", "socket_alg": "EAFNOSUPPORT", "socketpair_vsock": "EAFNOSUPPORT"}
	for _, line := range strings.Split(strings.TrimSpace(o.stdout), "\n") {
		name, got, _ := strings.Cut(line, " ")
		w, ok := want[name]
		if !ok {
			w = "EPERM"
		}
		if got != w {
			t.Errorf("%s: got %s, want %s", name, got, w)
		}
	}
}

// i386Write calls write(1, "i386 syscall ran\n") through the 32-bit
// syscall ABI (int 0x80) from machine code. Its pointer is 32 bits wide,
// so the page lies below 4 GiB (MAP_32BIT).
const i386Write = `
import ctypes, mmap, struct
buf = mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x40,
                prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
msg = b"i386 syscall ran\n"
code = (b"\x53" +                                # push rbx (callee-saved)
        b"\xb8" + struct.pack("<I", 4) +         # mov eax, 4 (write)
        b"\xbb" + struct.pack("<I", 1) +         # mov ebx, 1 (stdout)
        b"\xb9" + struct.pack("<I", addr + 64) + # mov ecx, msg
        b"\xba" + struct.pack("<I", len(msg)) +  # mov edx, len
        b"\xcd\x80" +                            # int 0x80
        b"\x5b\xc3")                             # pop rbx; ret
buf.write(code)
buf.seek(64)
buf.write(msg)
print("calling", flush=True)
ctypes.CFUNCTYPE(ctypes.c_int)(addr)()
print("survived", flush=True)
`

// TestSeccompKillsI386ABI: no syscall may ever run through the 32-bit
// ABI in a sandbox. Hosts differ: where the kernel offers that ABI the
// filter must kill the process with SIGSYS; where it does not (int 0x80
// faults even outside any sandbox) the process must still die before
// the call does anything. The host is probed first, outside a sandbox.
func TestSeccompKillsI386ABI(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the i386 ABI exists only beside amd64")
	}
	host, _ := exec.Command("/usr/bin/python3", "-c", i386Write).Output()
	hostHasABI := strings.Contains(string(host), "i386 syscall ran")
	o := python(t, testPolicy(), i386Write)
	if strings.Contains(o.stdout, "i386 syscall ran") || strings.Contains(o.stdout, "survived") || o.Signal == "" {
		t.Fatalf("i386 syscall in a sandbox: signal %q stdout %q stderr %q, want the process killed before it ran", o.Signal, o.stdout, o.stderr)
	}
	if hostHasABI && o.Signal != "SIGSYS" {
		t.Errorf("i386 syscall: signal %q, want SIGSYS (this host runs the 32-bit ABI outside a sandbox)", o.Signal)
	}
	if !hostHasABI {
		t.Logf("this host has no 32-bit syscall ABI (outside a sandbox: %q); the sandbox's process died by %s", host, o.Signal)
	}
}

func TestMemoryLimitOOM(t *testing.T) {
	p := testPolicy()
	p.MemoryBytes = 64 << 20
	o := python(t, p, "x = bytearray(256 << 20); print('allocated')")
	if !o.OOMKilled || o.Signal != "SIGKILL" || strings.Contains(o.stdout, "allocated") {
		t.Errorf("oom_killed %v signal %q stdout %q", o.OOMKilled, o.Signal, o.stdout)
	}
	if o.MaxMemoryBytes < 32<<20 || o.MaxMemoryBytes > 64<<20 {
		t.Errorf("max memory %d, want near the 64 MiB limit", o.MaxMemoryBytes)
	}
	// Within the limit nothing is reported.
	o = python(t, p, "x = bytearray(16 << 20); print('allocated')").mustSucceed(t)
	if o.OOMKilled {
		t.Error("oom_killed reported for a run within its limit")
	}
}

func TestForkBombContained(t *testing.T) {
	p := testPolicy()
	p.Pids = 32
	p.Timeout = 3 * time.Second
	// The host must keep forking while the bomb runs.
	stop := make(chan struct{})
	hostForks := make(chan error, 1)
	go func() {
		var err error
		for {
			select {
			case <-stop:
				hostForks <- err
				return
			default:
			}
			if e := exec.Command("/bin/true").Run(); e != nil {
				err = e
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	o := sh(t, p, `bomb() { bomb | bomb & }; bomb; sleep 10`)
	close(stop)
	if err := <-hostForks; err != nil {
		t.Errorf("host could not fork during the bomb: %v", err)
	}
	if !o.TimedOut {
		t.Errorf("fork bomb run ended without the timeout: exit %d signal %q", o.ExitCode, o.Signal)
	}
}

func TestTimeoutKillsEverything(t *testing.T) {
	p := testPolicy()
	p.Timeout = time.Second
	marker := strconv.Itoa(900000 + os.Getpid()%99999)
	o := sh(t, p, `trap '' TERM; setsid sleep `+marker+` & (sleep `+marker+` &) ; sleep `+marker)
	if !o.TimedOut || o.Signal != "SIGKILL" {
		t.Errorf("timed_out %v signal %q, want a timeout kill", o.TimedOut, o.Signal)
	}
	assertNoProcessWith(t, "sleep\x00"+marker)
}

// TestDaemonDiesWithMain: when the main process exits, a daemonized
// grandchild must not survive it.
func TestDaemonDiesWithMain(t *testing.T) {
	marker := strconv.Itoa(800000 + os.Getpid()%99999)
	o := sh(t, testPolicy(), `(setsid nohup sleep `+marker+` >/dev/null 2>&1 &); echo started`).mustSucceed(t)
	if o.stdout != "started\n" {
		t.Errorf("stdout %q", o.stdout)
	}
	assertNoProcessWith(t, "sleep\x00"+marker)
}

func assertNoProcessWith(t *testing.T, cmdline string) {
	t.Helper()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(data), cmdline) {
			t.Errorf("process %s (%q) survived its sandbox", e.Name(), data)
		}
	}
}

func TestOutputTruncated(t *testing.T) {
	p := testPolicy()
	p.OutputLimit = 1000
	o := sh(t, p, `head -c 5000000 /dev/zero | tr '\0' a; head -c 3000 /dev/zero | tr '\0' b >&2; echo done >&2`)
	if o.ExitCode != 0 {
		t.Fatalf("exit %d", o.ExitCode)
	}
	if len(o.stdout) != 1000 || !o.StdoutTruncated {
		t.Errorf("stdout %d bytes truncated=%v, want 1000 and true", len(o.stdout), o.StdoutTruncated)
	}
	if len(o.stderr) != 1000 || !o.StderrTruncated {
		t.Errorf("stderr %d bytes truncated=%v", len(o.stderr), o.StderrTruncated)
	}
	o = sh(t, p, "echo small").mustSucceed(t)
	if o.StdoutTruncated || o.stdout != "small\n" {
		t.Errorf("small output: %q truncated=%v", o.stdout, o.StdoutTruncated)
	}
}

func TestDiskLimit(t *testing.T) {
	p := testPolicy()
	p.DiskBytes = 8 << 20
	o := sh(t, p, `dd if=/dev/zero of=/tmp/a bs=1M count=6 2>/dev/null; dd if=/dev/zero of=/home/user/b bs=1M count=6 2>&1 | head -1; echo $(( $(stat -c %s /tmp/a) + $(stat -c %s /home/user/b) ))`)
	lines := strings.Split(strings.TrimSpace(o.stdout), "\n")
	total, _ := strconv.Atoi(lines[len(lines)-1])
	if total > 8<<20 || total < 4<<20 {
		t.Errorf("wrote %d bytes across /tmp and /home/user, want at most the 8 MiB limit (output %q)", total, o.stdout)
	}
	if !strings.Contains(o.stdout+o.stderr, "No space left") && !strings.Contains(o.stdout+o.stderr, "File too large") {
		t.Errorf("no ENOSPC reported: %q %q", o.stdout, o.stderr)
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
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", sb.cmd.Process.Pid))
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
	held := map[int]*os.File{}
	defer func() {
		for _, f := range held {
			f.Close()
		}
	}()
	for range 300 {
		base, f, err := claimIDBase()
		if err != nil {
			t.Fatal(err)
		}
		if _, dup := held[base]; dup {
			t.Fatalf("range %d handed out twice", base)
		}
		held[base] = f
	}
	// A slot held here is locked for any other open file too.
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
		held[base].Close()
		if err := unix.FcntlFlock(other.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
			t.Errorf("slot %d still locked after its release: %v", slot, err)
		}
		other.Close()
		delete(held, base)
		break
	}
}
