// Package gvisor runs sandboxes under gVisor's user-space kernel (runsc):
// untrusted code talks to gVisor's Sentry, not to the host kernel.
package gvisor

import (
	"context"
	"crypto/rand"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/cgroups"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// Backend builds sandboxes with runsc. Its state directory holds runsc's
// state, the OCI bundles, one lock file per running sandbox and the
// agents' sockets; only host root uses it.
type Backend struct {
	runsc    string
	stateDir string
	log      *slog.Logger

	stampOnce sync.Once
	stamp     string // what saved state is marked with (checkpoint.go)
	stampErr  error
}

var _ backend.Backend = (*Backend)(nil)

// DefaultStateDir is the state directory of airlock run, which has no
// daemon's state directory to use.
const DefaultStateDir = "/run/airlock-gvisor"

// New returns the backend running runsc (see FindRunsc), keeping its state
// in stateDir; agents' logs go to log.
func New(runsc, stateDir string, log *slog.Logger) *Backend {
	return &Backend{runsc: runsc, stateDir: stateDir, log: log}
}

// Name is "gvisor".
func (b *Backend) Name() string { return "gvisor" }

// Runsc is the runsc binary the backend runs.
func (b *Backend) Runsc() string { return b.runsc }

// ErrNotRoot: runsc builds sandboxes as host root.
var ErrNotRoot = errors.New("the gvisor backend needs root (runsc runs as root)")

// Check reports whether spec can run, without starting anything.
func (b *Backend) Check(spec *backend.Spec) error {
	if err := backend.CheckSpec(spec); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return ErrNotRoot
	}
	return nil
}

// idleHostTasks is how many host tasks an idle gVisor sandbox uses: the
// Sentry's threads and the gofer's (see newBundle).
const idleHostTasks = 32

