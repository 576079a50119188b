// Package namespaces runs commands in sandboxes built from Linux namespaces,
// cgroups, Landlock and seccomp: the default Airlock backend.
package namespaces

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/backend/namespaces/nsinit"
	"github.com/airlock-sandbox/airlock/internal/cgroups"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/sandboxbin"
)

// Backend builds sandboxes from Linux namespaces. It keeps its lock files
// and agent sockets in its state directory, which only host root uses.
type Backend struct {
	stateDir string
	log      *slog.Logger
}

var _ backend.Backend = (*Backend)(nil)

// DefaultStateDir is the state directory of airlock run, which has no
// daemon's state directory to use.
const DefaultStateDir = "/run/airlock"

// New returns the backend keeping its state in stateDir; agents' logs go
// to log.
func New(stateDir string, log *slog.Logger) *Backend {
	return &Backend{stateDir: stateDir, log: log}
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

// claimIDBase picks a free host id range at random and holds it until the
// returned file is closed: an open file description's lock (F_OFD_SETLK),
// which the kernel releases when its owner dies, so a crash leaks none.
func claimIDBase() (int, *os.File, error) {
	f, err := os.OpenFile(uidLockFile, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return 0, nil, fmt.Errorf("host id lock: %w", err)
	}
	for range 64 {
		var b [2]byte
		if _, err := rand.Read(b[:]); err != nil {
			f.Close()
			return 0, nil, err
		}
		slot := (int(b[0])<<8 | int(b[1])) % hostIDSlots
		lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart, Start: int64(slot), Len: 1}
		err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk)
		if err == nil {
			return hostIDBase + slot*hostIDRange, f, nil
		}
		if !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EACCES) {
			f.Close()
			return 0, nil, fmt.Errorf("host id lock: %w", err)
		}
	}
	f.Close()
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
	uids           *os.File // holds the host id range (claimIDBase)
	cg             *cgroups.Cgroup
	cmd            *exec.Cmd
	stdout, stderr *backend.CappedWriter
	started        time.Time
	waitErr        error                // cmd.Wait's, valid once done is closed
	done           chan struct{}        // closed when init has exited
	exited         chan unix.WaitStatus // the command's status, as init reported it
	upper          *os.File             // the writable layer's directory, for ExportRoot

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
		if id, err = newID(); err != nil {
			return nil, err
		}
	}
	lock, err := b.lockRun(id)
	if err != nil {
		return nil, err
	}
	base, uids, err := claimIDBase()
	if err != nil {
		lock.release(true)
		return nil, err
	}
	p := &spec.Policy
	cg, err := cgroups.New(cgroups.Prefix+id, cgroups.Limits{MemoryBytes: p.MemoryBytes, Pids: p.Pids, CPUs: p.CPUs}, spec.live)
	if err != nil {
		uids.Close()
		lock.release(true)
		return nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	sb := &Sandbox{ID: id, HostUID: base + layout.UID, lock: lock, uids: uids, cg: cg, done: make(chan struct{}), exited: make(chan unix.WaitStatus, 1)}
	if err := sb.start(ctx, spec, bin); err != nil {
		// Nothing of a sandbox that failed to start may remain.
		kerr, derr := cg.Kill(), cg.Destroy()
		if kerr == nil {
			uids.Close()
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
		_ = s.cmd.Process.Kill()
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
	if s.waitErr != nil && !errors.As(s.waitErr, new(*exec.ExitError)) && !errors.Is(s.waitErr, exec.ErrWaitDelay) {
		errs = append(errs, fmt.Errorf("wait: %w", s.waitErr))
	}
	// The command's own status, as init reported it; if init died first
	// (killed, OOM, the host), its death is the command's.
	ws, ok := <-s.exited
	if !ok {
		ws = unix.WaitStatus(s.cmd.ProcessState.Sys().(syscall.WaitStatus))
	}
	res.ExitCode = ws.ExitStatus()
	if ws.Signaled() {
		res.Signal = unix.SignalName(ws.Signal())
	}
	// Init's rusage includes every descendant it or the kernel reaped,
	// and at the end of a pid namespace that is every process in it.
	res.CPU = s.cmd.ProcessState.UserTime() + s.cmd.ProcessState.SystemTime()
	res.StdoutTruncated, res.StderrTruncated = s.stdout.Truncated(), s.stderr.Truncated()
	// Whatever happened, nothing of the sandbox may outlive it. Its host
	// ids are free again once nothing runs as them.
	if err := s.cg.Kill(); err != nil {
		errs = append(errs, fmt.Errorf("kill sandbox %s: %w", s.ID, err))
	} else {
		s.uids.Close()
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

func (s *Sandbox) start(ctx context.Context, spec *spec, bin *sandboxbin.Binary) error {
	base := s.HostUID - layout.UID
	p := &spec.Policy
	files := make([]nsinit.File, len(spec.Files))
	for i, f := range spec.Files {
		files[i] = nsinit.File{Name: f.Name, Data: f.Data}
	}
	cfg := nsinit.Config{
		Argv:           spec.Argv,
		Env:            layout.Env(p),
		Workdir:        p.Workdir,
		Hostname:       layout.Hostname,
		RootDir:        RootMountDir,
		DiskBytes:      p.DiskBytes,
		WritableBytes:  p.WritableBytes(),
		WritableInodes: p.WritableInodes(),
		Pids:           p.Pids,
		Mounts:         p.Mounts,
		Files:          files,
		Networked:      spec.NetNS != nil,
		Layers:         len(p.RootLayers),
		Root:           p.Root,
		ExportRoot:     p.ExportRoot,
	}
	// Every file handed to init is closed here once init has started (or
	// failed to); a second Close of the same file is harmless.
	var handed []*os.File
	defer func() { closeAll(handed) }()
	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer cfgW.Close()
	statusR, statusW, err := os.Pipe()
	if err != nil {
		cfgR.Close()
		return err
	}
	handed = append(handed, cfgR, statusW) // nsinit.ConfigFD, nsinit.StatusFD

	// A sandbox with a network is forked inside the namespace the host
	// made for it; one without gets a new, empty one.
	clone := uintptr(unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS)
	if spec.NetNS == nil {
		clone |= unix.CLONE_NEWNET
	}
	cmd := &exec.Cmd{
		// Init is the sandbox binary, executed through a descriptor of it
		// (the last of the files handed over, below), not by its path:
		// the exec happens after the child became the sandbox's root, an
		// unprivileged host uid that may not traverse the state directory.
		// The magic link skips that lookup.
		Args: []string{"airlock-sandbox", nsinit.Arg},
		Env:  []string{},
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags: clone,
			// The sandbox's own 65,536 ids: its root, its user, and
			// whatever ids an image's files have.
			UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: hostIDRange}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: hostIDRange}},
			// Without an explicit credential the child would keep host
			// uid 0 (unmapped, but still the owner of root's files).
			// Empty Groups drops host root's supplementary groups.
			Credential:                 &syscall.Credential{Uid: 0, Gid: 0, Groups: []uint32{}},
			GidMappingsEnableSetgroups: true,
			// A new session: no controlling terminal to inject input into.
			Setsid: true,
			// If airlock dies, the kernel kills the sandbox's init, and
			// with it every process of its pid namespace.
			Pdeathsig: syscall.SIGKILL,
		},
	}
	// Init must be born in, or join before it runs anything, its cgroups.
	tasks, releaseCgroup, err := s.cg.Enter(cmd.SysProcAttr)
	if err != nil {
		statusR.Close()
		return fmt.Errorf("cgroup: %w", err)
	}
	defer releaseCgroup()
	handed = append(handed, tasks...)
	cfg.CgroupFiles = len(tasks)
	mounts := p.Mounts
	for _, target := range spec.selfMounts {
		mounts = append(slices.Clip(mounts), policy.Mount{Source: bin.Path, Target: target, ReadOnly: true})
	}
	cfg.Mounts = mounts
	mountFiles, err := openMounts(mounts, len(p.Mounts))
	handed = append(handed, mountFiles...)
	if err != nil {
		statusR.Close()
		return err
	}
	// The image's layers travel on a socket, once init's user namespace
	// exists: their idmapped mounts are made for it (layers.go).
	var layerSock *os.File
	if len(p.RootLayers) > 0 {
		pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			statusR.Close()
			return fmt.Errorf("layer socket: %w", err)
		}
		layerSock = os.NewFile(uintptr(pair[0]), "layers")
		defer layerSock.Close()
		handed = append(handed, os.NewFile(uintptr(pair[1]), "layers"))
	}
	handed = append(handed, spec.extraFiles...)
	cfg.CommandFiles = len(spec.extraFiles)
	// Init's own binary last, which init closes first.
	cmd.ExtraFiles = append(handed, bin.File)
	cfg.SelfFD = 3 + len(handed)
	cmd.Path = fmt.Sprintf("/proc/self/fd/%d", cfg.SelfFD)
	cfgData, err := json.Marshal(&cfg)
	if err != nil {
		statusR.Close()
		return err
	}
	s.stdout = backend.NewCappedWriter(spec.Stdout, p.OutputLimit)
	s.stderr = backend.NewCappedWriter(spec.Stderr, p.OutputLimit)
	cmd.Stdout, cmd.Stderr = s.stdout, s.stderr
	if spec.Stdin != nil {
		// Hide the *os.File behind a plain Reader so os/exec copies
		// through a pipe: a terminal must never be handed to the sandbox.
		cmd.Stdin = struct{ io.Reader }{spec.Stdin}
	}
	// Stdin copying may block on a terminal forever; output pipes close
	// when the sandbox dies. Bound both.
	cmd.WaitDelay = time.Second

	// Fork on the spawner thread, as the namespace's owner (spawn.go).
	err = asOwner(base, spec.NetNS, cmd.Start)
	closeAll(handed)
	releaseCgroup()
	if err != nil {
		statusR.Close()
		return fmt.Errorf("start sandbox: %w", err)
	}
	s.cmd = cmd
	go func() {
		s.waitErr = cmd.Wait()
		close(s.done)
	}()
	abort := func(e error) error {
		_ = cmd.Process.Kill()
		<-s.done
		statusR.Close()
		return e
	}
	if _, err := cfgW.Write(cfgData); err != nil {
		return abort(fmt.Errorf("send config: %w", err))
	}
	cfgW.Close()
	if layerSock != nil {
		if err := sendLayers(layerSock, cmd.Process.Pid, p.RootLayers); err != nil {
			return abort(&backend.SetupError{Msg: err.Error()})
		}
	}

	// Init reports 'R' once the command runs, or 'E' and why it could not.
	// A setup that hangs is a failure too, not a hang of the caller, and
	// so is one whose caller gave up (ctx).
	statusR.SetReadDeadline(time.Now().Add(setupTimeout))
	stop := context.AfterFunc(ctx, func() { statusR.SetReadDeadline(time.Now()) })
	var first [1]byte
	_, err = io.ReadFull(statusR, first[:])
	if !stop() {
		// Canceled, whatever init said: the deadline the cancellation set
		// may land after the reset below and break the status reader.
		return abort(ctx.Err())
	}
	if err != nil || first[0] != nsinit.StatusRunning {
		msg, _ := io.ReadAll(io.LimitReader(statusR, 4096))
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			msg = []byte(fmt.Sprintf("init did not report within %s", setupTimeout))
		case first[0] != nsinit.StatusFailed:
			msg = []byte("init ended without a report")
		}
		return abort(&backend.SetupError{Msg: string(msg)})
	}
	statusR.SetReadDeadline(time.Time{})
	if p.ExportRoot {
		if s.upper, err = receiveUpper(layerSock); err != nil {
			return abort(&backend.SetupError{Msg: err.Error()})
		}
	}
	s.started = time.Now()
	go func() {
		defer statusR.Close()
		var msg [5]byte
		if n, _ := io.ReadFull(statusR, msg[:]); n == 5 && msg[0] == nsinit.StatusExited {
			s.exited <- unix.WaitStatus(binary.LittleEndian.Uint32(msg[1:]))
		}
		close(s.exited)
	}()
	return nil
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
		f, err := backend.CloneMount(m, i >= users)
		if err != nil {
			return files, err
		}
		files = append(files, f)
	}
	return files, nil
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

func newID() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}
