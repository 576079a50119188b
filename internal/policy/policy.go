// Package policy describes what one sandbox may use: its limits, mounts and
// environment, with safe defaults and validation of everything a user supplies.
package policy

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"time"
)

// Policy is the complete description of a sandbox's resources and view of
// the host. The zero value is not valid; start from Default.
type Policy struct {
	MemoryBytes int64         // cgroup memory limit; swap is limited to the same total
	Pids        int64         // most tasks (processes and threads) at once
	CPUs        float64       // CPU quota in cores
	Timeout     time.Duration // wall-clock limit of one execution
	OutputLimit int64         // bytes kept per stream (stdout, stderr)
	DiskBytes   int64         // size of the writable root (/tmp, /home/user); see WritableBytes
	Mounts      []Mount       // host paths made visible inside
	Env         []string      // KEY=VALUE pairs added to the default environment
	Workdir     string        // working directory inside the sandbox
	Network     Network       // what it may reach; the zero value: loopback only
	// RootLayers, when set, make the sandbox's root: these host
	// directories (an image's layers, top first) stacked read-only under
	// a writable layer of DiskBytes. Unset: the host's view (its /usr,
	// read-only, and a few /etc entries).
	RootLayers []string
	// Root: the sandbox's first process runs as its root, uid 0 of its
	// own user namespace with a container's default capabilities there
	// (never the host's), rather than as "user". Only with RootLayers.
	Root bool
	// ExportRoot: the sandbox's writable layer can be read back by the
	// host as an image layer (backend.RootExporter), as a template build
	// does. Only with RootLayers.
	ExportRoot bool
}

// Mount makes a host path visible inside the sandbox.
type Mount struct {
	Source   string // absolute host path
	Target   string // absolute path inside the sandbox
	ReadOnly bool
	// IDMapped: the source's owners are ids as sandboxes see them (a
	// volume's), not the host's: uid 1000 there is "user" in every
	// sandbox that mounts it. Otherwise its files keep their host owners.
	IDMapped bool
}

// Default returns the built-in defaults (see DESIGN.md).
func Default() Policy {
	return Policy{
		MemoryBytes: 512 << 20,
		Pids:        256,
		CPUs:        1,
		Timeout:     60 * time.Second,
		OutputLimit: 10 << 20,
		DiskBytes:   1 << 30,
		Workdir:     "/home/user",
	}
}

// WritableBytes is how much the sandbox's writable file systems hold in
// all: the disk limit, but never more than the memory limit less a
// reserve. They are tmpfs, charged to the sandbox's memory: were they
// allowed the whole memory limit, filling /tmp would end in an OOM kill
// of whichever process is largest, often the agent or init (or, on
// gVisor, the Sentry, the whole sandbox), where the writer should get
// ENOSPC and the sandbox live on. The reserve (a quarter of the memory,
// at most 256 MiB) is the room its processes keep with the disk full.
func (p *Policy) WritableBytes() int64 {
	reserve := min(p.MemoryBytes/4, 256<<20)
	return max(min(p.DiskBytes, p.MemoryBytes-reserve), 0)
}

// WritableInodes is how many files and directories the writable file
// systems hold: one per 4 KiB page of their space. Each costs the kernel
// about 1 KiB of the sandbox's memory that no reclaim can free, so without
// a bound empty files alone would fill the memory limit.
func (p *Policy) WritableInodes() int64 {
	return max(p.WritableBytes()/4096, 1024)
}

// Bounds below which a sandbox cannot do useful work; values under them are
// almost always a typo (256 instead of 256M) and are rejected rather than
// silently producing a sandbox that dies at start.
const (
	maxLayers = 127
	minMemory = 16 << 20
	minDisk   = 1 << 20
	maxCPUs   = 1024
)