// FindRunsc returns the runsc to use: path if given, else $AIRLOCK_RUNSC,
// else runsc on PATH. It must be statically linked: a dynamically linked
// runsc fails after its pivot_root ("fork/exec /proc/self/exe: no such
// file or directory").
func FindRunsc(path string) (string, error) {
	if path == "" {
		path = os.Getenv("AIRLOCK_RUNSC")
	}
	if path == "" {
		p, err := exec.LookPath("runsc")
		if err != nil {
			return "", errors.New("runsc not found: build it (make runsc) or pass --runsc PATH")
		}
		path = p
	}
	f, err := elf.Open(path)
	if err != nil {
		return "", fmt.Errorf("runsc at %s is not an executable: %v", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "", fmt.Errorf("runsc at %s is dynamically linked: build it with CGO_ENABLED=0", path)
		}
	}
	return path, nil
}

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
	ps := run.ProcessState
	if !ps.Exited() && !res.TimedOut {
		return nil, fmt.Errorf("runsc was killed: %v", ps)
	}
	// runsc exits 128+N when signal N ended the container, and 128 when
	// it failed itself.
	res.ExitCode = ps.ExitCode()
	if msg := failure.wait(); msg != "" && res.ExitCode == 128 {
		return nil, fmt.Errorf("runsc: %s", msg)
	}
	if res.ExitCode > 128 && res.ExitCode < 128+65 {
		res.ExitCode, res.Signal = -1, unix.SignalName(syscall.Signal(res.ExitCode-128))
	}
	if res.TimedOut {
		res.ExitCode, res.Signal = -1, "SIGKILL"
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

// bundle is one sandbox's host side: its OCI bundle directory, a lock
// held while it lives (Cleanup leaves locked bundles alone), and the cgroup
// Airlock makes for it, which runsc joins as it finds it.
type bundle struct {
	id, dir  string
	stateDir string // the backend's
	lock     *os.File
	cg       *cgroups.Cgroup
	limits   policy.Policy // the cgroup's: the host's view of the policy
	// netns: the network namespace the host made for the sandbox, whose
	// interface gVisor's netstack takes over; nil: gVisor's loopback only.
	netns *os.File
	// image: the root is an image's (image.go), mounted at rootfs, under
	// gVisor's writable layer of overlay bytes.
	image   bool
	overlay int64
	// agent: the agent's directory (agentdir.go) of an agent sandbox.
	agent *agentDir
}

// agentDir is where the bundle's agent directory is mounted.
func (b *bundle) agentDir() string { return filepath.Join(b.stateDir, "agents", b.id) }

// tmpfsBytes is the size of each of a sandbox's two larger writable file
// systems: /tmp, and its home or its image root's writable layer.
// gVisor's tmpfs cannot share one limit between mounts, so each gets half
// of what the policy allows them in all (policy.WritableBytes) less
// /dev/shm's.
func tmpfsBytes(p *policy.Policy) int64 { return (p.WritableBytes() - shmBytes(p)) / 2 }

// shmBytes is the size of a sandbox's /dev/shm: a quarter of its writable
// space, at most Docker's 64 MiB. runsc's own /dev/shm has no limit (a
// full one was an OOM kill of the whole sandbox) and only root could write
// it (POSIX semaphores, Python's multiprocessing, need it as user).
func shmBytes(p *policy.Policy) int64 { return min(p.WritableBytes()/4, 64<<20) }

// scratchMounts are the sandbox's /tmp and /dev/shm, writable by all,
// each a tmpfs of its own limit.
func scratchMounts(p *policy.Policy) []specs.Mount {
	return []specs.Mount{
		{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777", fmt.Sprintf("size=%d", tmpfsBytes(p))}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "nodev", "noexec", "mode=1777", fmt.Sprintf("size=%d", shmBytes(p))}},
	}
}

// runFlags are runsc run's flags of the bundle's root.
func (b *bundle) runFlags() []string {
	if !b.image {
		return nil
	}
	return []string{fmt.Sprintf("--overlay2=root:memory,size=%d", b.overlay)}
}

// newBundle makes the directory, lock and cgroup of a new sandbox.
func (be *Backend) newBundle(p *policy.Policy) (*bundle, error) {
	var r [8]byte
	if _, err := rand.Read(r[:]); err != nil {
		return nil, err
	}
	return be.openBundle(hex.EncodeToString(r[:]), p)
}

// openBundle makes, or takes again (a restore), the directory, lock and
// cgroup of sandbox id.
func (be *Backend) openBundle(id string, p *policy.Policy) (*bundle, error) {
	b := &bundle{id: id, stateDir: be.stateDir}
	b.dir = filepath.Join(be.stateDir, "bundles", b.id)
	if err := os.MkdirAll(b.dir, 0o700); err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	// Locked under another name, then renamed: Cleanup never sees an
	// unlocked "lock" of a live sandbox.
	lock, err := os.OpenFile(filepath.Join(b.dir, "lock.new"), os.O_CREATE|os.O_RDWR, 0o600)
	if err == nil {
		b.lock = lock
		err = unix.Flock(int(lock.Fd()), unix.LOCK_EX)
	}
	if err == nil {
		err = os.Rename(filepath.Join(b.dir, "lock.new"), filepath.Join(b.dir, "lock"))
	}
	if err == nil {
		// Inside, gVisor enforces the user's pids limit itself, as
		// RLIMIT_NPROC on its tasks. The host's pids cgroup bounds the
		// host tasks: the Sentry's and gofer's threads (idleHostTasks)
		// and systrap's stub threads, about two per guest task, with room
		// to spare: a Sentry that cannot create a thread dies (exit 2, a
		// Go runtime fatal error) where the guest should get EAGAIN.
		b.limits = *p
		b.limits.Pids = idleHostTasks + 4*p.Pids
		b.cg, err = cgroups.New(cgroups.Prefix+b.id, cgroups.Limits{MemoryBytes: b.limits.MemoryBytes, Pids: b.limits.Pids, CPUs: b.limits.CPUs}, true)
	}
	if err != nil {
		b.remove("")
		return nil, err
	}
	return b, nil
}

// remove deletes the sandbox from runsc (unless runsc is "", nothing having
// started), kills what is left in its cgroup, and removes it all.
func (b *bundle) remove(runsc string) error {
	err := b.release(runsc)
	// What could not be removed stays behind its unlocked lock file, for
	// the next Cleanup to retry.
	if err == nil {
		os.RemoveAll(b.dir)
	}
	return err
}

// release undoes what runs the sandbox (runsc's state, the cgroup, the
// image root's mount, the agent's directory) and unlocks the bundle,
// which stays: a saved sandbox's (checkpoint.go).
func (b *bundle) release(runsc string) error {
	var errs []error
	if b.cg != nil {
		// A paused sandbox dies of nothing until it runs: runsc delete
		// would wait for it in vain.
		_ = b.cg.Freeze(context.Background(), false)
	}
	if runsc != "" {
		errs = append(errs, b.teardown(runsc))
	}
	if b.cg != nil {
		errs = append(errs, b.cg.Remove())
	}
	// Before the bundle is removed: its rootfs may be an image's layers,
	// and its host mounts are the host's directories.
	errs = append(errs, b.unmountRoot(), b.unmountUserMounts())
	if b.agent != nil {
		b.agent.close()
	}
	err := errors.Join(errs...)
	if err == nil {
		// Once nothing of the sandbox runs: its gofer serves the directory.
		err = removeAgentDir(b.agentDir())
	}
	if b.lock != nil {
		b.lock.Close()
	}
	return err
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

// runscRoot is runsc's state directory for the sandbox. Each sandbox has
// a runsc root of its own: with --network=none runsc keeps a bind-mounted
// network namespace file in its root, and a private root lets teardown
// remove it with the sandbox.
func (b *bundle) runscRoot() string { return filepath.Join(b.stateDir, "state", b.id) }

// runsc runs runsc for the sandbox with the backend's global flags, extra
// ones, and a subcommand.
func (b *bundle) runsc(runsc string, extra []string, args ...string) *exec.Cmd {
	network := "none"
	if b.netns != nil {
		// gVisor's netstack on the namespace's interface: the sandbox's
		// packets leave it as packets, for the host's rules to judge.
		network = "sandbox"
	}
	base := []string{"--root", b.runscRoot(), "--network", network, "--platform", "systrap"}
	cmd := exec.Command(runsc, append(append(base, extra...), args...)...)
	cmd.Env = runscEnv
	return cmd
}

// runscEnv is all the environment runsc gets: the daemon's holds the API
// key (AIRLOCK_API_KEY) and whatever its service manager set, and runsc
// passes its own on to the gofer and the sandbox process, host processes
// that read files the sandbox controls. runsc needs none of it.
var runscEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

// runscArgs are the global flags of runsc for the sandbox.
func (b *bundle) runscArgs() []string { return b.runsc("", nil).Args[1:] }

// teardown deletes the sandbox from runsc and removes runsc's state for
// it, the network namespace mount included. runsc run deletes its
// container when it ends; only one killed or crashed first leaves a state
// file, and only then does deleting it cost another runsc start.
func (b *bundle) teardown(runsc string) error {
	root := b.runscRoot()
	if states, _ := filepath.Glob(filepath.Join(root, "*.state")); len(states) > 0 {
		out, err := b.runsc(runsc, nil, "delete", "-force", b.id).CombinedOutput()
		if err != nil && !strings.Contains(string(out), "not exist") && !strings.Contains(string(out), "not found") {
			return fmt.Errorf("runsc delete: %v: %s", err, strings.TrimSpace(string(out)))
		}
	}
	if err := unix.Unmount(filepath.Join(root, "null-netns"), unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount runsc's network namespace: %w", err)
	}
	return os.RemoveAll(root)
}

// writeBundle writes the OCI bundle: a read-only root of mount points, the
// template's /etc and code files, and config.json.
func (be *Backend) writeBundle(b *bundle, spec *backend.Spec, extra ...specs.Mount) error {
	p := &spec.Policy
	if len(p.RootLayers) > 0 {
		return be.writeImageBundle(b, spec, extra)
	}
	root := filepath.Join(b.dir, "rootfs")
	for _, d := range []string{"usr", "etc", "proc", "dev", "tmp", layout.Home[1:]} { // mount points
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	// No /dev mount: runsc gives every sandbox gVisor's own (null, zero,
	// full, random, urandom, tty, pts, shm, and fuse and net/tun, which
	// need capabilities the sandbox has not). A tmpfs there came out the
	// same, ~20 ms later.
	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/usr", Type: "bind", Source: "/usr", Options: []string{"rbind", "ro", "nosuid", "nodev"}},
		scratchMounts(p)[0], scratchMounts(p)[1],
		{Destination: layout.Home, Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=700",
			fmt.Sprintf("uid=%d", layout.UID), fmt.Sprintf("gid=%d", layout.GID), fmt.Sprintf("size=%d", tmpfsBytes(p))}},
	}
	for _, name := range layout.HostRootLinks {
		if fi, err := os.Lstat("/" + name); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			target, err := os.Readlink("/" + name)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
				return err
			}
		}
	}
	etc, err := etcDir(be.stateDir, spec.NetNS != nil)
	if err != nil {
		return err
	}
	mounts = append(mounts, specs.Mount{Destination: "/etc", Type: "bind", Source: etc, Options: []string{"rbind", "ro", "nosuid", "nodev"}})
	code, err := b.codeMount(spec)
	if err != nil {
		return err
	}
	user, err := b.userMounts(p)
	if err != nil {
		return err
	}
	// Every source here is the daemon's own path (a host mount's is its
	// clone in the bundle: userMounts).
	for _, m := range append(append(code, user...), extra...) {
		// A mount point of the source's kind: a file for a file.
		dst := filepath.Join(root, m.Destination)
		fi, err := os.Stat(m.Source)
		if err != nil {
			return err
		}
		if fi.IsDir() {
			err = os.MkdirAll(dst, 0o755)
		} else if err = os.MkdirAll(filepath.Dir(dst), 0o755); err == nil {
			err = os.WriteFile(dst, nil, 0o644)
		}
		if err != nil {
			return err
		}
		mounts = append(mounts, m)
	}
	return be.writeConfig(b, spec, mounts)
}

