package gvisor

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

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
	etc, trusted, err := etcDir(be.stateDir, spec.NetNS != nil, be.trustOf(spec.NetNS != nil))
	if err != nil {
		return err
	}
	b.trusted = trusted
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

// env is the environment of b's process under p.
func (b *bundle) env(p *policy.Policy) []string {
	if b.trusted {
		return layout.MergeEnv(layout.Env(p), layout.TrustEnv())
	}
	return layout.Env(p)
}

// writeConfig writes the bundle's config.json: spec's process under its
// policy, with mounts.
func (be *Backend) writeConfig(b *bundle, spec *backend.Spec, mounts []specs.Mount) error {
	p := &spec.Policy
	mem := b.limits.MemoryBytes
	period := uint64(100_000)
	quota := max(int64(b.limits.CPUs*float64(period)), 1000)
	netns := netNamespace(spec.NetNS)
	rl := func(typ string, v uint64) specs.POSIXRlimit { return specs.POSIXRlimit{Type: typ, Hard: v, Soft: v} }
	cfg := specs.Spec{
		Version:  specs.Version,
		Hostname: layout.Hostname,
		// An image's root is writable, in gVisor's layer (runFlags).
		Root: &specs.Root{Path: "rootfs", Readonly: !b.image},
		Process: &specs.Process{
			Args:            spec.Argv,
			Env:             b.env(p),
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
	// The CA whether or not this sandbox has a network: a warm snapshot
	// (made without one) and its networked clones must have the same
	// mounts, or runsc cannot restore the one into the other. Without a
	// network the CA is trusted for nothing.
	etc, err := b.imageRoot(p, spec.NetNS != nil, be.trust, mounts[1+len(scratch):])
	if err != nil {
		return err
	}
	return be.writeConfig(b, spec, append(mounts, etc...))
}

// netNamespace is the network namespace of a sandbox's config: netns,
// which runsc joins by path (the daemon's descriptor), or, without one, a
// new one of runsc's (--network=none).
func netNamespace(netns *os.File) specs.LinuxNamespace {
	ns := specs.LinuxNamespace{Type: "network"}
	if netns != nil {
		ns.Path = fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), netns.Fd())
	}
	return ns
}

// setNetNS points the config.json of b, saved, at netns: a restore runs
// in a network of its own, made for it (runsc allows a namespace's path
// to change between save and restore). The bundle is the daemon's, out of
// the sandbox's reach.
func setNetNS(b *bundle, netns *os.File) error {
	path := filepath.Join(b.dir, "config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var cfg specs.Spec
	if err := json.Unmarshal(data, &cfg); err != nil || cfg.Linux == nil {
		return &backend.StateError{Reason: "has a corrupt configuration"}
	}
	for i, ns := range cfg.Linux.Namespaces {
		if ns.Type == "network" {
			cfg.Linux.Namespaces[i] = netNamespace(netns)
		}
	}
	if data, err = json.Marshal(&cfg); err != nil {
		return err
	}
	tmp := path + ".new"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
