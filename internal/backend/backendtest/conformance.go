package backendtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// Capabilities are what a backend claims beyond what every one must do
// (start a box and hand back its agent, kill it, leave nothing, clean up
// and spare the living). Each field is empty when the backend claims the
// capability, so that a new backend is held to all of them unless its
// test says otherwise; when not, it says why, and the suite says so where
// it leaves the checks out, never silently.
type Capabilities struct {
	// Run: one-shot commands (Backend.Run) under the policy's timeout,
	// their exit codes, signals, output and usage reported.
	Run string
	// Limits: memory (the OOM kill reported), pids and disk enforced.
	Limits string
	// Containment: every process of a box, daemonized or not, ends with it.
	Containment string
	// Pause: Instance.Pause stops the box, Resume restarts it.
	Pause string
	// Usage: Instance.Usage measures what the box uses.
	Usage string
	// CrashCleanup: Cleanup removes what the boxes of a killed process
	// left (Pdeathsig and lock files, say).
	CrashCleanup string
}

// Target is a backend under the suite.
type Target struct {
	// New returns the backend keeping its state in stateDir, in the test
	// and in the suite's crash helper: a child process running the same
	// test, which the suite kills.
	New func(stateDir string) backend.Backend
	// Leftovers lists the host paths (state files, cgroup directories)
	// that boxes of a backend with state in stateDir hold now: none once
	// every box is removed. The suite checks that each is gone when its
	// box is.
	Leftovers func(stateDir string) []string
	Capabilities
}

// Conformance runs the contract of backend.Backend and backend.Instance
// on target: each row a promise of the interfaces' documentation, each
// capability not claimed reported as skipped with the target's reason.
func Conformance(t *testing.T, target Target) {
	if dir := os.Getenv(crashHelperEnv); dir != "" {
		crashHelper(t, target, dir)
		return
	}
	s := &suite{Target: target, stateDir: stateDir(t)}
	s.be = target.New(s.stateDir)
	for _, row := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"Check", s.check},
		{"start and dial", s.startAndDial},
		{"exit codes and signals", s.exitCodes},
		{"files through the agent", s.files},
		{"usage", s.usage},
		{"kill leaves nothing", s.kill},
		{"a paused box pauses, resumes and dies", s.pause},
		{"limits through the agent", s.agentLimits},
		{"Cleanup spares the living", s.cleanupSpares},
		{"cleanup after a crash", s.crashCleanup},
		{"one-shot runs", s.oneShot},
	} {
		t.Run(row.name, row.run)
	}
	s.noLeftovers(t, "after the suite")
}

// suite is one run of Conformance: a backend with a state directory of
// its own.
type suite struct {
	Target
	stateDir string
	be       backend.Backend
}

// stateDir is a new, short state directory (a unix socket's path has at
// most 107 bytes), removed with what is left in it once the suite ends,
// unless something is still mounted there.
func stateDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "airlock-bt-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if mounts := mountsUnder(dir); len(mounts) > 0 {
			t.Errorf("mounts under the state directory, left there: %v", mounts)
			return
		}
		os.RemoveAll(dir)
	})
	return dir
}

// mountsUnder lists the mount points under dir, in this mount namespace.
func mountsUnder(dir string) []string {
	data, _ := os.ReadFile("/proc/self/mountinfo")
	var found []string
	for line := range strings.Lines(string(data)) {
		if f := strings.Fields(line); len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			found = append(found, f[4])
		}
	}
	return found
}

// claims skips t, saying why, unless the target claims the capability.
func (s *suite) claims(t *testing.T, capability, why string) {
	t.Helper()
	if why != "" {
		t.Skipf("%s does not claim %s: %s", s.be.Name(), capability, why)
	}
}

// start starts a box under p, killed and removed when the test ends.
func (s *suite) start(t *testing.T, p policy.Policy) backend.Instance {
	t.Helper()
	inst, err := s.be.Start(t.Context(), p, nil)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		inst.Kill(context.Background())
		inst.Wait()
	})
	if err := health(t.Context(), inst); err != nil {
		t.Fatalf("the agent of a new box: %v", err)
	}
	return inst
}

// noLeftovers fails t if any box of the suite's state directory left
// something on the host.
func (s *suite) noLeftovers(t *testing.T, when string) {
	t.Helper()
	if left := s.Leftovers(s.stateDir); len(left) > 0 {
		t.Errorf("%s, left on the host: %v", when, left)
	}
	if mounts := mountsUnder(s.stateDir); len(mounts) > 0 {
		t.Errorf("%s, mounts left on the host: %v", when, mounts)
	}
}

// gone fails t unless every path is gone.
func gone(t *testing.T, when string, paths []string) {
	t.Helper()
	for _, p := range paths {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s, %s remains (%v)", when, p, err)
		}
	}
}

