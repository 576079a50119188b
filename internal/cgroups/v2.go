package cgroups

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cgroupV2 is a sandbox's cgroup on v2: one directory of the unified
// hierarchy.
type cgroupV2 struct {
	t   *tree
	dir string
}

// newV2 creates the cgroup v2 directory dir with l's limits.
func newV2(t *tree, dir string, l Limits) (impl, error) {
	quota, period := cpuQuota(l)
	g := cgroupV2{t: t, dir: dir}
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

func (g cgroupV2) lower(l Limits) error {
	quota, period := cpuQuota(l)
	for _, kv := range [][2]string{
		{"memory.max", strconv.FormatInt(l.MemoryBytes, 10)},
		{"pids.max", strconv.FormatInt(l.Pids, 10)},
		{"cpu.max", fmt.Sprintf("%d %d", quota, period)},
	} {
		if err := writeFile(g.dir, kv[0], kv[1]); err != nil {
			return err
		}
	}
	return nil
}

func (g cgroupV2) setCPUs(cpus float64) error {
	quota, period := cpuQuota(Limits{CPUs: cpus})
	return writeFile(g.dir, "cpu.max", fmt.Sprintf("%d %d", quota, period))
}

func (g cgroupV2) create(limits [][2]string) error {
	if err := os.Mkdir(g.dir, 0o755); err != nil {
		return fmt.Errorf("create cgroup: %w", err)
	}
	for _, kv := range limits {
		if err := writeFile(g.dir, kv[0], kv[1]); err != nil {
			return fmt.Errorf("%w (are the memory, pids and cpu controllers enabled in %s/cgroup.subtree_control?)", err, g.t.root)
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
	return g.t.killAll(g.dir)
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
	return Stats{Memory: int64(cur), MaxMemory: int64(peak), OOMKills: oom, CPU: time.Duration(cpu) * time.Microsecond,
		Cache: pageCache(g.dir, "file", "shmem")}, nil
}

func (g cgroupV2) destroy() error { return g.t.remove(g.dir) }
