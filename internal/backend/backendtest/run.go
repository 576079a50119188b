package backendtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// The contract of Backend.Run: what came of a command is its result,
// whatever it was; an error is the backend's own failure, or the
// caller's cancellation.

// oneShot is the suite's row of one-shot runs.
func (s *suite) oneShot(t *testing.T) {
	if s.Capabilities.Run != "" {
		// A backend without one-shot runs says so; it does not pretend.
		if _, err := s.be.Run(t.Context(), &backend.Spec{Policy: TestPolicy(), Argv: []string{"/bin/true"}}); err == nil {
			t.Error("Run succeeded on a backend that claims no one-shot runs")
		}
		s.claims(t, "one-shot runs", s.Capabilities.Run)
	}
	for _, row := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"exit codes and output", s.runExit},
		{"signals", s.runSignal},
		{"stdin and code files", s.runInput},
		{"output beyond the limit", s.runOutputLimit},
		{"CPU and memory measured", s.runUsage},
		{"the timeout", s.runTimeout},
		{"a canceled context", s.runCancel},
		{"limits", s.runLimits},
	} {
		t.Run(row.name, func(t *testing.T) {
			row.run(t)
			s.noLeftovers(t, "after the run")
		})
	}
}

// run runs spec, its output in buffers, and fails t on an error.
func (s *suite) run(t *testing.T, spec *backend.Spec) (res *backend.Result, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	spec.Stdout, spec.Stderr = &out, &errOut
	res, err := s.be.Run(t.Context(), spec)
	if err != nil {
		t.Fatalf("Run(%q): %v", spec.Argv, err)
	}
	return res, out.String(), errOut.String()
}

func sh(p policy.Policy, script string) *backend.Spec {
	return &backend.Spec{Policy: p, Argv: []string{"/bin/sh", "-c", script}}
}

func (s *suite) runExit(t *testing.T) {
	res, out, errOut := s.run(t, sh(TestPolicy(), "echo out; echo err >&2; exit 3"))
	if res.ExitCode != 3 || res.Signal != "" || res.TimedOut || res.OOMKilled || out != "out\n" || errOut != "err\n" {
		t.Errorf("result %+v, stdout %q, stderr %q", res, out, errOut)
	}
	if res.Duration <= 0 || res.StdoutTruncated || res.StderrTruncated {
		t.Errorf("duration %v, truncated %v %v", res.Duration, res.StdoutTruncated, res.StderrTruncated)
	}
}

func (s *suite) runSignal(t *testing.T) {
	for sig, script := range map[string]string{"SIGTERM": "kill -TERM $$", "SIGSEGV": "kill -SEGV $$"} {
		if res, _, _ := s.run(t, sh(TestPolicy(), script)); res.ExitCode != -1 || res.Signal != sig || res.OOMKilled || res.TimedOut {
			t.Errorf("%q: result %+v, want signal %s", script, res, sig)
		}
	}
}

func (s *suite) runInput(t *testing.T) {
	spec := &backend.Spec{Policy: TestPolicy(), Argv: []string{"/bin/sh", layout.CodePath("main.sh")},
		Files: []backend.File{{Name: "main.sh", Data: []byte("read line; echo \"got $line\"; if touch $0 2>/dev/null; then echo writable; fi")}},
		Stdin: strings.NewReader("hello\n")}
	if res, out, _ := s.run(t, spec); res.ExitCode != 0 || out != "got hello\n" {
		t.Errorf("exit %d, stdout %q: want the code file run, stdin read, the file read-only", res.ExitCode, out)
	}
}

func (s *suite) runOutputLimit(t *testing.T) {
	p := TestPolicy()
	p.OutputLimit = 1000
	res, out, errOut := s.run(t, sh(p, "head -c 100000 /dev/zero | tr '\\0' a; echo err >&2"))
	if len(out) != 1000 || !res.StdoutTruncated || res.StderrTruncated || errOut != "err\n" || res.ExitCode != 0 {
		t.Errorf("%d bytes out, truncated %v %v, stderr %q, exit %d", len(out), res.StdoutTruncated, res.StderrTruncated, errOut, res.ExitCode)
	}
}

