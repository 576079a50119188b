package cgroups

import (
	"context"
	"errors"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// cgroup v2: one directory of the unified hierarchy. The formats are
// those of the kernel's cgroup-v2 documentation.

func TestV2Limits(t *testing.T) {
	f := fakeV2(t)
	newTestCgroup(t, f, true)
	for file, want := range map[string]string{
		"memory.max": "268435456", "memory.swap.max": "0", "pids.max": "64", "cpu.max": "50000 100000",
	} {
		if got := f.read(name + "/" + file); got != want {
			t.Errorf("%s = %q, want %q", file, got, want)
		}
	}
	// A one-shot run's is the same directory.
	g := fakeV2(t)
	newTestCgroup(t, g, false)
	if !g.exists(name + "/memory.max") {
		t.Error("a one-shot run has no cgroup")
	}
	// A cgroup that exists already is not taken over.
	if _, err := g.newCgroup(name, Limits{MemoryBytes: 1, Pids: 1, CPUs: 1}, true); err == nil {
		t.Error("created a cgroup twice")
	}
}

func TestV2Stats(t *testing.T) {
	f := fakeV2(t)
	c := newTestCgroup(t, f, true)
	for file, data := range map[string]string{
		"memory.peak":    "9437184\n",
		"memory.current": "4194304\n",
		"memory.events":  "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n",
		"cpu.stat":       "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\nnr_periods 0\n",
		// 3 MiB of files' pages, 1 of them tmpfs's: 2 MiB of page cache.
		"memory.stat": "anon 1048576\nfile 3145728\nkernel 65536\nshmem 1048576\nfile_mapped 0\n",
	} {
		f.put(name+"/"+file, data)
	}
	st, err := c.Stats()
	want := Stats{Memory: 4 << 20, MaxMemory: 9 << 20, OOMKills: 1, CPU: 1500 * time.Millisecond, Cache: 2 << 20}
	if err != nil || st != want {
		t.Errorf("stats %+v %v, want %+v", st, err, want)
	}
	// Before Linux 5.19 there is no memory.peak: the current use stands in.
	os.Remove(f.path(name + "/memory.peak"))
	st, err = c.Stats()
	want.MaxMemory = want.Memory
	if err != nil || st != want {
		t.Errorf("stats without memory.peak: %+v %v, want %+v", st, err, want)
	}
	// A kernel whose memory.stat lacks the keys: no page cache to tell.
	f.put(name+"/memory.stat", "anon 1\n")
	st, err = c.Stats()
	want.Cache = 0
	if err != nil || st != want {
		t.Errorf("stats without a page cache: %+v %v, want %+v", st, err, want)
	}
	f.put(name+"/cpu.stat", "user_usec 1\n")
	if _, err := c.Stats(); err == nil {
		t.Error("stats without usage_usec")
	}
	os.Remove(f.path(name + "/memory.current"))
	if _, err := c.Stats(); err == nil {
		t.Error("stats without memory.current")
	}
}

// The first process is born in the cgroup (CLONE_INTO_CGROUP) through a
// descriptor of its directory, open until release.
func TestV2Enter(t *testing.T) {
	f := fakeV2(t)
	c := newTestCgroup(t, f, true)
	var attr syscall.SysProcAttr
	tasks, release, err := c.Enter(&attr)
	if err != nil {
		t.Fatal(err)
	}
	if len(tasks) != 0 || !attr.UseCgroupFD {
		t.Fatalf("tasks %v, UseCgroupFD %v", tasks, attr.UseCgroupFD)
	}
	var fdSt, dirSt unix.Stat_t
	if err := unix.Fstat(attr.CgroupFD, &fdSt); err != nil {
		t.Fatal(err)
	}
	unix.Stat(f.path(name), &dirSt)
	if fdSt.Ino != dirSt.Ino || fdSt.Dev != dirSt.Dev {
		t.Error("CgroupFD is not the cgroup's directory")
	}
	release()
	if err := unix.Fstat(attr.CgroupFD, &fdSt); err == nil {
		// The number may have been reused; it must not be the cgroup.
		if fdSt.Ino == dirSt.Ino {
			t.Error("the cgroup's directory is still open after release")
		}
	}
}

func TestV2Freeze(t *testing.T) {
	f := fakeV2(t)
	c := newTestCgroup(t, f, true)
	// The kernel says in cgroup.events when every task has stopped.
	f.put(name+"/cgroup.events", "populated 1\nfrozen 1\n")
	if err := c.Freeze(t.Context(), true); err != nil {
		t.Fatal(err)
	}
	if got := f.read(name + "/cgroup.freeze"); got != "1" {
		t.Errorf("cgroup.freeze %q", got)
	}
	f.put(name+"/cgroup.events", "populated 1\nfrozen 0\n")
	if err := c.Freeze(t.Context(), false); err != nil || f.read(name+"/cgroup.freeze") != "0" {
		t.Errorf("Freeze(false): %v", err)
	}
	// Not frozen yet, and the caller gives up.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := c.Freeze(ctx, true); !errors.Is(err, context.Canceled) {
		t.Errorf("Freeze with a canceled context: %v", err)
	}
	// A cgroup gone meanwhile.
	os.RemoveAll(f.path(name))
	if err := c.Freeze(t.Context(), true); err == nil {
		t.Error("froze a removed cgroup")
	}
}

