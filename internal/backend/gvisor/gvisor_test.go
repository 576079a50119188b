package gvisor

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/airlocktest"
	"github.com/airlock-sandbox/airlock/internal/backend/namespaces"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// runscPath finds runsc for the tests; make test builds it and sets
// AIRLOCK_RUNSC, so in CI these tests always run.
func runscPath(t *testing.T) string {
	t.Helper()
	airlocktest.RequiresRoot(t)
	p, err := FindRunsc("")
	if err != nil {
		t.Skipf("gVisor tests need runsc (make test builds it): %v", err)
	}
	return p
}

type outcome struct {
	*namespaces.Result
	stdout, stderr string
}

func sh(t *testing.T, p policy.Policy, script string) outcome {
	t.Helper()
	runsc := runscPath(t)
	var stdout, stderr bytes.Buffer
	spec := &namespaces.Spec{Policy: p, Argv: []string{"/bin/bash", "-c", script}, Stdout: &stdout, Stderr: &stderr}
	res, err := Run(t.Context(), runsc, spec)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	checkNoLeftovers(t)
	return outcome{res, stdout.String(), stderr.String()}
}

func checkNoLeftovers(t *testing.T) {
	t.Helper()
	if b, _ := os.ReadDir(filepath.Join(StateDir, "bundles")); len(b) > 0 {
		t.Errorf("bundles left behind: %d", len(b))
	}
	if cg := airlocktest.Cgroups(); len(cg) > 0 {
		t.Errorf("cgroups left behind: %v", cg)
	}
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), StateDir) {
		t.Errorf("mounts under %s left on the host", StateDir)
	}
	if out, _ := exec.Command("pgrep", "-f", "runsc-sandbox").Output(); len(out) > 0 {
		t.Errorf("gVisor sandbox processes left: %s", out)
	}
}

func testPolicy() policy.Policy {
	p := policy.Default()
	p.Timeout = 60 * time.Second
	return p
}

// pyLoopback tries the host's listener on port, then the sandbox's own
// loopback.
const pyLoopback = `import socket
try:
    socket.create_connection(("127.0.0.1", %d), timeout=2); print("reached host")
except OSError:
    print("refused")
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
socket.create_connection(s.getsockname()); print("own loopback ok")
print([name for _, name in socket.if_nameindex()])
`

// The properties the namespaces backend is tested for, on gVisor: one
// table, each row one property observed from inside or outside.
func TestIsolationProperties(t *testing.T) {
	runscPath(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	for _, tc := range []struct {
		name   string
		policy func(*policy.Policy)
		script string
		check  func(t *testing.T, o outcome)
	}{
		{"identity and capabilities", nil, `id -u; id -g; grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs)' /proc/self/status; pwd`, func(t *testing.T, o outcome) {
			want := "1000\n1000\nNoNewPrivs:\t1\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\n/home/user\n"
			if sortedLines(o.stdout) != sortedLines(want) {
				t.Errorf("got %q, want %q", o.stdout, want)
			}
		}},
		{"the kernel is gVisor's", nil, `uname -r; cat /proc/version`, func(t *testing.T, o outcome) {
			if !strings.Contains(o.stdout, "gvisor") {
				t.Errorf("kernel %q is not gVisor's", o.stdout)
			}
		}},
		{"loopback only", nil, fmt.Sprintf("python3 -c '%s'", strings.ReplaceAll(fmt.Sprintf(pyLoopback, port), "'", `'"'"'`)), func(t *testing.T, o outcome) {
			if o.stdout != "refused\nown loopback ok\n['lo']\n" {
				t.Errorf("got %q %q", o.stdout, o.stderr)
			}
		}},
		{"host files invisible, read-only places unwritable", nil,
			`for f in /root /work /var /etc/shadow /boot; do [ -e $f ] && echo "visible $f"; done; ` +
				`touch /usr/x 2>/dev/null && echo "wrote /usr"; (echo x >> /etc/passwd) 2>/dev/null && echo "wrote /etc/passwd"; ` +
				`touch /tmp/ok /home/user/ok && echo writable ok`, func(t *testing.T, o outcome) {
				if o.stdout != "writable ok\n" {
					t.Errorf("got %q", o.stdout)
				}
			}},
		{"Python with numpy", nil, `python3 -c 'import numpy; print(numpy.arange(4).sum())'`, func(t *testing.T, o outcome) {
			if o.stdout != "6\n" {
				t.Errorf("got %q %q", o.stdout, o.stderr)
			}
		}},
		{"memory limit: an OOM kill reported", func(p *policy.Policy) { p.MemoryBytes = 64 << 20 },
			`python3 -c 'x = bytearray(256 << 20); print("allocated")'`, func(t *testing.T, o outcome) {
				if !o.OOMKilled || strings.Contains(o.stdout, "allocated") {
					t.Errorf("oom_killed %v signal %q stdout %q", o.OOMKilled, o.Signal, o.stdout)
				}
			}},
		{"timeout kills a SIGTERM-ignoring, daemonized process", func(p *policy.Policy) { p.Timeout = time.Second },
			`trap '' TERM; (setsid sleep 600 &); sleep 600`, func(t *testing.T, o outcome) {
				if !o.TimedOut || o.Signal != "SIGKILL" {
					t.Errorf("timed_out %v signal %q", o.TimedOut, o.Signal)
				}
			}},
		{"disk limit", func(p *policy.Policy) { p.DiskBytes = 8 << 20 },
			`dd if=/dev/zero of=/tmp/a bs=1M count=20 2>&1 | head -1; stat -c %s /tmp/a`, func(t *testing.T, o outcome) {
				lines := strings.Split(strings.TrimSpace(o.stdout), "\n")
				var n int64
				fmt.Sscan(lines[len(lines)-1], &n)
				// ENOSPC or SIGXFSZ (RLIMIT_FSIZE is the disk limit too).
				if n > 8<<20 || n < 4<<20 {
					t.Errorf("wrote %d bytes: %q", n, o.stdout)
				}
			}},
		{"output truncated", func(p *policy.Policy) { p.OutputLimit = 1000 },
			`head -c 1000000 /dev/zero | tr '\0' a`, func(t *testing.T, o outcome) {
				if len(o.stdout) != 1000 || !o.StdoutTruncated {
					t.Errorf("%d bytes, truncated=%v", len(o.stdout), o.StdoutTruncated)
				}
			}},
		{"exit codes", nil, `exit 3`, func(t *testing.T, o outcome) {
			if o.ExitCode != 3 || o.Signal != "" {
				t.Errorf("exit %d signal %q", o.ExitCode, o.Signal)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := testPolicy()
			if tc.policy != nil {
				tc.policy(&p)
			}
			tc.check(t, sh(t, p, tc.script))
		})
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("the host's loopback listener accepted %d connections from a sandbox", n)
	}
}

func sortedLines(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func TestFindRunscRefusesDynamicBinaries(t *testing.T) {
	if _, err := FindRunsc("/bin/ls"); err == nil || !strings.Contains(err.Error(), "dynamically linked") {
		t.Errorf("FindRunsc(/bin/ls) = %v, want a refusal naming dynamic linking", err)
	}
	if _, err := FindRunsc("/nonexistent/runsc"); err == nil {
		t.Error("FindRunsc of a missing file succeeded")
	}
}