func (s *suite) runUsage(t *testing.T) {
	res, _, errOut := s.run(t, &backend.Spec{Policy: TestPolicy(), Argv: []string{"python3", "-c", "x = b\"x\" * (32 << 20); print(sum(range(3_000_000)))"}})
	if res.ExitCode != 0 || res.CPU <= 0 || res.MaxMemoryBytes < 32<<20 {
		t.Errorf("exit %d (%q), CPU %v, max memory %d: want the work measured", res.ExitCode, errOut, res.CPU, res.MaxMemoryBytes)
	}
}

// The timeout kills the whole box, a process ignoring SIGTERM included.
func (s *suite) runTimeout(t *testing.T) {
	p := TestPolicy()
	p.Timeout = time.Second
	res, _, _ := s.run(t, sh(p, "trap '' TERM; sleep 600"))
	if !res.TimedOut || res.ExitCode != -1 || res.Signal != "SIGKILL" || res.OOMKilled {
		t.Errorf("result %+v, want timed out by SIGKILL", res)
	}
}

// cancelOnWrite cancels at the first output.
type cancelOnWrite struct {
	once   sync.Once
	cancel context.CancelFunc
}

func (w *cancelOnWrite) Write(p []byte) (int, error) {
	w.once.Do(w.cancel)
	return len(p), nil
}

// A canceled context kills the box like the timeout, but is reported
// as the caller's error.
func (s *suite) runCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	spec := sh(TestPolicy(), "echo running; sleep 600")
	spec.Stdout, spec.Stderr = &cancelOnWrite{cancel: cancel}, &bytes.Buffer{}
	if res, err := s.be.Run(ctx, spec); !errors.Is(err, context.Canceled) {
		t.Errorf("Run: %+v, %v; want context.Canceled", res, err)
	}
}

// The memory limit's OOM kill is reported as such; pids and disk refuse
// what is beyond them, and the command lives on to say so.
func (s *suite) runLimits(t *testing.T) {
	s.claims(t, "limits", s.Limits)
	p := TestPolicy()
	p.MemoryBytes = 64 << 20
	res, out, _ := s.run(t, &backend.Spec{Policy: p, Argv: []string{"python3", "-c", "x = bytearray(256 << 20); print('allocated')"}})
	if !res.OOMKilled || res.Signal != "SIGKILL" || out != "" {
		t.Errorf("memory: result %+v, stdout %q: want an OOM kill reported", res, out)
	}
	p = TestPolicy()
	p.Pids = 16
	res, out, _ = s.run(t, &backend.Spec{Policy: p, Argv: []string{"python3", "-c", `
import os, signal
n = 0
try:
    while n < 1000:
        if os.fork() == 0:
            signal.pause()
            os._exit(0)
        n += 1
except OSError:
    print("refused after", n)
`}})
	var n int
	if _, err := fmt.Sscanf(out, "refused after %d", &n); err != nil || n >= int(p.Pids) || res.ExitCode != 0 {
		t.Errorf("pids: result %+v, stdout %q: want forks refused within %d", res, out, p.Pids)
	}
	p = TestPolicy()
	p.DiskBytes = 8 << 20
	res, out, _ = s.run(t, &backend.Spec{Policy: p, Argv: []string{"python3", "-c", `
import os
n = 0
try:
    with open(os.path.expanduser("~/fill"), "wb") as f:
        while n < 64 << 20:
            f.write(b"x" * 65536); f.flush(); n += 65536
except OSError:
    print("refused after", n)
`}})
	if _, err := fmt.Sscanf(out, "refused after %d", &n); err != nil || n > int(p.DiskBytes) || res.ExitCode != 0 {
		t.Errorf("disk: result %+v, stdout %q: want writes refused within %d bytes", res, out, p.DiskBytes)
	}
}