// Check accepts a runnable spec and refuses what no backend can run.
func (s *suite) check(t *testing.T) {
	ok := &backend.Spec{Policy: TestPolicy(), Argv: []string{"/bin/true"}, Files: []backend.File{{Name: "main.py", Data: []byte("1")}}}
	if err := s.be.Check(ok); err != nil {
		t.Errorf("Check of a runnable spec: %v", err)
	}
	bad := TestPolicy()
	bad.MemoryBytes = -1
	for name, spec := range map[string]*backend.Spec{
		"no command":         {Policy: TestPolicy()},
		"a path as its file": {Policy: TestPolicy(), Argv: []string{"x"}, Files: []backend.File{{Name: "../x", Data: nil}}},
		"an invalid policy":  {Policy: bad, Argv: []string{"x"}},
	} {
		if err := s.be.Check(spec); err == nil {
			t.Errorf("Check accepts %s", name)
		}
	}
}

// A box serves its agent on every connection Dial makes, at once and
// side by side.
func (s *suite) startAndDial(t *testing.T) {
	inst := s.start(t, TestPolicy())
	a, err := inst.Dial(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := inst.Dial(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// Asked in one order, read in the other: neither waits for the other.
	for i, c := range []net.Conn{b, a} {
		if _, err := c.Write([]byte("GET /health HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}
	for i, c := range []net.Conn{a, b} {
		buf := make([]byte, 12)
		n, _ := io.ReadFull(c, buf)
		if got := string(buf[:n]); got != "HTTP/1.1 204" {
			t.Errorf("connection %d answered %q", i, got)
		}
	}
	select {
	case <-inst.Done():
		t.Error("Done is closed while the box runs")
	default:
	}
}

// Commands end with their own exit codes and signals, and the box lives
// on after each.
func (s *suite) exitCodes(t *testing.T) {
	inst := s.start(t, TestPolicy())
	for _, tc := range []struct {
		script string
		code   int
		exited bool
		status string
	}{
		{"echo out; echo err >&2; exit 0", 0, true, "exit status 0"},
		{"exit 3", 3, true, "exit status 3"},
		{"kill -TERM $$", -1, false, "signal: terminated"},
		{"kill -KILL $$", -1, false, "signal: killed"},
	} {
		e := command(t, inst, tc.script)
		if e.code != tc.code || e.exited != tc.exited || e.status != tc.status {
			t.Errorf("%q: code %d exited %v status %q, want %d %v %q", tc.script, e.code, e.exited, e.status, tc.code, tc.exited, tc.status)
		}
		if tc.code == 0 && (e.stdout != "out\n" || e.stderr != "err\n") {
			t.Errorf("%q: stdout %q stderr %q", tc.script, e.stdout, e.stderr)
		}
	}
	if err := health(t.Context(), inst); err != nil {
		t.Errorf("after the commands: %v", err)
	}
}

// Files go in and come out whole, in the user's home, the commands'
// working directory, and show in its listing; a missing file is the
// agent's error.
func (s *suite) files(t *testing.T) {
	inst := s.start(t, TestPolicy())
	data := make([]byte, 256<<10)
	rand.Read(data)
	if err := writeFile(t.Context(), inst, "conformance/data.bin", bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	got, err := readFile(t.Context(), inst, "conformance/data.bin")
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes (%v), wrote %d", len(got), err, len(data))
	}
	entries, err := listDir(t.Context(), inst, "conformance")
	if err != nil || len(entries) != 1 || entries[0].Name != "data.bin" || int(entries[0].Size) != len(data) {
		t.Errorf("listing %v %v", entries, err)
	}
	if e := command(t, inst, "wc -c < conformance/data.bin"); strings.TrimSpace(e.stdout) != "262144" {
		t.Errorf("the box's commands see %q %q", e.stdout, e.stderr)
	}
	var agentErr *agentproto.Error
	if _, err := readFile(t.Context(), inst, "conformance/missing"); !errors.As(err, &agentErr) {
		t.Errorf("reading a missing file: %v, want the agent's error", err)
	}
}

// Usage answers while the box runs; a backend that measures reports the
// memory its agent uses, and the disk, where it measures that, grows with
// a file written.
func (s *suite) usage(t *testing.T) {
	inst := s.start(t, TestPolicy())
	u, err := inst.Usage(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	s.claims(t, "usage", s.Capabilities.Usage)
	if u.Memory <= 0 || u.Memory > TestPolicy().MemoryBytes {
		t.Errorf("memory %d of a box with an idle agent", u.Memory)
	}
	if u.Cache < 0 || u.Cache > u.Memory {
		t.Errorf("page cache %d of %d bytes in use", u.Cache, u.Memory)
	}
	if !u.DiskMeasured {
		return
	}
	// What the host measures of the disk follows what the box writes.
	const size = 4 << 20
	if err := writeFile(t.Context(), inst, "/tmp/fill", bytes.NewReader(make([]byte, size))); err != nil {
		t.Fatal(err)
	}
	after, err := inst.Usage(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !after.DiskMeasured || after.Disk-u.Disk < size {
		t.Errorf("disk %d bytes, then %d after writing %d (measured: %v)", u.Disk, after.Disk, size, after.DiskMeasured)
	}
}

// Kill ends the box without waiting; Wait removes all of it; nothing of
// it answers afterwards. A backend that contains its boxes takes a
// process that ignores SIGTERM and left the session with it.
func (s *suite) kill(t *testing.T) {
	inst := s.start(t, TestPolicy())
	held := s.Leftovers(s.stateDir)
	if len(held) == 0 {
		t.Error("a running box holds nothing Leftovers lists: the check below could not fail")
	}
	if s.Containment == "" {
		command(t, inst, "trap '' TERM; (setsid sleep 600 &) ; exit 0")
	}
	if err := inst.Kill(t.Context()); err != nil {
		t.Errorf("Kill: %v", err)
	}
	<-inst.Done()
	if err := inst.Wait(); err != nil {
		t.Errorf("Wait: %v", err)
	}
	if err := inst.Wait(); err != nil {
		t.Errorf("a second Wait: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if c, err := inst.Dial(ctx); err == nil {
		c.Close()
		t.Error("Dial reaches a killed box")
	}
	gone(t, "after Kill and Wait", held)
	s.noLeftovers(t, "after Kill and Wait")
	if s.Containment != "" {
		t.Logf("%s does not claim containment: %s", s.be.Name(), s.Containment)
	}
}

// A paused box answers nothing until resumed; then the request made
// meanwhile is answered. A paused box dies of Kill.
func (s *suite) pause(t *testing.T) {
	s.claims(t, "pause", s.Pause)
	inst := s.start(t, TestPolicy())
	if err := inst.Pause(t.Context()); err != nil {
		t.Fatal(err)
	}
	answered := make(chan error, 1)
	go func() { answered <- health(t.Context(), inst) }()
	// A frozen box cannot answer; one that answers within this bound is
	// not frozen. (A slow host can only make this pass.)
	select {
	case err := <-answered:
		t.Fatalf("a paused box answered: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := inst.Resume(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := <-answered; err != nil {
		t.Errorf("the request made while paused, after Resume: %v", err)
	}
	if err := inst.Pause(t.Context()); err != nil {
		t.Fatal(err)
	}
	held := s.Leftovers(s.stateDir)
	if err := inst.Kill(t.Context()); err != nil {
		t.Errorf("Kill of a paused box: %v", err)
	}
	<-inst.Done()
	if err := inst.Wait(); err != nil {
		t.Errorf("Wait of a paused box: %v", err)
	}
	gone(t, "after a paused box's Kill and Wait", held)
}

// Limits hold for what the agent starts, and the agent, which keeps a
// reserve of tasks (agentproto.AgentTasks, where the limit has room for
// it), serves on past them.
func (s *suite) agentLimits(t *testing.T) {
	s.claims(t, "limits", s.Limits)
	p := TestPolicy()
	p.Pids = 3 * agentproto.AgentTasks
	p.DiskBytes = 8 << 20
	inst := s.start(t, p)
	t.Run("pids", func(t *testing.T) {
		e := command(t, inst, `exec python3 -c '
import os, signal
n = 0
try:
    while n < 1000:
        if os.fork() == 0:
            signal.pause()
            os._exit(0)
        n += 1
except OSError as e:
    print("refused after", n)
'`)
		var n int
		if _, err := fmt.Sscanf(e.stdout, "refused after %d", &n); err != nil || n >= int(p.Pids) {
			t.Errorf("forks: %q %q, want a refusal within %d", e.stdout, e.stderr, p.Pids)
		}
		if err := health(t.Context(), inst); err != nil {
			t.Errorf("the agent past the pids limit: %v", err)
		}
	})
	t.Run("disk", func(t *testing.T) {
		err := writeFile(t.Context(), inst, "big", bytes.NewReader(make([]byte, 2*p.DiskBytes)))
		if err == nil {
			t.Error("wrote twice the disk limit")
		}
		if err := health(t.Context(), inst); err != nil {
			t.Errorf("the agent past the disk limit: %v", err)
		}
	})
}

// Cleanup, as a new process of the same state directory runs it at its
// start, leaves the boxes of live processes alone.
func (s *suite) cleanupSpares(t *testing.T) {
	inst := s.start(t, TestPolicy())
	held := s.Leftovers(s.stateDir)
	if err := s.New(s.stateDir).Cleanup(t.Context()); err != nil {
		t.Errorf("Cleanup: %v", err)
	}
	if err := health(t.Context(), inst); err != nil {
		t.Errorf("a live box after Cleanup: %v", err)
	}
	if left := s.Leftovers(s.stateDir); !slices.Equal(left, held) {
		t.Errorf("Cleanup took a live box's %v", held)
	}
}

// Entries lists the paths of what dir holds, for a Leftovers: none if
// it does not exist.
func Entries(dir string) []string {
	entries, _ := os.ReadDir(dir)
	var paths []string
	for _, e := range entries {
		paths = append(paths, filepath.Join(dir, e.Name()))
	}
	return paths
}
