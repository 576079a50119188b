// Package cgroups creates, limits, measures, freezes and removes the
// control group of one sandbox, on cgroup v1 or v2 alike, so that no
// backend ever branches on the version.
package cgroups

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// This package drives cgroupfs directly instead of through containerd's
// cgroups package: that package (with its protobuf and D-Bus dependencies)
// added 0.8 ms to every start of the airlock binary, which starts twice per
// sandbox, and the sandbox needs only a handful of files. What it writes is
// the same interface runc and containerd write.

// Root is where both cgroup versions are mounted on the hosts we support.
const Root = "/sys/fs/cgroup"

// Prefix begins the name of every cgroup Airlock creates, so that a later
// start can find the ones a crashed run left behind.
const Prefix = "airlock-"

// Limits are what a sandbox may use; every one is applied or the cgroup
// is not made.
type Limits struct {
	MemoryBytes int64 // memory, with no swap beyond it
	Pids        int64 // tasks: processes and threads
	CPUs        float64
}

// Stats is what a sandbox consumed.
type Stats struct {
	Memory    int64 // now
	MaxMemory int64 // highest so far
	// Cache is the part of Memory that is page cache of files (not of
	// tmpfs or shared memory, which is what gVisor's own memory file
	// is): what the kernel can drop or write back under pressure.
	Cache    int64
	OOMKills uint64
	CPU      time.Duration // used so far
}

// ErrNotPausable: the cgroup is not in a freezer hierarchy (a one-shot
// run's, or the host mounts none).
var ErrNotPausable = errors.New("this sandbox cannot be paused")

// tree is a host's cgroup file systems: where they are mounted, which
// version they are, and the two things only the kernel does to them. The
// host's is hostTree; tests make one of a temporary directory, a fake
// cgroupfs whose rmdir and kill they simulate.
type tree struct {
	root    string
	unified bool // cgroup v2 only
	// v1 hierarchies a sandbox joins (v1Controllers): a one-shot run's
	// and a live sandbox's.
	oneShot, live []string
	// rmdir removes a cgroup directory, which on cgroupfs holds its
	// control files and goes with them.
	rmdir func(dir string) error
	// kill SIGKILLs pid, if it is in cgroup name.
	kill func(pid int, name string)
}

// hostTree is the host's cgroup file systems, at Root.
var hostTree = sync.OnceValue(func() *tree { return newTree(Root, Unified(), unix.Rmdir, killInCgroup) })

func newTree(root string, unified bool, rmdir func(string) error, kill func(int, string)) *tree {
	t := &tree{root: root, unified: unified, rmdir: rmdir, kill: kill}
	if !unified {
		t.oneShot = distinctHierarchies(root, "memory", "pids", "cpu")
		t.live = distinctHierarchies(root, "memory", "pids", "cpu", "cpuacct?", "freezer?")
	}
	return t
}

// v1Controllers lists the v1 hierarchies a sandbox joins: its three
// limits; a live sandbox (one that serves, rather than runs one command)
// also cpuacct, for the CPU time it has used so far, and freezer, to be
// paused. A one-shot run needs neither: init's rusage says what it used,
// as it includes every reaped descendant. Killing needs no freezer: the
// pid namespace dies with its init, and no process of a dead pid
// namespace can fork. A hierarchy mounted under two names (cpu,cpuacct on
// many hosts) is listed once.
func (t *tree) v1Controllers(live bool) []string {
	if live {
		return t.live
	}
	return t.oneShot
}

// distinctHierarchies lists the v1 hierarchies named, each once. A name
// ending in "?" is optional: left out where the host does not mount it
// (a live sandbox then cannot report CPU time, or be paused). The others
// are limits: without them newCgroup fails, as it must.
func distinctHierarchies(root string, names ...string) []string {
	var list []string
	seen := map[string]bool{}
	for _, c := range names {
		c, optional := strings.CutSuffix(c, "?")
		dir, err := filepath.EvalSymlinks(filepath.Join(root, c))
		if err != nil && optional {
			continue
		}
		if err != nil {
			dir = c
		}
		if !seen[dir] {
			seen[dir] = true
			list = append(list, c)
		}
	}
	return list
}

