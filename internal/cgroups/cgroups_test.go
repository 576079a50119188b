package cgroups

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Some hosts are cgroup v1 (hybrid), where the v2 code cannot run against a real
// unified hierarchy; this checks, on a plain directory, the files it
// writes and how it reads the kernel's answers (formats from the kernel's
// cgroup-v2 documentation).
func TestCgroupV2Files(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "airlock-x")
	g, err := newV2(dir, Limits{MemoryBytes: 256 << 20, Pids: 64, CPUs: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{
		"memory.max": "268435456", "memory.swap.max": "0", "pids.max": "64", "cpu.max": "50000 100000",
	} {
		// Created with mode 0 here, as cgroupfs never needs: readable
		// for a test that runs as another user than root.
		os.Chmod(filepath.Join(dir, file), 0o644)
		if got, _ := os.ReadFile(filepath.Join(dir, file)); string(got) != want {
			t.Errorf("%s = %q, want %q", file, got, want)
		}
	}
	for file, data := range map[string]string{
		"memory.peak":    "9437184\n",
		"memory.current": "4194304\n",
		"memory.events":  "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n",
		"cpu.stat":       "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\nnr_periods 0\n",
	} {
		os.WriteFile(filepath.Join(dir, file), []byte(data), 0o644)
	}
	st, err := g.stats()
	if err != nil {
		t.Fatal(err)
	}
	want := Stats{Memory: 4 << 20, MaxMemory: 9 << 20, OOMKills: 1, CPU: 1500 * time.Millisecond}
	if st != want {
		t.Errorf("stats %+v, want %+v", st, want)
	}
	// Before Linux 5.19 there is no memory.peak: the current use stands in.
	os.Remove(filepath.Join(dir, "memory.peak"))
	st, err = g.stats()
	want.MaxMemory = want.Memory
	if err != nil || st != want {
		t.Errorf("stats without memory.peak: %+v %v, want %+v", st, err, want)
	}
}

func TestHolds(t *testing.T) {
	v1 := "12:pids:/airlock-ab\n4:memory:/airlock-ab/sub\n3:cpu,cpuacct:/\n0::/\n"
	v1Other := "4:memory:/airlock-abc\n0::/airlock-ab\n"
	v2 := "0::/airlock-ab\n"
	for _, c := range []struct {
		self    string
		unified bool
		want    bool
	}{
		{v1, false, true},
		{v1Other, false, false}, // a prefix of another name is not its parent
		{v1Other, true, true},
		{v2, true, true},
		{v2, false, false}, // no memory hierarchy named
		{"0::/airlock-ab-x\n", true, false},
		{"garbage", true, false},
		{"", false, false},
	} {
		if got := holds(c.self, "/airlock-ab", c.unified); got != c.want {
			t.Errorf("holds(%q, unified %v) = %v, want %v", c.self, c.unified, got, c.want)
		}
	}
}
