package namespaces

import (
	"bufio"
	"bytes"
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

	"github.com/airlock-sandbox/airlock/internal/policy"
)

// This file drives cgroupfs directly instead of through containerd's
// cgroups package: that package (with its protobuf and D-Bus dependencies)
// added 0.8 ms to every start of the airlock binary, which starts twice per
// sandbox, and the sandbox needs only a handful of files. What it writes is
// the same interface runc and containerd write.

// cgroupRoot is where both cgroup versions are mounted on the hosts we support.
const cgroupRoot = "/sys/fs/cgroup"

// cgroupPrefix names every cgroup Airlock creates, so that a later start can
// find the ones a crashed run left behind.
const cgroupPrefix = "airlock-"

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
		dir, err := filepath.EvalSymlinks(filepath.Join(cgroupRoot, c))
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

// cgroupStats is what a finished sandbox consumed.
type cgroupStats struct {
	Memory    int64 // now
	MaxMemory int64 // highest so far
	OOMKills  uint64
	CPU       time.Duration // used so far
}

// cgroup is one sandbox's control group, on whichever cgroup version the
// host runs, so the rest of the backend never branches on v1/v2.
type cgroup interface {
	// enter arranges for the sandbox's first process to be in the cgroup
	// before it runs user code: on v2 by setting CLONE_INTO_CGROUP in
	// attr; on v1 by returning the files that process writes itself into.
	// release closes what enter opened, once the process has started.
	enter(attr *syscall.SysProcAttr) (tasks []*os.File, release func(), err error)
	// kill ends every process in the cgroup and returns once it is empty.
	kill() error
	stats() (cgroupStats, error)
	// destroy removes the cgroup; it must be empty.
	destroy() error
	// freeze stops (true) or restarts every process in the cgroup, and
	// returns once the kernel says it is done.
	freeze(bool) error
}

