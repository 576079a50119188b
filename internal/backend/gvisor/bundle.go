package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/cgroups"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

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
	// trusted: the sandbox's store of certificates holds its system's
	// roots and the egress CA (TrustCA), so the clients that read their
	// own bundles are pointed at it (layout.TrustEnv).
	trusted bool
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
	id, err := backend.NewBoxID()
	if err != nil {
		return nil, err
	}
	return be.openBundle(id, p)
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
	// runsc pins its gofers' empty network namespace in its root, once
	// per start that found none pinned: a restore under the root of a
	// sandbox whose daemon was killed stacks another. Every one goes.
	for i := 0; ; i++ {
		err := unix.Unmount(filepath.Join(root, "null-netns"), unix.MNT_DETACH)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			break
		}
		if err != nil {
			return fmt.Errorf("unmount runsc's network namespace: %w", err)
		}
		if i == 64 {
			return errors.New("unmount runsc's network namespace: still mounted after 64 unmounts")
		}
	}
	return os.RemoveAll(root)
}
