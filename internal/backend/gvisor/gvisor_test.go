package gvisor

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/airlocktest"
	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/backend/backendtest"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// testBackend finds runsc for the tests; make test builds it and sets
// AIRLOCK_RUNSC, so in CI these tests always run.
func testBackend(t testing.TB) *Backend {
	t.Helper()
	airlocktest.RequiresRoot(t)
	p, err := FindRunsc("")
	if err != nil {
		t.Skipf("gVisor tests need runsc (make test builds it): %v", err)
	}
	return New(p, DefaultStateDir, slog.New(slog.DiscardHandler))
}

type outcome struct {
	*backend.Result
	stdout, stderr string
}

func sh(t *testing.T, p policy.Policy, script string) outcome {
	t.Helper()
	b := testBackend(t)
	var stdout, stderr bytes.Buffer
	spec := &backend.Spec{Policy: p, Argv: []string{"/bin/bash", "-c", script}, Stdout: &stdout, Stderr: &stderr}
	res, err := b.Run(t.Context(), spec)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	checkNoLeftovers(t)
	return outcome{res, stdout.String(), stderr.String()}
}

func checkNoLeftovers(t *testing.T) {
	t.Helper()
	if b, _ := os.ReadDir(filepath.Join(DefaultStateDir, "bundles")); len(b) > 0 {
		t.Errorf("bundles left behind: %d", len(b))
	}
	if cg := airlocktest.Cgroups(); len(cg) > 0 {
		t.Errorf("cgroups left behind: %v", cg)
	}
	if m := airlocktest.MountsUnder(DefaultStateDir); len(m) > 0 {
		t.Errorf("mounts under %s left on the host: %v", DefaultStateDir, m)
	}
	if out, _ := exec.Command("pgrep", "-f", "runsc-sandbox").Output(); len(out) > 0 {
		t.Errorf("gVisor sandbox processes left: %s", out)
	}
}

// The properties every backend must have, on gVisor.
func TestIsolationProperties(t *testing.T) {
	testBackend(t)
	backendtest.Properties(t, func(t *testing.T, p policy.Policy, script string) backendtest.Outcome {
		o := sh(t, p, script)
		return backendtest.Outcome{ExitCode: o.ExitCode, Signal: o.Signal, TimedOut: o.TimedOut, OOMKilled: o.OOMKilled,
			StdoutTruncated: o.StdoutTruncated, Stdout: o.stdout, Stderr: o.stderr}
	})
}

func TestTheKernelIsGVisors(t *testing.T) {
	o := sh(t, backendtest.TestPolicy(), `uname -r; cat /proc/version`)
	if !strings.Contains(o.stdout, "gvisor") {
		t.Errorf("kernel %q is not gVisor's", o.stdout)
	}
}

func TestFindRunscRefusesDynamicBinaries(t *testing.T) {
	if _, err := FindRunsc("/bin/ls"); err == nil || !strings.Contains(err.Error(), "dynamically linked") {
		t.Errorf("FindRunsc(/bin/ls) = %v, want a refusal naming dynamic linking", err)
	}
	if _, err := FindRunsc("/nonexistent/runsc"); err == nil {
		t.Error("FindRunsc of a missing file succeeded")
	}
}

