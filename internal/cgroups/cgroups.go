// Package cgroups creates, limits, measures, freezes and removes the
// control group of one sandbox, on cgroup v1 or v2 alike, so that no
// backend ever branches on the version.
package cgroups

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// This file drives cgroupfs directly instead of through containerd's
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

// v1Controllers lists the v1 hierarchies a sandbox joins: its three
// limits; a live sandbox (one that serves, rather than runs one command)
// also cpuacct, for the CPU time it has used so far, and freezer, to be
// paused. A one-shot run needs neither: init's rusage says what it used,
// as it includes every reaped descendant. Killing needs no freezer: the
// pid namespace dies with its init, and no process of a dead pid
// namespace can fork. A hierarchy mounted under two names (cpu,cpuacct on
// many hosts) is listed once.
func v1Controllers(live bool) []string {
	if live {
		return v1Live()
	}
	return v1OneShot()
}

var (
	v1OneShot = sync.OnceValue(func() []string { return distinctHierarchies("memory", "pids", "cpu") })
	v1Live    = sync.OnceValue(func() []string { return distinctHierarchies("memory", "pids", "cpu", "cpuacct?", "freezer?") })
)

// distinctHierarchies lists the v1 hierarchies named, each once. A name
// ending in "?" is optional: left out where the host does not mount it
// (a live sandbox then cannot report CPU time, or be paused). The others
// are limits: without them newCgroup fails, as it must.
func distinctHierarchies(names ...string) []string {
	var list []string
	seen := map[string]bool{}
	for _, c := range names {
		c, optional := strings.CutSuffix(c, "?")
		dir, err := filepath.EvalSymlinks(filepath.Join(Root, c))
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

// Stats is what a sandbox consumed.
type Stats struct {
	Memory    int64 // now
	MaxMemory int64 // highest so far
	OOMKills  uint64
	CPU       time.Duration // used so far
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

// newImpl creates the cgroup name with l's limits, for a live sandbox or a
// one-shot run (v1Controllers). It fails when any limit cannot be
// applied: a sandbox never runs unlimited.
func newImpl(name string, l Limits, live bool) (impl, error) {
	quota, period := cpuQuota(l)
	mem := strconv.FormatInt(l.MemoryBytes, 10)
	pids := strconv.FormatInt(l.Pids, 10)
	if Unified() {
		return newV2(filepath.Join(Root, name), l)
	}
	g := cgroupV1{name: name, controllers: v1Controllers(live)}
	limits := map[string][][2]string{
		// memsw is memory+swap: equal to the memory limit means no swap.
		// It must be written after the memory limit, never below it.
		"memory": {{"memory.limit_in_bytes", mem}, {"memory.memsw.limit_in_bytes", mem}},
		"pids":   {{"pids.max", pids}},
		"cpu":    {{"cpu.cfs_period_us", strconv.FormatInt(period, 10)}, {"cpu.cfs_quota_us", strconv.FormatInt(quota, 10)}},
	}
	for _, c := range g.controllers {
		dir := g.dir(c)
		if err := os.Mkdir(dir, 0o755); err != nil {
			_ = g.destroy()
			return nil, fmt.Errorf("create cgroup: %w", err)
		}
		for _, kv := range limits[c] {
			if err := writeFile(dir, kv[0], kv[1]); err != nil {
				_ = g.destroy()
				return nil, err
			}
		}
	}
	return g, nil
}

// cpuQuota is l's CPU limit as a CFS quota per period, in µs.
func cpuQuota(l Limits) (quota, period int64) {
	period = 100_000
	return max(int64(l.CPUs*float64(period)), 1000), period // the kernel's minimum is 1 ms
}

// newV2 creates the cgroup v2 directory dir with l's limits.
func newV2(dir string, l Limits) (impl, error) {
	quota, period := cpuQuota(l)
	g := cgroupV2{dir: dir}
	err := g.create([][2]string{
		{"memory.max", strconv.FormatInt(l.MemoryBytes, 10)},
		{"memory.swap.max", "0"},
		{"pids.max", strconv.FormatInt(l.Pids, 10)},
		{"cpu.max", fmt.Sprintf("%d %d", quota, period)},
	})
	if err != nil {
		_ = g.destroy()
		return nil, err
	}
	return g, nil
}

// waitFile polls file until done says its content is what it waits for,
// for at most 5 s or until ctx ends.
func waitFile(ctx context.Context, dir, file string, done func(string) bool) error {
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if err := ctx.Err(); err != nil {
			return err
		}
		data, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			return err
		}
		if done(strings.TrimSpace(string(data))) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: %s stayed %q", filepath.Base(dir), file, strings.TrimSpace(string(data)))
		}
	}
}

func writeFile(dir, file string, value string) error {
	if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0); err != nil {
		return fmt.Errorf("set cgroup %s: %w", file, err)
	}
	return nil
}