// unifiedHierarchy reports whether the host runs cgroup v2 only. A hybrid
// host (v1 controllers plus an empty v2 mount, like ours) counts as v1.
func unifiedHierarchy() bool {
	var st unix.Statfs_t
	return unix.Statfs(cgroupRoot, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// newCgroup creates the cgroup of sandbox id with p's limits, for a live
// sandbox or a one-shot run (v1Controllers). It fails when any limit
// cannot be applied: a sandbox never runs unlimited.
func newCgroup(id string, p *policy.Policy, live bool) (cgroup, error) {
	quota, period := cpuQuota(p)
	mem := strconv.FormatInt(p.MemoryBytes, 10)
	pids := strconv.FormatInt(p.Pids, 10)
	name := cgroupPrefix + id
	if unifiedHierarchy() {
		return newCgroupV2(filepath.Join(cgroupRoot, name), p)
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
			if err := writeCgroupFile(dir, kv[0], kv[1]); err != nil {
				_ = g.destroy()
				return nil, err
			}
		}
	}
	return g, nil
}

// cpuQuota is p's CPU limit as a CFS quota per period, in µs.
func cpuQuota(p *policy.Policy) (quota, period int64) {
	period = 100_000
	return max(int64(p.CPUs*float64(period)), 1000), period // the kernel's minimum is 1 ms
}

// newCgroupV2 creates the cgroup v2 directory dir with p's limits.
func newCgroupV2(dir string, p *policy.Policy) (cgroup, error) {
	quota, period := cpuQuota(p)
	g := cgroupV2{dir: dir}
	err := g.create([][2]string{
		{"memory.max", strconv.FormatInt(p.MemoryBytes, 10)},
		{"memory.swap.max", "0"},
		{"pids.max", strconv.FormatInt(p.Pids, 10)},
		{"cpu.max", fmt.Sprintf("%d %d", quota, period)},
	})
	if err != nil {
		_ = g.destroy()
		return nil, err
	}
	return g, nil
}

// waitCgroupFile polls file until done says its content is what it
// waits for, for at most 5 s.
func waitCgroupFile(dir, file string, done func(string) bool) error {
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
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

func writeCgroupFile(dir, file string, value string) error {
	if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0); err != nil {
		return fmt.Errorf("set cgroup %s: %w", file, err)
	}
	return nil
}

func readCgroupUint(dir, file string) (uint64, error) {
	data, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(string(bytes.TrimSpace(data)), 10, 64)
}

// readCgroupKey returns the value of "key N" in a flat-keyed cgroup file.
func readCgroupKey(dir, file, key string) (uint64, error) {
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

// cgroupPIDs lists the processes in a cgroup directory's cgroup.procs.
func cgroupPIDs(dir string) ([]int, error) {
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
		pids, err := cgroupPIDs(dir)
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

// rmdirCgroup removes a cgroup directory. The kernel can answer EBUSY for
// a moment after the last process left, while it finishes tearing it down.
func rmdirCgroup(dir string) error {
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
	return filepath.Join(cgroupRoot, controller, g.name)
}

func (g cgroupV1) enter(*syscall.SysProcAttr) ([]*os.File, func(), error) {
	var files []*os.File
	release := func() { closeAll(files) }
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
	_ = g.freeze(false)
	return killAll(g.dir("pids"))
}

// errNotPausable: the sandbox is not in a freezer cgroup (a one-shot run).
var errNotPausable = errors.New("this sandbox cannot be paused")

func (g cgroupV1) freeze(on bool) error {
	if !slices.Contains(g.controllers, "freezer") {
		return errNotPausable
	}
	dir, want := g.dir("freezer"), "THAWED"
	if on {
		want = "FROZEN"
	}
	if err := writeCgroupFile(dir, "freezer.state", want); err != nil {
		return err
	}
	// FREEZING until every task has stopped.
	return waitCgroupFile(dir, "freezer.state", func(s string) bool { return s == want })
}

func (g cgroupV1) stats() (cgroupStats, error) {
	mem := g.dir("memory")
	maxMem, err := readCgroupUint(mem, "memory.max_usage_in_bytes")
	if err != nil {
		return cgroupStats{}, err
	}
	cur, err := readCgroupUint(mem, "memory.usage_in_bytes")
	if err != nil {
		return cgroupStats{}, err
	}
	// memory.failcnt is not reliable on v1 (it stayed 0 after OOM kills
	// here); the oom_kill counter is.
	oom, err := readCgroupKey(mem, "memory.oom_control", "oom_kill")
	if err != nil {
		return cgroupStats{}, err
	}
	st := cgroupStats{Memory: int64(cur), MaxMemory: int64(maxMem), OOMKills: oom}
	// CPU time so far, where the sandbox has a cpuacct cgroup (a live
	// one, or any where cpuacct shares the cpu hierarchy).
	if cpu, err := readCgroupUint(g.dir("cpuacct"), "cpuacct.usage"); err == nil {
		st.CPU = time.Duration(cpu) // ns
	}
	return st, nil
}

func (g cgroupV1) destroy() error {
	var errs []error
	for _, c := range g.controllers {
		errs = append(errs, rmdirCgroup(g.dir(c)))
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
		if err := writeCgroupFile(g.dir, kv[0], kv[1]); err != nil {
			return fmt.Errorf("%w (are the memory, pids and cpu controllers enabled in %s/cgroup.subtree_control?)", err, cgroupRoot)
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

func (g cgroupV2) freeze(on bool) error {
	v, want := "0", "frozen 0"
	if on {
		v, want = "1", "frozen 1"
	}
	if err := writeCgroupFile(g.dir, "cgroup.freeze", v); err != nil {
		return err
	}
	return waitCgroupFile(g.dir, "cgroup.events", func(s string) bool { return slices.Contains(strings.Split(s, "\n"), want) })
}

func (g cgroupV2) kill() error {
	// cgroup.kill (Linux 5.14) kills atomically, forks included.
	if err := writeCgroupFile(g.dir, "cgroup.kill", "1"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return killAll(g.dir)
}

func (g cgroupV2) stats() (cgroupStats, error) {
	peak, err := readCgroupUint(g.dir, "memory.peak") // Linux 5.19
	if err != nil {
		return cgroupStats{}, err
	}
	cur, err := readCgroupUint(g.dir, "memory.current")
	if err != nil {
		return cgroupStats{}, err
	}
	oom, err := readCgroupKey(g.dir, "memory.events", "oom_kill")
	if err != nil {
		return cgroupStats{}, err
	}
	cpu, err := readCgroupKey(g.dir, "cpu.stat", "usage_usec")
	if err != nil {
		return cgroupStats{}, err
	}
	return cgroupStats{Memory: int64(cur), MaxMemory: int64(peak), OOMKills: oom, CPU: time.Duration(cpu) * time.Microsecond}, nil
}

func (g cgroupV2) destroy() error { return rmdirCgroup(g.dir) }

// loadCgroup returns the cgroup of an existing sandbox, for cleanup: in
// every hierarchy a sandbox may have joined.
func loadCgroup(id string) cgroup {
	if unifiedHierarchy() {
		return cgroupV2{dir: filepath.Join(cgroupRoot, cgroupPrefix+id)}
	}
	return cgroupV1{name: cgroupPrefix + id, controllers: v1Controllers(true)}
}

// orphanAge is how old an empty sandbox cgroup must be before a sweep
// removes it without a lock file to go by: older than any sandbox can take
// between creating its cgroup and starting its init (setupTimeout).
const orphanAge = 2 * setupTimeout

// SweepOrphanCgroups removes empty sandbox cgroups that no lock file
// accounts for, such as those of a state directory deleted while its
// sandboxes ran. A cgroup that still has processes refuses rmdir, so a
// live sandbox is never touched; a young one is left to its creator. It
// reads every controller's top directory, so the daemon runs it at start,
// not airlock run before each sandbox.
func SweepOrphanCgroups() {
	dirs := []string{cgroupRoot}
	if !unifiedHierarchy() {
		// Every hierarchy: gVisor sandboxes have cgroups in all of them.
		dirs, _ = filepath.Glob(filepath.Join(cgroupRoot, "*"))
	}
	for _, d := range dirs {
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			if !e.IsDir() || !strings.HasPrefix(e.Name(), cgroupPrefix) {
				continue
			}
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > orphanAge {
				_ = unix.Rmdir(filepath.Join(d, e.Name()))
			}
		}
	}
}

// Cgroup is a sandbox's cgroup for a backend whose sandbox joins it by
// itself: gVisor's runsc is handed its path. Airlock creates and removes it
// on both backends, so limits, statistics, kills and crash cleanup have
// one implementation, and the cgroup outlives runsc's own bookkeeping
// long enough to read what the sandbox consumed.
type Cgroup struct {
	g    cgroup
	name string
}

// CgroupStats is what a sandbox consumed.
type CgroupStats = cgroupStats

// NewCgroup creates the cgroup of sandbox id with p's limits, as a live
// sandbox's: its CPU time can be read and it can be paused.
func NewCgroup(id string, p *policy.Policy) (*Cgroup, error) {
	g, err := newCgroup(id, p, true)
	if err != nil {
		return nil, err
	}
	return &Cgroup{g: g, name: cgroupPrefix + id}, nil
}

// LoadCgroup returns the cgroup of an existing sandbox, for cleanup.
func LoadCgroup(id string) *Cgroup { return &Cgroup{g: loadCgroup(id), name: cgroupPrefix + id} }

// Path is the cgroup's path below each hierarchy's root, the form of an
// OCI spec's linux.cgroupsPath.
func (c *Cgroup) Path() string { return "/" + c.name }

// Stats reads what the sandbox consumed so far.
func (c *Cgroup) Stats() (CgroupStats, error) { return c.g.stats() }

// Freeze stops every process in the cgroup (true) or restarts them.
func (c *Cgroup) Freeze(on bool) error { return c.g.freeze(on) }

// Remove kills every process left in the cgroup and removes it, from
// every hierarchy: runsc adds the cgroup to the ones Airlock leaves alone
// (blkio, cpuset, devices, freezer…), and a runsc killed before it
// recorded them leaves them to whoever removes the sandbox.
func (c *Cgroup) Remove() error {
	if err := c.g.kill(); err != nil {
		return err
	}
	if err := c.g.destroy(); err != nil {
		return err
	}
	if unifiedHierarchy() {
		return nil
	}
	others, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", c.name))
	for _, dir := range others {
		if err := rmdirCgroup(dir); err != nil {
			return err
		}
	}
	return nil
}