// writeConfig writes the bundle's config.json: spec's process under its
// policy, with mounts.
func (be *Backend) writeConfig(b *bundle, spec *backend.Spec, mounts []specs.Mount) error {
	p := &spec.Policy
	mem := b.limits.MemoryBytes
	period := uint64(100_000)
	quota := max(int64(b.limits.CPUs*float64(period)), 1000)
	netns := specs.LinuxNamespace{Type: "network"}
	if spec.NetNS != nil {
		// runsc joins the namespace by path: the daemon's descriptor.
		netns.Path = fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), spec.NetNS.Fd())
	}
	rl := func(typ string, v uint64) specs.POSIXRlimit { return specs.POSIXRlimit{Type: typ, Hard: v, Soft: v} }
	cfg := specs.Spec{
		Version:  specs.Version,
		Hostname: layout.Hostname,
		// An image's root is writable, in gVisor's layer (runFlags).
		Root: &specs.Root{Path: "rootfs", Readonly: !b.image},
		Process: &specs.Process{
			Args:            spec.Argv,
			Env:             layout.Env(p),
			Cwd:             p.Workdir,
			User:            specs.User{UID: layout.UID, GID: layout.GID, AdditionalGids: []uint32{layout.GID}},
			Capabilities:    noCaps(),
			NoNewPrivileges: true,
			Rlimits: []specs.POSIXRlimit{
				rl("RLIMIT_CORE", 0), rl("RLIMIT_NOFILE", 4096), rl("RLIMIT_NPROC", uint64(p.Pids)),
				rl("RLIMIT_FSIZE", uint64(p.DiskBytes)),
			},
		},
		Mounts: mounts,
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{{Type: "pid"}, netns, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"}},
			// The limits are in the cgroup Airlock made (newBundle);
			// runsc uses a cgroup it finds as it is, and sizes the
			// Sentry's memory and CPUs from it. The same limits here are
			// for a cgroup that went missing: runsc would make one
			// without any.
			CgroupsPath: b.cg.Path(),
			Resources: &specs.LinuxResources{
				Memory: &specs.LinuxMemory{Limit: &mem, Swap: &mem},
				Pids:   &specs.LinuxPids{Limit: b.limits.Pids},
				CPU:    &specs.LinuxCPU{Quota: &quota, Period: &period},
			},
		},
	}
	if p.Root {
		// Root of gVisor's kernel, with a container's capabilities there:
		// the Sentry is the kernel it has them in, not the host's.
		cfg.Process.User = specs.User{UID: 0, GID: 0}
		cfg.Process.Capabilities = rootCaps()
	}
	data, err := json.MarshalIndent(&cfg, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(b.dir, "config.json"), data, 0o600)
}