// A bundle whose maker died while making it (its lock still under its
// first name) is removed by the next Cleanup at once; one whose lock is
// held is not.
func TestCleanupRemovesHalfMadeBundles(t *testing.T) {
	b := stateBackend(t)
	dead := filepath.Join(b.stateDir, "bundles", "0123456789abcdef")
	live := filepath.Join(b.stateDir, "bundles", "fedcba9876543210")
	for _, d := range []string{dead, live} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "lock.new"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	held, err := os.OpenFile(filepath.Join(live, "lock.new"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := unix.Flock(int(held.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if err := b.Cleanup(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("the dead maker's bundle is still there: %v", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("the live maker's bundle was removed: %v", err)
	}
}

// Host mounts reach the sandbox as clones of their trees mounted in the
// bundle (userMounts): read-only, read-write and a single file, and
// nothing of them stays mounted, nor is anything of the host's removed,
// once the sandbox is gone.
func TestHostMounts(t *testing.T) {
	dir := t.TempDir()
	ro, rw, file := filepath.Join(dir, "ro"), filepath.Join(dir, "rw"), filepath.Join(dir, "file")
	for _, d := range []string{ro, rw} {
		if err := os.Mkdir(d, 0o777); err != nil {
			t.Fatal(err)
		}
		os.Chmod(d, 0o777)
	}
	os.WriteFile(filepath.Join(ro, "in.txt"), []byte("data"), 0o644)
	os.WriteFile(file, []byte("one file"), 0o644)
	p := backendtest.TestPolicy()
	p.Mounts = []policy.Mount{{Source: ro, Target: "/data", ReadOnly: true}, {Source: rw, Target: "/out"}, {Source: file, Target: "/one.txt", ReadOnly: true}}
	o := sh(t, p, `cat /data/in.txt; echo; cat /one.txt; echo; touch /data/x 2>/dev/null && echo "wrote ro"; echo result > /out/r.txt`)
	if o.ExitCode != 0 || o.stdout != "data\none file\n" {
		t.Errorf("got %d %q (stderr %q)", o.ExitCode, o.stdout, o.stderr)
	}
	if got, _ := os.ReadFile(filepath.Join(rw, "r.txt")); string(got) != "result\n" {
		t.Errorf("rw mount: host sees %q", got)
	}
	if got, _ := os.ReadFile(filepath.Join(ro, "in.txt")); string(got) != "data" {
		t.Errorf("the ro mount's file after the sandbox: %q", got)
	}
}

// TestRunscEnvironment: runsc, and the host processes it starts for the
// sandbox (gofer, sandbox), get none of the daemon's environment, which
// holds the API key.
func TestRunscEnvironment(t *testing.T) {
	b := testBackend(t)
	secret := fmt.Sprintf("canary-%d-%d", os.Getpid(), time.Now().UnixNano())
	t.Setenv("AIRLOCK_API_KEY", "e2b_"+secret)
	t.Setenv("AIRLOCK_TEST_CANARY", secret)
	ready := make(chan struct{})
	// The sandbox waits for its input to end: closing it ends the
	// sandbox as a command ends, and Run cleans up as usual.
	stdin, release := io.Pipe()
	defer release.Close()
	done := make(chan error, 1)
	go func() {
		spec := &backend.Spec{Policy: backendtest.TestPolicy(), Argv: []string{"/bin/sh", "-c", "echo ready; read x"},
			Stdin: stdin, Stdout: &readyWriter{ready: ready}, Stderr: io.Discard}
		_, err := b.Run(t.Context(), spec)
		done <- err
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("the sandbox ended before it was ready: %v", err)
	}
	runscs := 0
	for _, pid := range descendants(os.Getpid()) {
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			continue // it exited meanwhile
		}
		if strings.Contains(string(env), secret) {
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			t.Errorf("process %d (%s) has the daemon's environment", pid, bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}))
		}
		if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); strings.Contains(exe, "runsc") {
			runscs++
		}
	}
	if runscs < 2 {
		t.Errorf("found %d runsc processes below the test, want runsc and its sandbox at least", runscs)
	}
	release.Close()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	checkNoLeftovers(t)
}

// readyWriter closes ready at the first write.
type readyWriter struct {
	once  sync.Once
	ready chan struct{}
}

func (w *readyWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.ready) })
	return len(p), nil
}

// descendants are the pids of pid's descendants, from /proc.
func descendants(pid int) []int {
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			continue
		}
		// The fields after the command name, which may hold spaces and
		// parentheses: state, then the parent's pid.
		rest := stat[bytes.LastIndexByte(stat, ')')+1:]
		var state string
		var ppid int
		if _, err := fmt.Sscan(string(rest), &state, &ppid); err == nil {
			children[ppid] = append(children[ppid], p)
		}
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		out = append(out, children[p]...)
		queue = append(queue, children[p]...)
	}
	return out
}