// Kill writes cgroup.kill and waits until the cgroup is empty; Destroy
// removes it, and Remove does both.
func TestV2KillAndRemove(t *testing.T) {
	f := fakeV2(t)
	c := newTestCgroup(t, f, true)
	f.put(name+"/cgroup.procs", "41\n42\n")
	if err := c.Destroy(); err == nil {
		t.Error("destroyed a cgroup with processes")
	}
	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	if got := f.read(name + "/cgroup.kill"); got != "1" {
		t.Errorf("cgroup.kill %q", got)
	}
	if got := f.killedPids(); !slices.Equal(got, []int{41, 42}) {
		t.Errorf("killed %v", got)
	}
	f.put(name+"/cgroup.procs", "43\n")
	if err := c.Remove(); err != nil {
		t.Fatal(err)
	}
	if f.exists(name) {
		t.Error("the cgroup remains")
	}
	// A crash's leftover, loaded by name, and one already gone.
	newTestCgroup(t, f, false)
	if err := f.load(name).Remove(); err != nil || f.exists(name) {
		t.Errorf("Remove of a loaded cgroup: %v", err)
	}
	if err := f.load(name).Remove(); err != nil {
		t.Errorf("Remove of a removed cgroup: %v", err)
	}
}

func TestV2SweepOrphans(t *testing.T) {
	f := fakeV2(t)
	old := time.Now().Add(-time.Hour)
	for _, dir := range []string{Prefix + "a", Prefix + "busy", "system.slice"} {
		os.Mkdir(f.path(dir), 0o755)
	}
	f.put(Prefix+"busy/cgroup.procs", "5\n")
	for _, dir := range []string{Prefix + "a", Prefix + "busy", "system.slice"} {
		os.Chtimes(f.path(dir), old, old)
	}
	os.Mkdir(f.path(Prefix+"young"), 0o755)
	f.put("cgroup.procs", "1\n") // a file at the top, not a cgroup
	f.sweepOrphans(time.Minute)
	for dir, want := range map[string]bool{Prefix + "a": false, Prefix + "busy": true, "system.slice": true, Prefix + "young": true, "cgroup.procs": true} {
		if f.exists(dir) != want {
			t.Errorf("%s exists: %v, want %v", dir, !want, want)
		}
	}
}

func TestV2Lower(t *testing.T) {
	f := fakeV2(t)
	c := newTestCgroup(t, f, true)
	f.rewritable()
	if err := c.Lower(Limits{MemoryBytes: 128 << 20, Pids: 40, CPUs: 0.25}); err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{
		"memory.max": "134217728", "memory.swap.max": "0", "pids.max": "40", "cpu.max": "25000 100000",
	} {
		if got := f.read(name + "/" + file); got != want {
			t.Errorf("%s = %q, want %q", file, got, want)
		}
	}
}

func TestV2SetCPUs(t *testing.T) {
	f := fakeV2(t)
	c := newTestCgroup(t, f, true)
	f.rewritable()
	if err := c.SetCPUs(2); err != nil {
		t.Fatal(err)
	}
	if got := f.read(name + "/cpu.max"); got != "200000 100000" {
		t.Errorf("cpu.max = %q, want 200000 100000", got)
	}
}
