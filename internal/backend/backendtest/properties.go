// Package backendtest holds the isolation properties every sandbox
// backend must have, as one table that each backend's tests run.
package backendtest

import (
	"fmt"
	"net"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/policy"
)

// Outcome is what a backend reports of one run.
type Outcome struct {
	ExitCode        int
	Signal          string
	TimedOut        bool
	OOMKilled       bool
	StdoutTruncated bool
	Stdout, Stderr  string
}

// Runner runs a bash script in a fresh sandbox of the backend under test
// and checks that nothing of it remains afterwards.
type Runner func(t *testing.T, p policy.Policy, script string) Outcome

// TestPolicy is the default policy with a timeout that fails a test that
// goes wrong instead of hanging it.
func TestPolicy() policy.Policy {
	p := policy.Default()
	p.Timeout = 60 * time.Second
	return p
}

// pyLoopback tries the host's listener on port, then the sandbox's own
// loopback, then lists the network interfaces.
const pyLoopback = `import socket
try:
    socket.create_connection(("127.0.0.1", %d), timeout=2); print("reached host")
except OSError:
    print("refused")
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
socket.create_connection(s.getsockname()); print("own loopback ok")
print([name for _, name in socket.if_nameindex()])
`

// Accepts counts the connections ln accepts, closing each, until the
// test ends and closes ln.
func Accepts(t testing.TB, ln net.Listener) *atomic.Int32 {
	t.Cleanup(func() { ln.Close() })
	accepted := new(atomic.Int32)
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
	return accepted
}

// HostListener listens on the host's loopback until the test ends and
// counts the connections it accepts: a sandbox must make none.
func HostListener(t *testing.T) (port int, accepted *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted = Accepts(t, ln)
	return ln.Addr().(*net.TCPAddr).Port, accepted
}

// Properties runs the table: each row one property, observed from inside
// the sandbox or from the host.
func Properties(t *testing.T, run Runner) {
	port, accepted := HostListener(t)
	for _, tc := range properties(port) {
		t.Run(tc.name, func(t *testing.T) {
			p := TestPolicy()
			if tc.policy != nil {
				tc.policy(&p)
			}
			tc.check(t, run(t, p, tc.script))
		})
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("the host's loopback listener accepted %d connections from a sandbox", n)
	}
}

// property is a row of the table: a script run under a policy, and what
// must come of it.
type property struct {
	name   string
	policy func(*policy.Policy)
	script string
	check  func(t *testing.T, o Outcome)
}

