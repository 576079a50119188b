// Package namespaces runs commands in sandboxes built from Linux namespaces,
// cgroups, Landlock and seccomp: the default Airlock backend.
package namespaces

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/cgroups"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/rangelock"
	"github.com/airlock-sandbox/airlock/internal/sandboxbin"
)

// Backend builds sandboxes from Linux namespaces. It keeps its lock files
// and agent sockets in its state directory, which only host root uses.
type Backend struct {
	stateDir string
	log      *slog.Logger
	runs     *rangelock.Locks // <state dir>/runs.lock (state.go)

	// trust is the egress CA that sandboxes with a network trust (TrustCA).
	trust trust

	mu     sync.Mutex
	kept   map[string]*kept // by sandbox id, until adopted (adopt.go)
	others map[string]*kept // other backends', by tag (backend.Keeper)
}

var _ backend.Backend = (*Backend)(nil)

// DefaultStateDir is the state directory of airlock run, which has no
// daemon's state directory to use.
const DefaultStateDir = "/run/airlock"

// New returns the backend keeping its state in stateDir; agents' logs go
// to log.
func New(stateDir string, log *slog.Logger) *Backend {
	return &Backend{stateDir: stateDir, log: log, runs: &rangelock.Locks{Path: filepath.Join(stateDir, runsLockFile)}}
}

// Name is "namespaces".
func (b *Backend) Name() string { return "namespaces" }

// spec is an execution with what only this backend's own callers set.
type spec struct {
	*backend.Spec
	// extraFiles become the command's file descriptors 3, 4, …
	extraFiles []*os.File
	// selfMounts are where the airlock binary itself appears, read-only:
	// the agent, and sudo (agent/sudo.go).
	selfMounts []string
	id         string // the sandbox id, when the caller chose it (Start)
	// live: the sandbox serves (an agent) rather than runs one command;
	// its CPU time can be read while it runs, and it can be paused.
	live bool
	// oneLog: Stdout and Stderr are one log, fed through one pipe, which
	// saves the daemon a descriptor for each sandbox it holds.
	oneLog bool
	// trust: the CA the sandbox's store of certificates holds (networked
	// sandboxes of a backend that has one).
	trust trust
}

// Each sandbox gets its own range of host ids: its root maps to the start
// of the range (which also owns its user namespace) and its user to
// start+1000. The ranges lie in [2^30, 2^31), ids no distribution allocates
// (useradd stays below 60000, subordinate ranges start at 100000 and grow
// by 65536), so a file a sandbox creates is never owned by a host account,
// let alone root, and sandboxes do not share per-user kernel budgets.
const (
	hostIDBase  = 1 << 30
	hostIDRange = 1 << 16
	hostIDSlots = 1 << 14 // hostIDBase + hostIDSlots*hostIDRange = 2^31
)

// HostUIDs is the range [lo, hi) of host uids sandboxes run as.
func HostUIDs() (lo, hi int) { return hostIDBase, hostIDBase + hostIDSlots*hostIDRange }

// uidLockFile holds a byte-range lock for each host id range in use, taken
// by every airlock process on the host whatever its state directory: two
// live sandboxes never share host ids, so never share the kernel's
// per-user budgets (RLIMIT_NPROC, inotify instances, queued signals).
const uidLockFile = "/run/airlock-uids.lock"

var uidLocks = &rangelock.Locks{Path: uidLockFile}

// claimIDBase picks a free host id range at random and holds it until
// release is called: a lock that the kernel drops when its owner dies,
// so a crash leaks none (rangelock.Locks).
func claimIDBase() (base int, release func(), err error) {
	for range 64 {
		var b [2]byte
		if _, err := rand.Read(b[:]); err != nil {
			return 0, nil, err
		}
		slot := (int(b[0])<<8 | int(b[1])) % hostIDSlots
		switch err := uidLocks.TryLock(int64(slot)); {
		case err == nil:
			return hostIDBase + slot*hostIDRange, func() { uidLocks.Unlock(int64(slot)) }, nil
		case !errors.Is(err, rangelock.ErrBusy):
			return 0, nil, fmt.Errorf("host id lock: %w", err)
		}
	}
	return 0, nil, errors.New("no free host id range: too many sandboxes on this host")
}