func readUint(dir, file string) (uint64, error) {
	data, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(string(bytes.TrimSpace(data)), 10, 64)
}

// readKey returns the value of "key N" in a flat-keyed cgroup file.
func readKey(dir, file, key string) (uint64, error) {
	data, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key+" "); ok {
			return strconv.ParseUint(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("%s: no %s", file, key)
}

// pids lists the processes in a cgroup directory's cgroup.procs.
func pids(dir string) ([]int, error) {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// killAll SIGKILLs every process listed in dir until none is left. Without
// a freezer a process can fork between listing and killing; the next round
// catches the child, and the pids limit bounds how many rounds there are.
// Each kill goes through a pidfd taken after checking that the pid is
// still in this cgroup, so a pid reused by a host process is never hit.
func killAll(dir string) error {
	name := filepath.Base(dir)
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids, err := pids(dir)
		if errors.Is(err, os.ErrNotExist) || (err == nil && len(pids) == 0) {
			return nil
		}
		if err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d processes survived SIGKILL", len(pids))
		}
		for _, pid := range pids {
			killInCgroup(pid, name)
		}
		time.Sleep(time.Millisecond)
	}
}

func killInCgroup(pid int, cgroupName string) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return // gone
	}
	defer unix.Close(fd)
	// With the pidfd held, pid cannot be reused: check it is ours. On v1
	// a single thread may be in the cgroup (init's forking thread), so
	// every thread counts.
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, task := range tasks {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/cgroup", pid, task.Name()))
		if err == nil && strings.Contains(string(data), "/"+cgroupName+"\n") {
			_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
			return
		}
	}
}

// rmdir removes a cgroup directory. The kernel can answer EBUSY for
// a moment after the last process left, while it finishes tearing it down.
func rmdir(dir string) error {
	for i := 0; ; i++ {
		err := unix.Rmdir(dir)
		switch {
		case err == nil || errors.Is(err, unix.ENOENT):
			return nil
		case errors.Is(err, unix.EBUSY) && i < 100:
			time.Sleep(time.Millisecond)
		default:
			return fmt.Errorf("remove cgroup %s: %w", filepath.Base(dir), err)
		}
	}
}

type cgroupV1 struct {
	name        string   // directory name below each controller's root
	controllers []string // the hierarchies it is in
}

func (g cgroupV1) dir(controller string) string {
	return filepath.Join(Root, controller, g.name)
}

func (g cgroupV1) enter(*syscall.SysProcAttr) ([]*os.File, func(), error) {
	var files []*os.File
	release := func() {
		for _, f := range files {
			f.Close()
		}
	}
	for _, c := range g.controllers {
		f, err := os.OpenFile(filepath.Join(g.dir(c), "tasks"), os.O_WRONLY, 0)
		if err != nil {
			release()
			return nil, nil, fmt.Errorf("open cgroup: %w", err)
		}
		files = append(files, f)
	}
	return files, release, nil
}

// kill thaws the cgroup first, as far as it can: a frozen process does not
// die of SIGKILL until it runs again (and one that stays frozen makes
// killAll fail). A one-shot run, or a leftover of one, has no freezer.
func (g cgroupV1) kill() error {
	_ = g.freeze(context.Background(), false)
	return killAll(g.dir("pids"))
}

// ErrNotPausable: the cgroup is not in a freezer hierarchy (a one-shot
// run's, or the host mounts none).
var ErrNotPausable = errors.New("this sandbox cannot be paused")

func (g cgroupV1) freeze(ctx context.Context, on bool) error {
	if !slices.Contains(g.controllers, "freezer") {
		return ErrNotPausable
	}
	dir, want := g.dir("freezer"), "THAWED"
	if on {
		want = "FROZEN"
	}
	if err := writeFile(dir, "freezer.state", want); err != nil {
		return err
	}
	// FREEZING until every task has stopped.
	return waitFile(ctx, dir, "freezer.state", func(s string) bool { return s == want })
}

func (g cgroupV1) stats() (Stats, error) {
	mem := g.dir("memory")
	maxMem, err := readUint(mem, "memory.max_usage_in_bytes")
	if err != nil {
		return Stats{}, err
	}
	cur, err := readUint(mem, "memory.usage_in_bytes")
	if err != nil {
		return Stats{}, err
	}
	// memory.failcnt is not reliable on v1 (it stayed 0 after OOM kills
	// here); the oom_kill counter is.
	oom, err := readKey(mem, "memory.oom_control", "oom_kill")
	if err != nil {
		return Stats{}, err
	}
	st := Stats{Memory: int64(cur), MaxMemory: int64(maxMem), OOMKills: oom}
	// CPU time so far, where the sandbox has a cpuacct cgroup (a live
	// one, or any where cpuacct shares the cpu hierarchy).
	if cpu, err := readUint(g.dir("cpuacct"), "cpuacct.usage"); err == nil {
		st.CPU = time.Duration(cpu) // ns
	}
	return st, nil
}

