package gvisor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/backend"
)

// Run executes spec in a new gVisor sandbox under its policy's timeout and
// removes the sandbox before returning.
func (be *Backend) Run(ctx context.Context, spec *backend.Spec) (res *backend.Result, err error) {
	if err := be.Check(spec); err != nil {
		return nil, err
	}
	if err := be.Cleanup(ctx); err != nil {
		return nil, fmt.Errorf("cleanup of earlier sandboxes: %w", err)
	}
	if err := backend.CheckNetNS(&spec.Policy, spec.NetNS); err != nil {
		return nil, err
	}
	runsc := be.runsc
	b, err := be.newBundle(&spec.Policy)
	if err != nil {
		return nil, err
	}
	b.netns = spec.NetNS
	defer func() {
		// Whatever happened, nothing of the sandbox may outlive it.
		if rerr := b.remove(runsc); rerr != nil && err == nil {
			res, err = nil, fmt.Errorf("remove sandbox: %w", rerr)
		}
	}()
	if err := be.writeBundle(b, spec); err != nil {
		return nil, err
	}
	p := &spec.Policy
	// One `runsc run`, attached: runsc is the sandbox's parent, so it learns
	// the exit status even when the sandbox is gone before anyone could ask
	// (create + start + wait lost it for a command as quick as `exit 3`),
	// and it is one runsc start instead of four. runsc deletes the
	// container when it ends, but not the cgroup Airlock made, which keeps
	// the memory and OOM counters until they are read.
	run := b.runsc(runsc, append([]string{"--log-fd", "3"}, b.runFlags()...), "run", "--bundle", b.dir, b.id)
	stdout := backend.NewCappedWriter(spec.Stdout, p.OutputLimit)
	stderr := backend.NewCappedWriter(spec.Stderr, p.OutputLimit)
	run.Stdout, run.Stderr = stdout, stderr
	if spec.Stdin != nil {
		run.Stdin = struct{ io.Reader }{spec.Stdin} // a pipe, never a terminal
	}
	failure := &runscFailure{}
	errW, err := failure.pipe()
	if err != nil {
		return nil, err
	}
	run.ExtraFiles = []*os.File{errW}
	// Killing runsc kills the sandbox: runsc gives an attached sandbox and
	// its gofer Pdeathsig. The output pipes close with them; WaitDelay
	// bounds the wait for them all the same.
	run.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	run.WaitDelay = 2 * time.Second
	start := time.Now()
	err = run.Start()
	errW.Close()
	if err != nil {
		return nil, fmt.Errorf("start runsc: %w", err)
	}
	waited := make(chan struct{})
	go func() { run.Wait(); close(waited) }()
	timer := time.NewTimer(p.Timeout)
	defer timer.Stop()
	res = &backend.Result{}
	select {
	case <-waited:
	case <-timer.C:
		res.TimedOut = true
		run.Process.Kill()
		<-waited
	case <-ctx.Done():
		run.Process.Kill()
		<-waited
		return nil, ctx.Err()
	}
	res.Duration = time.Since(start)
	if res.ExitCode, res.Signal, err = runExit(run.ProcessState, res.TimedOut, failure); err != nil {
		return nil, err
	}
	// The cgroup's CPU time is the sandbox's, gVisor's own included, even
	// when runsc was killed before it could reap the sandbox.
	if st, err := b.cg.Stats(); err == nil {
		res.CPU = st.CPU
		res.MaxMemoryBytes = st.MaxMemory
		res.OOMKilled = !res.TimedOut && res.Signal == "SIGKILL" && st.OOMKills > 0
	}
	res.StdoutTruncated, res.StderrTruncated = stdout.Truncated(), stderr.Truncated()
	return res, nil
}

// runExit is how the container of a runsc run ended, from how runsc did
// (ps) and what it said of its own failure: runsc exits 128+N when
// signal N ended the container, and 128 when it failed itself. A runsc
// killed by the timeout took the container with it.
func runExit(ps *os.ProcessState, timedOut bool, failure *runscFailure) (code int, signal string, err error) {
	if !ps.Exited() && !timedOut {
		return 0, "", fmt.Errorf("runsc was killed: %v", ps)
	}
	code = ps.ExitCode()
	if msg := failure.wait(); msg != "" && code == 128 {
		return 0, "", fmt.Errorf("runsc: %s", msg)
	}
	if code > 128 && code < 128+65 {
		code, signal = -1, unix.SignalName(syscall.Signal(code-128))
	}
	if timedOut {
		code, signal = -1, "SIGKILL"
	}
	return code, signal, nil
}

// runscFailure collects what runsc says about its own failures: JSON lines
// on its --log-fd, kept apart from the sandbox's output.
type runscFailure struct {
	done chan struct{}
	msg  string
}

// pipe returns the write end to hand runsc as its log fd.
func (f *runscFailure) pipe() (*os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	f.done = make(chan struct{})
	go func() {
		defer close(f.done)
		defer r.Close()
		dec := json.NewDecoder(io.LimitReader(r, 64<<10))
		for {
			var line struct {
				Msg string `json:"msg"`
			}
			if dec.Decode(&line) != nil {
				break
			}
			if f.msg == "" {
				f.msg = line.Msg
			}
		}
		io.Copy(io.Discard, r)
	}()
	return w, nil
}

// wait returns runsc's first error message, once runsc has exited.
func (f *runscFailure) wait() string {
	select {
	case <-f.done:
		return f.msg
	case <-time.After(2 * time.Second):
		return ""
	}
}