// RootMountDir is the empty directory every sandbox mounts its root on,
// each inside its own mount namespace. Unlike the state directory it is fixed and
// world-traversable: init reaches it as an unprivileged host uid.
const RootMountDir = "/run/airlock-root"

// setupTimeout bounds how long building a sandbox may take.
const setupTimeout = backend.SetupTimeout

// Check reports whether sandboxes can be built here and spec is runnable,
// without starting anything. Its errors are meant for the user.
func (b *Backend) Check(spec *backend.Spec) error {
	if err := backend.CheckSpec(spec); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return ErrNotRoot
	}
	return nil
}

// ErrNotRoot is returned when the process lacks the privileges to build
// sandboxes: mapping several ids into a user namespace and creating
// cgroups need host root.
var ErrNotRoot = errors.New("the namespaces backend needs root (it writes uid maps and creates cgroups)")

// Run executes spec in a new sandbox, under its policy's timeout, and
// destroys the sandbox before returning. ctx cancellation kills the sandbox
// like a timeout does, but is reported as ctx.Err().
func (b *Backend) Run(ctx context.Context, s *backend.Spec) (*backend.Result, error) {
	sb, err := b.start(ctx, &spec{Spec: s})
	if err != nil {
		return nil, err
	}
	timer := time.NewTimer(s.Policy.Timeout)
	defer timer.Stop()
	timedOut := false
	select {
	case <-sb.Done():
	case <-timer.C:
		timedOut = true
		sb.Kill()
	case <-ctx.Done():
		sb.Kill()
		sb.Wait()
		return nil, ctx.Err()
	}
	res, err := sb.Wait()
	if err != nil {
		return nil, err
	}
	if timedOut {
		res.TimedOut, res.OOMKilled = true, false
	}
	return res, nil
}

// Sandbox is a running sandbox: its init and the command init started.
type Sandbox struct {
	ID      string
	HostUID int // the host uid the sandbox's user runs as

	lock           *runLock
	releaseIDs     func() // frees the host id range (claimIDBase)
	cg             *cgroups.Cgroup
	proc           initProc
	stdout, stderr *backend.CappedWriter
	started        time.Time
	// How init ended, valid once done is closed: its status, the CPU time
	// of the whole sandbox, and an error if it could not be reaped.
	status  unix.WaitStatus
	cpu     time.Duration
	waitErr error
	done    chan struct{}        // closed when init has exited
	exited  chan unix.WaitStatus // the command's status, as init reported it
	upper   *os.File             // the writable layer's directory, for ExportRoot
	logR    *os.File             // the read end of one log (spec.oneLog), for a keeper

	waitOnce sync.Once
	result   *backend.Result
	err      error
}