// properties is the table; port is the host's loopback listener, which
// no sandbox may reach.
func properties(port int) []property {
	return []property{
		{"identity and capabilities", nil, `id -u; id -g; grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs)' /proc/self/status; pwd`, func(t *testing.T, o Outcome) {
			want := "1000\n1000\nNoNewPrivs:\t1\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\n/home/user\n"
			if sortedLines(o.Stdout) != sortedLines(want) {
				t.Errorf("got %q, want %q", o.Stdout, want)
			}
		}},
		{"loopback only: the host's listener is unreachable", nil,
			fmt.Sprintf("python3 -c '%s'", strings.ReplaceAll(fmt.Sprintf(pyLoopback, port), "'", `'"'"'`)), func(t *testing.T, o Outcome) {
				if o.Stdout != "refused\nown loopback ok\n['lo']\n" {
					t.Errorf("got %q %q", o.Stdout, o.Stderr)
				}
			}},
		{"host files invisible, read-only places unwritable", nil,
			`for f in /root /work /var /etc/shadow /boot; do [ -e $f ] && echo "visible $f"; done; ` +
				`touch /usr/x 2>/dev/null && echo "wrote /usr"; (echo x >> /etc/passwd) 2>/dev/null && echo "wrote /etc/passwd"; ` +
				`touch /tmp/ok /home/user/ok && echo writable ok`, func(t *testing.T, o Outcome) {
				if o.Stdout != "writable ok\n" {
					t.Errorf("got %q", o.Stdout)
				}
			}},
		{"Python with numpy", nil, `python3 -c 'import numpy; print(numpy.arange(4).sum())'`, func(t *testing.T, o Outcome) {
			if o.Stdout != "6\n" {
				t.Errorf("got %q %q", o.Stdout, o.Stderr)
			}
		}},
		{"memory limit: an OOM kill is reported", func(p *policy.Policy) { p.MemoryBytes = 64 << 20 },
			`python3 -c 'x = bytearray(256 << 20); print("allocated")'`, func(t *testing.T, o Outcome) {
				if !o.OOMKilled || strings.Contains(o.Stdout, "allocated") {
					t.Errorf("oom_killed %v signal %q stdout %q", o.OOMKilled, o.Signal, o.Stdout)
				}
			}},
		{"the timeout kills a SIGTERM-ignoring, daemonized process", func(p *policy.Policy) { p.Timeout = time.Second },
			`trap '' TERM; (setsid sleep 600 &); sleep 600`, func(t *testing.T, o Outcome) {
				if !o.TimedOut || o.Signal != "SIGKILL" {
					t.Errorf("timed_out %v signal %q", o.TimedOut, o.Signal)
				}
			}},
		// On gVisor these timeouts kill runsc while it is still building
		// the sandbox (it takes ~200 ms): what it had made must go all the
		// same (the runner checks). At 20 and 100 ms runsc had cgroups
		// that nobody removed.
		{"a timeout during start-up (1 ms)", func(p *policy.Policy) { p.Timeout = time.Millisecond }, `sleep 5`, timedOut},
		{"a timeout during start-up (20 ms)", func(p *policy.Policy) { p.Timeout = 20 * time.Millisecond }, `sleep 5`, timedOut},
		{"a timeout during start-up (100 ms)", func(p *policy.Policy) { p.Timeout = 100 * time.Millisecond }, `sleep 5`, timedOut},
		// Contained either way: the namespaces backend lets it run into the
		// timeout; under gVisor the whole sandbox dies when the Sentry can
		// no longer start threads. Nothing outlives it (the runner checks).
		{"a fork bomb is contained", func(p *policy.Policy) { p.Pids = 32; p.Timeout = 3 * time.Second },
			`bomb() { bomb | bomb & }; bomb; sleep 10`, func(t *testing.T, o Outcome) {
				if !o.TimedOut && o.Signal != "SIGKILL" {
					t.Errorf("neither timed out nor killed: exit %d signal %q", o.ExitCode, o.Signal)
				}
			}},
		{"the disk limit", func(p *policy.Policy) { p.DiskBytes = 8 << 20 },
			`dd if=/dev/zero of=/tmp/a bs=1M count=20 2>/dev/null; stat -c %s /tmp/a`, func(t *testing.T, o Outcome) {
				var n int64
				fmt.Sscan(strings.TrimSpace(o.Stdout), &n)
				// ENOSPC, or SIGXFSZ first (RLIMIT_FSIZE is the disk limit
				// too); on gVisor /tmp holds half of it, the home the rest.
				if n > 8<<20 || n < 3<<20 {
					t.Errorf("wrote %d bytes: %q", n, o.Stdout)
				}
			}},
		// tmpfs is memory: a disk limit above the memory limit is bounded
		// below it (policy.WritableBytes), so the writer gets ENOSPC and
		// the sandbox lives on, where an OOM kill would take the largest
		// process, or on gVisor the whole sandbox.
		{"a disk limit above the memory limit: ENOSPC, not an OOM kill", func(p *policy.Policy) { p.MemoryBytes, p.DiskBytes = 256<<20, 1<<30 },
			`dd if=/dev/zero of=/tmp/a bs=1M 2>&1 | grep -o 'No space left'; echo alive`, func(t *testing.T, o Outcome) {
				if o.OOMKilled || o.ExitCode != 0 || o.Stdout != "No space left\nalive\n" {
					t.Errorf("oom_killed %v exit %d signal %q stdout %q stderr %q", o.OOMKilled, o.ExitCode, o.Signal, o.Stdout, o.Stderr)
				}
			}},
		// POSIX semaphores (Python's multiprocessing) live in /dev/shm:
		// the user may write it, within the disk limit (on gVisor runsc's
		// own was root's, and unbounded: filling it killed the sandbox).
		{"/dev/shm: the user's, within the disk limit", func(p *policy.Policy) { p.DiskBytes = 32 << 20 },
			`python3 -c 'import multiprocessing as m; m.Lock(); print("lock")'; for i in $(seq 64); do dd if=/dev/zero of=/dev/shm/a$i bs=1M count=1; done 2>&1 | grep -o -m1 'No space left'; echo alive`, func(t *testing.T, o Outcome) {
				if o.ExitCode != 0 || o.Stdout != "lock\nNo space left\nalive\n" {
					t.Errorf("exit %d signal %q stdout %q stderr %q", o.ExitCode, o.Signal, o.Stdout, o.Stderr)
				}
			}},
		{"output beyond the limit is dropped and reported", func(p *policy.Policy) { p.OutputLimit = 1000 },
			`head -c 1000000 /dev/zero | tr '\0' a`, func(t *testing.T, o Outcome) {
				if len(o.Stdout) != 1000 || !o.StdoutTruncated {
					t.Errorf("%d bytes, truncated=%v", len(o.Stdout), o.StdoutTruncated)
				}
			}},
		{"exit codes", nil, `exit 3`, func(t *testing.T, o Outcome) {
			if o.ExitCode != 3 || o.Signal != "" {
				t.Errorf("exit %d signal %q", o.ExitCode, o.Signal)
			}
		}},
	}
}

func timedOut(t *testing.T, o Outcome) {
	if !o.TimedOut {
		t.Errorf("not timed out: exit %d signal %q", o.ExitCode, o.Signal)
	}
}

func sortedLines(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