// codeMount writes spec's files into the bundle and returns their
// read-only mount at layout.CodeDir; none without files.
func (b *bundle) codeMount(spec *backend.Spec) ([]specs.Mount, error) {
	if len(spec.Files) == 0 {
		return nil, nil
	}
	dir := filepath.Join(b.dir, "code")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	for _, f := range spec.Files {
		if err := os.WriteFile(filepath.Join(dir, f.Name), f.Data, 0o444); err != nil {
			return nil, err
		}
	}
	return []specs.Mount{{Destination: layout.CodeDir, Type: "bind", Source: dir, Options: []string{"rbind", "ro", "nosuid", "nodev"}}}, nil
}

// userMounts are the bind mounts of p's host paths. runsc resolves a
// mount's source by its path, so each is given one of the bundle's, root's
// alone: a clone of the source's tree, opened without following a symlink
// (backend.CloneMount) and mounted at mounts/N in the bundle, where it
// stays until release unmounts it.
func (b *bundle) userMounts(p *policy.Policy) ([]specs.Mount, error) {
	var mounts []specs.Mount
	for i, m := range p.Mounts {
		tree, err := backend.CloneMount(m, false)
		if err != nil {
			return nil, err
		}
		dst := filepath.Join(b.dir, bundleMounts, strconv.Itoa(i))
		// A mount point of the source's kind: a file for a file.
		var st unix.Stat_t
		if err = unix.Fstat(int(tree.Fd()), &st); err == nil {
			err = os.MkdirAll(filepath.Dir(dst), 0o700)
		}
		if err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			err = os.Mkdir(dst, 0o700)
		} else if err == nil {
			err = os.WriteFile(dst, nil, 0o600)
		}
		if err == nil {
			err = unix.MoveMount(int(tree.Fd()), "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH)
		}
		tree.Close()
		if err != nil {
			return nil, fmt.Errorf("mount %s: %w", m.Source, err)
		}
		opts := []string{"rbind", "nosuid", "nodev"}
		if m.ReadOnly {
			opts = append(opts, "ro")
		}
		mounts = append(mounts, specs.Mount{Destination: m.Target, Type: "bind", Source: dst, Options: opts})
	}
	return mounts, nil
}