func (g cgroupV1) destroy() error {
	var errs []error
	for _, c := range g.controllers {
		errs = append(errs, rmdir(g.dir(c)))
	}
	return errors.Join(errs...)
}

type cgroupV2 struct {
	dir string
}

func (g cgroupV2) create(limits [][2]string) error {
	if err := os.Mkdir(g.dir, 0o755); err != nil {
		return fmt.Errorf("create cgroup: %w", err)
	}
	for _, kv := range limits {
		if err := writeFile(g.dir, kv[0], kv[1]); err != nil {
			return fmt.Errorf("%w (are the memory, pids and cpu controllers enabled in %s/cgroup.subtree_control?)", err, Root)
		}
	}
	return nil
}

func (g cgroupV2) enter(attr *syscall.SysProcAttr) ([]*os.File, func(), error) {
	dir, err := os.Open(g.dir)
	if err != nil {
		return nil, nil, fmt.Errorf("open cgroup: %w", err)
	}
	attr.UseCgroupFD, attr.CgroupFD = true, int(dir.Fd())
	return nil, func() { dir.Close() }, nil
}

func (g cgroupV2) freeze(ctx context.Context, on bool) error {
	v, want := "0", "frozen 0"
	if on {
		v, want = "1", "frozen 1"
	}
	if err := writeFile(g.dir, "cgroup.freeze", v); err != nil {
		return err
	}
	return waitFile(ctx, g.dir, "cgroup.events", func(s string) bool { return slices.Contains(strings.Split(s, "\n"), want) })
}

func (g cgroupV2) kill() error {
	// cgroup.kill (Linux 5.14) kills atomically, forks included.
	if err := writeFile(g.dir, "cgroup.kill", "1"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return killAll(g.dir)
}

func (g cgroupV2) stats() (Stats, error) {
	cur, err := readUint(g.dir, "memory.current")
	if err != nil {
		return Stats{}, err
	}
	// memory.peak came with Linux 5.19; before it, the highest use seen
	// is not kept, and the current one is the best there is.
	peak, err := readUint(g.dir, "memory.peak")
	if errors.Is(err, os.ErrNotExist) {
		peak, err = cur, nil
	}
	if err != nil {
		return Stats{}, err
	}
	oom, err := readKey(g.dir, "memory.events", "oom_kill")
	if err != nil {
		return Stats{}, err
	}
	cpu, err := readKey(g.dir, "cpu.stat", "usage_usec")
	if err != nil {
		return Stats{}, err
	}
	return Stats{Memory: int64(cur), MaxMemory: int64(peak), OOMKills: oom, CPU: time.Duration(cpu) * time.Microsecond}, nil
}

func (g cgroupV2) destroy() error { return rmdir(g.dir) }

// Cgroup is one sandbox's control group. Airlock creates and removes it
// on every backend (gVisor's runsc is handed its path and joins it as it
// finds it), so limits, statistics, kills and crash cleanup have one
// implementation, and the cgroup outlives a runtime's own bookkeeping long
// enough to read what the sandbox consumed.
type Cgroup struct {
	g    impl
	name string
}

// New creates cgroup name (Prefix and an id) with l's limits. A live
// sandbox's (one that serves, rather than runs one command) also counts
// CPU time as it goes and can be frozen.
func New(name string, l Limits, live bool) (*Cgroup, error) {
	g, err := newImpl(name, l, live)
	if err != nil {
		return nil, err
	}
	return &Cgroup{g: g, name: name}, nil
}

// Load returns cgroup name as a sandbox may have left it, for cleanup: in
// every hierarchy a sandbox may have joined.
func Load(name string) *Cgroup {
	if Unified() {
		return &Cgroup{g: cgroupV2{dir: filepath.Join(Root, name)}, name: name}
	}
	return &Cgroup{g: cgroupV1{name: name, controllers: v1Controllers(true)}, name: name}
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
	return holds(string(data), c.Path(), Unified()), nil
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
	if Unified() {
		return nil
	}
	others, _ := filepath.Glob(filepath.Join(Root, "*", c.name))
	for _, dir := range others {
		if err := rmdir(dir); err != nil {
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
func SweepOrphans(minAge time.Duration) {
	dirs := []string{Root}
	if !Unified() {
		// Every hierarchy: gVisor sandboxes have cgroups in all of them.
		dirs, _ = filepath.Glob(filepath.Join(Root, "*"))
	}
	for _, d := range dirs {
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			if !e.IsDir() || !strings.HasPrefix(e.Name(), Prefix) {
				continue
			}
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > minAge {
				_ = unix.Rmdir(filepath.Join(d, e.Name()))
			}
		}
	}
}
