package namespaces

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Seccomp, the limits and the timeout, observed from inside a sandbox.

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