// impl is one cgroup version's way of doing what Cgroup does.
type impl interface {
	// enter arranges for the sandbox's first process to be in the cgroup
	// before it runs user code: on v2 by setting CLONE_INTO_CGROUP in
	// attr; on v1 by returning the files that process writes itself into.
	// release closes what enter opened, once the process has started.
	enter(attr *syscall.SysProcAttr) (tasks []*os.File, release func(), err error)
	// kill ends every process in the cgroup and returns once it is empty.
	kill() error
	stats() (Stats, error)
	// lower sets limits no higher than the cgroup's (a pooled sandbox
	// handed out under lower limits).
	lower(l Limits) error
	// setCPUs sets the CPU quota alone, higher or lower.
	setCPUs(cpus float64) error
	// destroy removes the cgroup; it must be empty.
	destroy() error
	// freeze stops (true) or restarts every process in the cgroup, and
	// returns once the kernel says it is done.
	freeze(ctx context.Context, on bool) error
}

// Unified reports whether the host runs cgroup v2 only. A hybrid
// host (v1 controllers plus an empty v2 mount, like ours) counts as v1.
func Unified() bool {
	var st unix.Statfs_t
	return unix.Statfs(Root, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// create makes the cgroup name with l's limits, for a live sandbox or a
// one-shot run (v1Controllers). It fails when any limit cannot be
// applied: a sandbox never runs unlimited.
func (t *tree) create(name string, l Limits, live bool) (impl, error) {
	if t.unified {
		return newV2(t, filepath.Join(t.root, name), l)
	}
	return newV1(t, name, l, live)
}

// cpuQuota is l's CPU limit as a CFS quota per period, in µs.
func cpuQuota(l Limits) (quota, period int64) {
	period = 100_000
	return max(int64(l.CPUs*float64(period)), 1000), period // the kernel's minimum is 1 ms
}

// Cgroup is one sandbox's control group. Airlock creates and removes it
// on every backend (gVisor's runsc is handed its path and joins it as it
// finds it), so limits, statistics, kills and crash cleanup have one
// implementation, and the cgroup outlives a runtime's own bookkeeping long
// enough to read what the sandbox consumed.
type Cgroup struct {
	t    *tree
	g    impl
	name string
}

// New creates cgroup name (Prefix and an id) with l's limits. A live
// sandbox's (one that serves, rather than runs one command) also counts
// CPU time as it goes and can be frozen.
func New(name string, l Limits, live bool) (*Cgroup, error) {
	return hostTree().newCgroup(name, l, live)
}

func (t *tree) newCgroup(name string, l Limits, live bool) (*Cgroup, error) {
	g, err := t.create(name, l, live)
	if err != nil {
		return nil, err
	}
	return &Cgroup{t: t, g: g, name: name}, nil
}

// Load returns cgroup name as a sandbox may have left it, for cleanup: in
// every hierarchy a sandbox may have joined.
func Load(name string) *Cgroup { return hostTree().load(name) }

func (t *tree) load(name string) *Cgroup {
	if t.unified {
		return &Cgroup{t: t, g: cgroupV2{t: t, dir: filepath.Join(t.root, name)}, name: name}
	}
	return &Cgroup{t: t, g: cgroupV1{t: t, name: name, controllers: t.v1Controllers(true)}, name: name}
}

// Path is the cgroup's path below each hierarchy's root, the form of an
// OCI spec's linux.cgroupsPath.
func (c *Cgroup) Path() string { return "/" + c.name }

// Holds reports whether process pid is in the cgroup or below it: in its
// memory hierarchy on v1 (every sandbox has one), in the unified one on v2.
func (c *Cgroup) Holds(pid int) (bool, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return false, err
	}
	return holds(string(data), c.Path(), c.t.unified), nil
}

// holds reports whether the /proc/PID/cgroup text self places its process
// in cgroup path or below.
func holds(self, path string, unified bool) bool {
	for line := range strings.Lines(self) {
		// hierarchy-ID:controller-list:cgroup-path
		parts := strings.SplitN(strings.TrimSuffix(line, "\n"), ":", 3)
		if len(parts) != 3 {
			continue
		}
		mine := unified && parts[0] == "0" && parts[1] == ""
		if !unified {
			mine = slices.Contains(strings.Split(parts[1], ","), "memory")
		}
		if mine {
			return parts[2] == path || strings.HasPrefix(parts[2], path+"/")
		}
	}
	return false
}

// Enter arranges for a sandbox's first process to be in the cgroup before
// it runs user code: on v2 by setting CLONE_INTO_CGROUP in attr; on v1 by
// returning the "tasks" files that process writes itself into (v1 has no
// way to be born in a cgroup). release closes what Enter opened, once the
// process has started.
func (c *Cgroup) Enter(attr *syscall.SysProcAttr) (tasks []*os.File, release func(), err error) {
	return c.g.enter(attr)
}

// Stats reads what the sandbox consumed so far.
func (c *Cgroup) Stats() (Stats, error) { return c.g.stats() }

// Lower sets l's limits, each no higher than the cgroup's own: a sandbox
// of a pool, handed out under a request's lower limits. Memory in use
// beyond the new limit is reclaimed, or the write fails.
func (c *Cgroup) Lower(l Limits) error { return c.g.lower(l) }

// SetCPUs sets the cgroup's CPU quota to cpus cores, above its limit as
// well as below: for work done for a sandbox rather than by it (a
// restore), which the caller sets back.
func (c *Cgroup) SetCPUs(cpus float64) error { return c.g.setCPUs(cpus) }

// Freeze stops every process in the cgroup (true) or restarts them, and
// returns once the kernel says it is done.
func (c *Cgroup) Freeze(ctx context.Context, on bool) error { return c.g.freeze(ctx, on) }

// Kill ends every process in the cgroup and returns once it is empty.
func (c *Cgroup) Kill() error { return c.g.kill() }

// Destroy removes the cgroup from the hierarchies Airlock put it in; it
// must be empty (Kill).
func (c *Cgroup) Destroy() error { return c.g.destroy() }

// Remove kills every process left in the cgroup and removes it from every
// hierarchy: runsc adds the cgroup to ones Airlock leaves alone (blkio,
// cpuset, devices, freezer…), and a runsc killed before it recorded them
// leaves them to whoever removes the sandbox.
func (c *Cgroup) Remove() error {
	if err := c.g.kill(); err != nil {
		return err
	}
	if err := c.g.destroy(); err != nil {
		return err
	}
	if c.t.unified {
		return nil
	}
	others, _ := filepath.Glob(filepath.Join(c.t.root, "*", c.name))
	for _, dir := range others {
		if err := c.t.remove(dir); err != nil {
			return err
		}
	}
	return nil
}

// SweepOrphans removes empty sandbox cgroups older than minAge, such as
// those of a state directory deleted while its sandboxes ran, which no
// lock file accounts for. A cgroup that still has processes refuses
// rmdir, so a live sandbox is never touched; minAge must exceed the time a
// sandbox may take between creating its cgroup and starting its first
// process. It reads every controller's top directory: a daemon runs it at
// start, not airlock run before each sandbox.
func SweepOrphans(minAge time.Duration) { hostTree().sweepOrphans(minAge) }

func (t *tree) sweepOrphans(minAge time.Duration) {
	dirs := []string{t.root}
	if !t.unified {
		// Every hierarchy: gVisor sandboxes have cgroups in all of them.
		dirs, _ = filepath.Glob(filepath.Join(t.root, "*"))
	}
	for _, d := range dirs {
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			if !e.IsDir() || !strings.HasPrefix(e.Name(), Prefix) {
				continue
			}
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > minAge {
				_ = t.rmdir(filepath.Join(d, e.Name()))
			}
		}
	}
}
