package cgroups

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"
)

// cgroupV1 is a sandbox's cgroup on v1: a directory of one name in each
// hierarchy it joins.
type cgroupV1 struct {
	t           *tree
	name        string   // directory name below each controller's root
	controllers []string // the hierarchies it is in
}

// newV1 creates cgroup name in the v1 hierarchies of a live sandbox or a
// one-shot run, with l's limits.
func newV1(t *tree, name string, l Limits, live bool) (impl, error) {
	quota, period := cpuQuota(l)
	mem := strconv.FormatInt(l.MemoryBytes, 10)
	g := cgroupV1{t: t, name: name, controllers: t.v1Controllers(live)}
	limits := map[string][][2]string{
		// memsw is memory+swap: equal to the memory limit means no swap.
		// It must be written after the memory limit, never below it.
		"memory": {{"memory.limit_in_bytes", mem}, {"memory.memsw.limit_in_bytes", mem}},
		"pids":   {{"pids.max", strconv.FormatInt(l.Pids, 10)}},
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

func (g cgroupV1) lower(l Limits) error {
	quota, _ := cpuQuota(l)
	mem := strconv.FormatInt(l.MemoryBytes, 10)
	// Lowering, memsw after the memory limit: it may never be below it.
	for _, w := range [][3]string{
		{"memory", "memory.limit_in_bytes", mem},
		{"memory", "memory.memsw.limit_in_bytes", mem},
		{"pids", "pids.max", strconv.FormatInt(l.Pids, 10)},
		{"cpu", "cpu.cfs_quota_us", strconv.FormatInt(quota, 10)},
	} {
		if !slices.Contains(g.controllers, w[0]) {
			continue
		}
		if err := writeFile(g.dir(w[0]), w[1], w[2]); err != nil {
			return err
		}
	}
	return nil
}

func (g cgroupV1) setCPUs(cpus float64) error {
	if !slices.Contains(g.controllers, "cpu") {
		return errors.New("no cpu controller")
	}
	quota, _ := cpuQuota(Limits{CPUs: cpus})
	return writeFile(g.dir("cpu"), "cpu.cfs_quota_us", strconv.FormatInt(quota, 10))
}

func (g cgroupV1) dir(controller string) string {
	return filepath.Join(g.t.root, controller, g.name)
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
	return g.t.killAll(g.dir("pids"))
}

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
	st := Stats{Memory: int64(cur), MaxMemory: int64(maxMem), OOMKills: oom,
		Cache: pageCache(mem, "total_cache", "total_shmem")}
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
		errs = append(errs, g.t.remove(g.dir(c)))
	}
	return errors.Join(errs...)
}