// reservedTargets are the sandbox paths Airlock builds itself; a mount over
// them would replace a protection (/proc, /dev) or the code it runs.
// The merged-/usr links (/bin → usr/bin …) are reserved too: a target
// below one would be resolved through the symlink into /usr.
var reservedTargets = []string{"/", "/proc", "/dev", "/etc", "/usr", "/.airlock",
	"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}

// Validate reports the first problem with p, as a message fit for the user.
func (p *Policy) Validate() error {
	switch {
	case p.MemoryBytes < minMemory:
		return fmt.Errorf("memory limit %s is below the minimum %s", FormatSize(p.MemoryBytes), FormatSize(minMemory))
	case p.Pids < 1:
		return fmt.Errorf("pids limit must be at least 1, got %d", p.Pids)
	case !(p.CPUs > 0) || p.CPUs > maxCPUs: // also rejects NaN
		return fmt.Errorf("cpus must be greater than 0 and at most %d, got %g", maxCPUs, p.CPUs)
	case p.Timeout <= 0:
		return fmt.Errorf("timeout must be positive, got %s", p.Timeout)
	case p.OutputLimit < 0:
		return fmt.Errorf("output limit must not be negative, got %d", p.OutputLimit)
	case p.DiskBytes < minDisk:
		return fmt.Errorf("disk limit %s is below the minimum %s", FormatSize(p.DiskBytes), FormatSize(minDisk))
	}
	if err := p.Network.Validate(); err != nil {
		return err
	}
	if len(p.RootLayers) > maxLayers {
		return fmt.Errorf("an image of %d layers: at most %d are allowed", len(p.RootLayers), maxLayers)
	}
	for _, l := range p.RootLayers {
		if !path.IsAbs(l) || path.Clean(l) != l {
			return fmt.Errorf("image layer %q is not a clean absolute path", l)
		}
	}
	if p.Root && len(p.RootLayers) == 0 {
		return errors.New("root inside is for sandboxes of templates made from images")
	}
	if p.ExportRoot && len(p.RootLayers) == 0 {
		return errors.New("only the writable layer of an image's root can be exported")
	}
	if err := checkSandboxPath("workdir", p.Workdir); err != nil {
		return err
	}
	for _, kv := range p.Env {
		if err := checkEnv(kv); err != nil {
			return err
		}
	}
	for _, m := range p.Mounts {
		if !path.IsAbs(m.Source) {
			return fmt.Errorf("mount source %q is not an absolute path", m.Source)
		}
		if err := checkSandboxPath("mount target", m.Target); err != nil {
			return err
		}
		for _, r := range reservedTargets {
			if m.Target == r || (r != "/" && strings.HasPrefix(m.Target, r+"/")) {
				return fmt.Errorf("mount target %q is reserved by the sandbox", m.Target)
			}
		}
	}
	// No target inside another: its path would be resolved through a host
	// directory, where the sandbox may have planted symlinks or FIFOs.
	for i, a := range p.Mounts {
		for _, b := range p.Mounts[i+1:] {
			if a.Target == b.Target || strings.HasPrefix(b.Target, a.Target+"/") || strings.HasPrefix(a.Target, b.Target+"/") {
				return fmt.Errorf("mount targets %q and %q overlap", a.Target, b.Target)
			}
		}
	}
	return nil
}

func checkSandboxPath(what, p string) error {
	switch {
	case p == "":
		return fmt.Errorf("%s is empty", what)
	case !path.IsAbs(p):
		return fmt.Errorf("%s %q is not an absolute path", what, p)
	case path.Clean(p) != p:
		return fmt.Errorf("%s %q is not a clean path", what, p)
	case strings.ContainsRune(p, 0):
		return fmt.Errorf("%s contains a NUL byte", what)
	}
	return nil
}

// CheckEnv reports whether kv is a KEY=VALUE environment entry a
// sandbox can be given.
func CheckEnv(kv string) error { return checkEnv(kv) }

func checkEnv(kv string) error {
	k, _, ok := strings.Cut(kv, "=")
	switch {
	case !ok:
		return fmt.Errorf("environment entry %q is not KEY=VALUE", kv)
	case k == "":
		return errors.New("environment entry has an empty name")
	case strings.ContainsRune(kv, 0):
		return fmt.Errorf("environment entry %q contains a NUL byte", k)
	}
	return nil
}

// ParseMount parses SRC:DST[:ro|:rw]. A relative SRC is resolved against
// cwd; DST must be absolute. Mounts are read-only unless ":rw" is given.
func ParseMount(s, cwd string) (Mount, error) {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
		return Mount{}, fmt.Errorf("mount %q is not SRC:DST[:ro|:rw]", s)
	}
	m := Mount{Source: parts[0], Target: parts[1], ReadOnly: true}
	if len(parts) == 3 {
		switch parts[2] {
		case "ro":
		case "rw":
			m.ReadOnly = false
		default:
			return Mount{}, fmt.Errorf("mount %q: mode must be ro or rw, got %q", s, parts[2])
		}
	}
	if !path.IsAbs(m.Source) {
		m.Source = path.Join(cwd, m.Source)
	}
	m.Source = path.Clean(m.Source)
	return m, nil
}