// start builds a sandbox for spec and starts its command. It returns once
// the command runs, or with an error (a *backend.SetupError when the
// sandbox could not be built) after removing everything it created.
// Policy.Timeout is not applied: the caller decides when the sandbox ends.
func (b *Backend) start(ctx context.Context, spec *spec) (*Sandbox, error) {
	if err := b.Check(spec.Spec); err != nil {
		return nil, err
	}
	if err := backend.CheckNetNS(&spec.Policy, spec.NetNS); err != nil {
		return nil, err
	}
	if err := b.prepareStateDir(); err != nil {
		return nil, err
	}
	bin, err := sandboxbin.Install(b.stateDir)
	if err != nil {
		return nil, err
	}
	id := spec.id
	if id == "" {
		if id, err = backend.NewBoxID(); err != nil {
			return nil, err
		}
	}
	lock, err := b.lockRun(id)
	if err != nil {
		return nil, err
	}
	base, releaseIDs, err := claimIDBase()
	if err != nil {
		lock.release(true)
		return nil, err
	}
	p := &spec.Policy
	cg, err := cgroups.New(cgroups.Prefix+id, cgroups.Limits{MemoryBytes: p.MemoryBytes, Pids: p.Pids, CPUs: p.CPUs}, spec.live)
	if err != nil {
		releaseIDs()
		lock.release(true)
		return nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	sb := &Sandbox{ID: id, HostUID: base + layout.UID, lock: lock, releaseIDs: releaseIDs, cg: cg, done: make(chan struct{}), exited: make(chan unix.WaitStatus, 1)}
	if err := sb.start(ctx, spec, bin); err != nil {
		// Nothing of a sandbox that failed to start may remain.
		kerr, derr := cg.Kill(), cg.Destroy()
		if kerr == nil {
			releaseIDs()
		}
		lock.release(kerr == nil && derr == nil)
		return nil, err
	}
	return sb, nil
}

// Done is closed when the sandbox's init has exited: the command ended or
// the sandbox was killed.
func (s *Sandbox) Done() <-chan struct{} { return s.done }

// Kill ends the sandbox: SIGKILL to its init, whose death takes every
// other process of the pid namespace with it. It does not wait. A paused
// sandbox is thawed, or the signal would wait for it.
func (s *Sandbox) Kill() {
	select {
	case <-s.done:
	default:
		_ = s.proc.Signal(syscall.SIGKILL)
		_ = s.cg.Freeze(context.Background(), false)
	}
}

// Wait waits for the sandbox to end, removes what is left of it (its
// cgroups, its lock) and returns how its command ended. It may be called
// more than once and from several goroutines.
func (s *Sandbox) Wait() (*backend.Result, error) {
	s.waitOnce.Do(func() { s.result, s.err = s.finish() })
	return s.result, s.err
}

func (s *Sandbox) finish() (*backend.Result, error) {
	<-s.done
	if s.upper != nil {
		s.upper.Close() // it holds the sandbox's tmpfs
	}
	res := &backend.Result{Duration: time.Since(s.started)}
	var errs []error
	if s.waitErr != nil {
		errs = append(errs, fmt.Errorf("wait: %w", s.waitErr))
	}
	// The command's own status, as init reported it; if init died first
	// (killed, OOM, the host), its death is the command's.
	ws, ok := <-s.exited
	if !ok {
		ws = s.status
	}
	res.ExitCode = ws.ExitStatus()
	if ws.Signaled() {
		res.Signal = unix.SignalName(ws.Signal())
	}
	// Init's rusage includes every descendant it or the kernel reaped,
	// and at the end of a pid namespace that is every process in it.
	res.CPU = s.cpu
	res.StdoutTruncated, res.StderrTruncated = s.stdout.Truncated(), s.stderr.Truncated()
	// Whatever happened, nothing of the sandbox may outlive it. Its host
	// ids are free again once nothing runs as them.
	if err := s.cg.Kill(); err != nil {
		errs = append(errs, fmt.Errorf("kill sandbox %s: %w", s.ID, err))
	} else {
		s.releaseIDs()
	}
	if st, err := s.cg.Stats(); err == nil {
		res.MaxMemoryBytes = st.MaxMemory
		// An OOM kill shows as SIGKILL plus the cgroup's oom_kill
		// counter; memory.failcnt is not reliable on v1.
		res.OOMKilled = st.OOMKills > 0 && res.Signal == "SIGKILL"
	}
	if err := s.cg.Destroy(); err != nil {
		errs = append(errs, fmt.Errorf("remove cgroup of %s: %w", s.ID, err))
	}
	// On failure the lock file stays, unlocked: the next Cleanup retries.
	s.lock.release(len(errs) == 0)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return res, nil
}

// openMounts clones each host path to mount as a detached mount tree,
// with its final attributes (backend.CloneMount). Host root opens them,
// so the path's parent directories need not be open to the sandbox's
// unprivileged host uid; the sandbox sees the tree itself with the
// permissions its files have. The first users are the policy's, whose
// sources are never followed through a symlink; the rest the daemon's own.
func openMounts(mounts []policy.Mount, users int) ([]*os.File, error) {
	var files []*os.File
	for i, m := range mounts {
		if m.IDMapped {
			continue // made for init's user namespace (sendLayers)
		}
		f, err := backend.CloneMount(m, i >= users)
		if err != nil {
			return files, err
		}
		files = append(files, f)
	}
	return files, nil
}

func closeAll(files []*os.File) { backend.CloseAll(files) }