// bundleMounts is the bundle's directory of host mounts (userMounts).
const bundleMounts = "mounts"

// unmountUserMounts unmounts and removes the bundle's host mounts. Until
// each mount point is gone the bundle is not removed: a removal would
// reach into a host directory through it.
func (b *bundle) unmountUserMounts() error {
	dir := filepath.Join(b.dir, bundleMounts)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		mp := filepath.Join(dir, e.Name())
		if err := unix.Unmount(mp, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("unmount a host mount: %w", err)
		}
		// rmdir or unlink, never a removal of what it holds: each fails
		// on a mount point, rmdir on a directory that is not empty.
		rm := unix.Rmdir
		if !e.IsDir() {
			rm = func(p string) error { return unix.Unlinkat(unix.AT_FDCWD, p, 0) }
		}
		if err := rm(mp); err != nil {
			return fmt.Errorf("remove a host mount point: %w", err)
		}
	}
	return unix.Rmdir(dir)
}

// noCaps: no capability in any set, and none to be gained.
func noCaps() *specs.LinuxCapabilities {
	return &specs.LinuxCapabilities{Bounding: []string{}, Effective: []string{}, Inheritable: []string{}, Permitted: []string{}, Ambient: []string{}}
}

// rootCaps are a container's default capabilities (Docker's and runc's),
// those of the namespaces backend's root inside.
func rootCaps() *specs.LinuxCapabilities {
	c := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID",
		"CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"}
	return &specs.LinuxCapabilities{Bounding: c, Effective: c, Permitted: c, Inheritable: []string{}, Ambient: []string{}}
}

