package cgroups

import (
	"os"
	"testing"
)

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

// This test process is in none of a fake host's cgroups; a process that
// is gone is an error.
func TestCgroupHoldsReadsProc(t *testing.T) {
	for _, f := range []*fakeFS{fakeV1(t, hostV1...), fakeV2(t)} {
		c, err := f.newCgroup(Prefix+"x", Limits{MemoryBytes: 1 << 20, Pids: 8, CPUs: 1}, true)
		if err != nil {
			t.Fatal(err)
		}
		if in, err := c.Holds(os.Getpid()); err != nil || in {
			t.Errorf("unified %v: Holds(self) = %v, %v", f.unified, in, err)
		}
		if _, err := c.Holds(-1); err == nil {
			t.Errorf("unified %v: Holds(-1) succeeded", f.unified)
		}
		if c.Path() != "/"+Prefix+"x" {
			t.Errorf("Path() = %q", c.Path())
		}
	}
}

func TestCPUQuota(t *testing.T) {
	for _, c := range []struct {
		cpus  float64
		quota int64
	}{{1, 100_000}, {0.5, 50_000}, {2.5, 250_000}, {0.001, 1000}, {0, 1000}} {
		quota, period := cpuQuota(Limits{CPUs: c.cpus})
		if quota != c.quota || period != 100_000 {
			t.Errorf("cpuQuota(%v) = %d/%d, want %d/100000", c.cpus, quota, period, c.quota)
		}
	}
}

// The host's tree is the one at Root, of the version Unified says.
func TestHostTree(t *testing.T) {
	h := hostTree()
	if h.root != Root || h.unified != Unified() {
		t.Errorf("host tree %+v", h)
	}
	if !h.unified && (len(h.oneShot) < 3 || len(h.live) < len(h.oneShot)) {
		t.Errorf("v1 controllers: one-shot %v, live %v", h.oneShot, h.live)
	}
}