// writeImageBundle is writeBundle for a sandbox of an image (image.go).
func (be *Backend) writeImageBundle(b *bundle, spec *backend.Spec, extra []specs.Mount) error {
	p := &spec.Policy
	b.image, b.overlay = true, tmpfsBytes(p)
	code, err := b.codeMount(spec)
	if err != nil {
		return err
	}
	// /tmp and /dev/shm tmpfs of their own limits, as in every sandbox
	// (runsc would mount them without any); the root's writable layer has
	// its own.
	scratch := scratchMounts(p)
	mounts := append([]specs.Mount{{Destination: "/proc", Type: "proc", Source: "proc"}}, scratch...)
	user, err := b.userMounts(p)
	if err != nil {
		return err
	}
	mounts = append(append(append(mounts, user...), code...), extra...)
	etc, err := b.imageRoot(p, spec.NetNS != nil, mounts[1+len(scratch):])
	if err != nil {
		return err
	}
	return be.writeConfig(b, spec, append(mounts, etc...))
}

// Cleanup removes the gVisor sandboxes of earlier, killed airlock runs:
// bundles whose lock nobody holds, with their runsc state and cgroups.
func (be *Backend) Cleanup(context.Context) error {
	var errs []error
	entries, _ := os.ReadDir(filepath.Join(be.stateDir, "bundles"))
	for _, e := range entries {
		b := &bundle{id: e.Name(), dir: filepath.Join(be.stateDir, "bundles", e.Name()), stateDir: be.stateDir, cg: cgroups.Load(cgroups.Prefix + e.Name())}
		// The bundle's lock, or the one it is made under before it gets
		// its name (openBundle): held, its owner lives; free, it died,
		// even while making the bundle. (Taken in the instant between
		// another process's creating lock.new and locking it, that
		// process's rename fails and its start with it: nothing leaks.)
		f, err := os.OpenFile(filepath.Join(b.dir, "lock"), os.O_RDWR, 0)
		if err != nil {
			f, err = os.OpenFile(filepath.Join(b.dir, "lock.new"), os.O_RDWR, 0)
		}
		if err == nil {
			if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
				f.Close()
				continue // alive
			}
			b.lock = f
		} else if fi, err := e.Info(); err != nil || time.Since(fi.ModTime()) < time.Minute {
			continue // being created: no lock file yet
		}
		if _, err := os.Stat(filepath.Join(b.dir, savedMarker)); err == nil {
			b.lock.Close()
			continue // saved: the manager restores or forgets it
		}
		if err := b.remove(be.runsc); err != nil {
			errs = append(errs, fmt.Errorf("leftover gVisor sandbox %s: %w", b.id, err))
		}
	}
	// Agent directories whose bundle is gone: their unmount failed when
	// it was removed. (A bundle is made before its agent directory.)
	agents, _ := os.ReadDir(filepath.Join(be.stateDir, "agents"))
	for _, e := range agents {
		if _, err := os.Lstat(filepath.Join(be.stateDir, "bundles", e.Name())); errors.Is(err, fs.ErrNotExist) {
			if err := removeAgentDir(filepath.Join(be.stateDir, "agents", e.Name())); err != nil {
				errs = append(errs, fmt.Errorf("leftover agent directory %s: %w", e.Name(), err))
			}
		}
	}
	// Half-built copies of /etc (etcDir) whose builder died.
	partial, _ := filepath.Glob(filepath.Join(be.stateDir, "etc", ".new-*"))
	for _, dir := range partial {
		if fi, err := os.Stat(dir); err == nil && time.Since(fi.ModTime()) > time.Minute {
			os.RemoveAll(dir)
		}
	}
	return errors.Join(errs...)
}
