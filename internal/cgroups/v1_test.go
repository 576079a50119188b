package cgroups

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
)

// cgroup v1, the hybrid hosts Airlock runs on: a directory of one name in
// each hierarchy, each controller's limits in its own files.

const name = Prefix + "0123456789abcdef"

func newTestCgroup(t *testing.T, f *fakeFS, live bool) *Cgroup {
	t.Helper()
	c, err := f.newCgroup(name, Limits{MemoryBytes: 256 << 20, Pids: 64, CPUs: 0.5}, live)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestV1Limits(t *testing.T) {
	f := fakeV1(t, hostV1...)
	newTestCgroup(t, f, false)
	for file, want := range map[string]string{
		// memsw equal to memory: no swap.
		"memory/" + name + "/memory.limit_in_bytes":       "268435456",
		"memory/" + name + "/memory.memsw.limit_in_bytes": "268435456",
		"pids/" + name + "/pids.max":                      "64",
		"cpu,cpuacct/" + name + "/cpu.cfs_period_us":      "100000",
		"cpu,cpuacct/" + name + "/cpu.cfs_quota_us":       "50000",
	} {
		if got := f.read(file); got != want {
			t.Errorf("%s = %q, want %q", file, got, want)
		}
	}
	// A one-shot run joins only its limits' hierarchies.
	for _, h := range []string{"freezer", "blkio", "devices"} {
		if f.exists(h + "/" + name) {
			t.Errorf("a one-shot run's cgroup is in %s", h)
		}
	}
}

// A live sandbox also joins freezer (to be paused) and cpuacct (its CPU
// time as it goes), a hierarchy shared with cpu joined once.
func TestV1Controllers(t *testing.T) {
	for _, tc := range []struct {
		hierarchies   []string
		oneShot, live []string
	}{
		{hostV1, []string{"memory", "pids", "cpu"}, []string{"memory", "pids", "cpu", "freezer"}},
		{[]string{"memory", "pids", "cpu", "cpuacct", "freezer"}, []string{"memory", "pids", "cpu"}, []string{"memory", "pids", "cpu", "cpuacct", "freezer"}},
		// Without a freezer a live sandbox cannot be paused, but runs.
		{[]string{"memory", "pids", "cpu,cpuacct"}, []string{"memory", "pids", "cpu"}, []string{"memory", "pids", "cpu"}},
		// A limit's hierarchy is listed even when missing: creating fails.
		{[]string{"memory", "cpu"}, []string{"memory", "pids", "cpu"}, []string{"memory", "pids", "cpu"}},
	} {
		f := fakeV1(t, tc.hierarchies...)
		if got := f.v1Controllers(false); !slices.Equal(got, tc.oneShot) {
			t.Errorf("%v: one-shot %v, want %v", tc.hierarchies, got, tc.oneShot)
		}
		if got := f.v1Controllers(true); !slices.Equal(got, tc.live) {
			t.Errorf("%v: live %v, want %v", tc.hierarchies, got, tc.live)
		}
	}
}

// A sandbox never runs unlimited: without a limit's hierarchy no cgroup
// is made, and nothing of one is left.
func TestV1MissingLimitFails(t *testing.T) {
	f := fakeV1(t, "memory", "cpu,cpuacct", "freezer")
	if _, err := f.newCgroup(name, Limits{MemoryBytes: 1 << 20, Pids: 8, CPUs: 1}, true); err == nil {
		t.Fatal("created without a pids hierarchy")
	}
	for _, h := range []string{"memory", "cpu", "freezer"} {
		if f.exists(h + "/" + name) {
			t.Errorf("%s/%s left behind", h, name)
		}
	}
}

// Init joins by writing its thread's id into each hierarchy's tasks file,
// opened here by the host.
func TestV1Enter(t *testing.T) {
	f := fakeV1(t, hostV1...)
	c := newTestCgroup(t, f, true)
	for _, h := range []string{"memory", "pids", "cpu", "freezer"} {
		f.put(h+"/"+name+"/tasks", "") // the kernel's, made with the directory
	}
	var attr syscall.SysProcAttr
	tasks, release, err := c.Enter(&attr)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, file := range tasks {
		rel, _ := filepath.Rel(f.root, file.Name())
		got = append(got, rel)
	}
	want := []string{"memory/" + name + "/tasks", "pids/" + name + "/tasks", "cpu/" + name + "/tasks", "freezer/" + name + "/tasks"}
	if !slices.Equal(got, want) {
		t.Errorf("tasks files %v, want %v", got, want)
	}
	if attr.UseCgroupFD {
		t.Error("v1 asks for CLONE_INTO_CGROUP")
	}
	release()
	if _, err := tasks[0].Write([]byte("0")); !errors.Is(err, os.ErrClosed) {
		t.Errorf("after release, a tasks file is still open: %v", err)
	}
	// A cgroup gone meanwhile is an error, not a start outside it.
	os.Remove(f.path("pids/" + name + "/tasks"))
	os.Remove(f.path("pids/" + name))
	if _, _, err := c.Enter(&attr); err == nil {
		t.Error("entered a removed cgroup")
	}
}

func TestV1Stats(t *testing.T) {
	f := fakeV1(t, hostV1...)
	c := newTestCgroup(t, f, true)
	mem := "memory/" + name + "/"
	f.put(mem+"memory.max_usage_in_bytes", "9437184\n")
	f.put(mem+"memory.usage_in_bytes", "4194304\n")
	// failcnt stays 0 after OOM kills on v1; oom_kill counts them.
	f.put(mem+"memory.failcnt", "0\n")
	f.put(mem+"memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
	f.put("cpuacct/"+name+"/cpuacct.usage", "1500000000\n")
	// The hierarchical totals: 3 MiB cached, 1 of it tmpfs's.
	f.put(mem+"memory.stat", "cache 1\nrss 1\nshmem 1\ntotal_cache 3145728\ntotal_rss 1048576\ntotal_shmem 1048576\n")
	st, err := c.Stats()
	want := Stats{Memory: 4 << 20, MaxMemory: 9 << 20, OOMKills: 2, CPU: 1500 * time.Millisecond, Cache: 2 << 20}
	if err != nil || st != want {
		t.Errorf("stats %+v %v, want %+v", st, err, want)
	}
	// A one-shot run's, where cpuacct has a hierarchy of its own, which
	// it did not join: no CPU time (init's rusage has it).
	g := fakeV1(t, "memory", "pids", "cpu", "cpuacct")
	c = newTestCgroup(t, g, false)
	g.put(mem+"memory.max_usage_in_bytes", "1\n")
	g.put(mem+"memory.usage_in_bytes", "1\n")
	g.put(mem+"memory.oom_control", "oom_kill 0\n")
	if st, err := c.Stats(); err != nil || st.CPU != 0 {
		t.Errorf("one-shot stats %+v %v", st, err)
	}
	// A kernel without the oom_kill counter cannot say: an error.
	g.put(mem+"memory.oom_control", "oom_kill_disable 0\nunder_oom 0\n")
	if _, err := c.Stats(); err == nil {
		t.Error("stats without oom_kill")
	}
	g.put(mem+"memory.usage_in_bytes", "lots\n")
	if _, err := c.Stats(); err == nil {
		t.Error("stats of an unreadable usage")
	}
}

func TestV1Freeze(t *testing.T) {
	f := fakeV1(t, hostV1...)
	c := newTestCgroup(t, f, true)
	state := "freezer/" + name + "/freezer.state"
	f.put(state, "THAWED\n")
	if err := c.Freeze(t.Context(), true); err != nil {
		t.Fatal(err)
	}
	if got := f.read(state); got != "FROZEN" {
		t.Errorf("freezer.state %q after Freeze(true)", got)
	}
	if err := c.Freeze(t.Context(), false); err != nil || f.read(state) != "THAWED" {
		t.Errorf("Freeze(false): %v, state %q", err, f.read(state))
	}
	// The caller's context bounds the wait for the kernel.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := c.Freeze(ctx, true); !errors.Is(err, context.Canceled) {
		t.Errorf("Freeze with a canceled context: %v", err)
	}
	// A one-shot run's cgroup is in no freezer.
	oneShot := newTestCgroup(t, fakeV1(t, hostV1...), false)
	if err := oneShot.Freeze(t.Context(), true); !errors.Is(err, ErrNotPausable) {
		t.Errorf("Freeze of a one-shot run: %v, want ErrNotPausable", err)
	}
}

// Kill thaws, then kills until the cgroup is empty, the children forked
// meanwhile included; Destroy then removes it from every hierarchy it
// joined.
func TestV1KillAndDestroy(t *testing.T) {
	f := fakeV1(t, hostV1...)
	c := newTestCgroup(t, f, true)
	f.put("freezer/"+name+"/freezer.state", "FROZEN\n")
	joined := []string{"memory", "pids", "cpu", "freezer"}
	for _, h := range joined {
		f.put(h+"/"+name+"/cgroup.procs", "101\n102\n")
	}
	f.onKill = func(pid int) {
		if pid == 101 { // it forked before it died
			for _, h := range joined {
				f.put(h+"/"+name+"/cgroup.procs", f.read(h+"/"+name+"/cgroup.procs")+"\n103\n")
			}
		}
	}
	if err := c.Destroy(); err == nil {
		t.Error("destroyed a cgroup with processes")
	}
	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	if got := f.killedPids(); !slices.Equal(got, []int{101, 102, 103}) {
		t.Errorf("killed %v", got)
	}
	if got := f.read("freezer/" + name + "/freezer.state"); got != "THAWED" {
		t.Errorf("killed frozen: freezer.state %q", got)
	}
	if err := c.Destroy(); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"memory", "pids", "cpu,cpuacct", "freezer"} {
		if f.exists(h + "/" + name) {
			t.Errorf("%s/%s remains", h, name)
		}
	}
	// Gone already: nothing to kill or remove.
	if err := c.Kill(); err != nil {
		t.Errorf("Kill of a removed cgroup: %v", err)
	}
	if err := c.Destroy(); err != nil {
		t.Errorf("Destroy of a removed cgroup: %v", err)
	}
}

// Remove also takes the cgroup out of the hierarchies runsc added it to,
// and leaves other cgroups alone.
func TestV1Remove(t *testing.T) {
	f := fakeV1(t, hostV1...)
	c := newTestCgroup(t, f, true)
	for _, dir := range []string{"blkio/" + name, "devices/" + name, "blkio/" + Prefix + "other", "blkio/system.slice"} {
		os.Mkdir(f.path(dir), 0o755)
	}
	f.put("pids/"+name+"/cgroup.procs", "7\n")
	if err := c.Remove(); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"memory", "pids", "cpu,cpuacct", "freezer", "blkio", "devices"} {
		if f.exists(dir + "/" + name) {
			t.Errorf("%s/%s remains", dir, name)
		}
	}
	if !f.exists("blkio/"+Prefix+"other") || !f.exists("blkio/system.slice") {
		t.Error("Remove took other cgroups")
	}
	if got := f.killedPids(); !slices.Equal(got, []int{7}) {
		t.Errorf("killed %v", got)
	}
}

// Load finds what a crashed run left in every hierarchy a live sandbox
// joins, for Cleanup to kill and remove.
func TestV1Load(t *testing.T) {
	f := fakeV1(t, hostV1...)
	newTestCgroup(t, f, true)
	f.put("pids/"+name+"/cgroup.procs", "9\n")
	c := f.load(name)
	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := c.Destroy(); err != nil {
		t.Fatal(err)
	}
	if f.exists("memory/"+name) || f.exists("freezer/"+name) || !slices.Equal(f.killedPids(), []int{9}) {
		t.Errorf("after a load's kill and destroy: killed %v", f.killedPids())
	}
}

// SweepOrphans removes empty sandbox cgroups older than its age, in every
// hierarchy, and nothing else.
func TestV1SweepOrphans(t *testing.T) {
	f := fakeV1(t, hostV1...)
	old := time.Now().Add(-time.Hour)
	for _, dir := range []string{"memory/" + Prefix + "a", "blkio/" + Prefix + "a", "pids/" + Prefix + "busy", "memory/system.slice", "memory/" + Prefix + "young"} {
		os.Mkdir(f.path(dir), 0o755)
		if dir != "memory/"+Prefix+"young" {
			os.Chtimes(f.path(dir), old, old)
		}
	}
	f.put("pids/"+Prefix+"busy/cgroup.procs", "5\n")
	os.Chtimes(f.path("pids/"+Prefix+"busy"), old, old)
	f.sweepOrphans(time.Minute)
	for dir, want := range map[string]bool{
		"memory/" + Prefix + "a": false, "blkio/" + Prefix + "a": false,
		"pids/" + Prefix + "busy": true, "memory/system.slice": true, "memory/" + Prefix + "young": true,
	} {
		if f.exists(dir) != want {
			t.Errorf("%s exists: %v, want %v", dir, !want, want)
		}
	}
	if len(f.killedPids()) > 0 {
		t.Errorf("a sweep killed %v", f.killedPids())
	}
}

// Lower writes the lower limits where the cgroup has them (memsw after
// the memory limit: never below it).
func TestV1Lower(t *testing.T) {
	f := fakeV1(t, hostV1...)
	c := newTestCgroup(t, f, true)
	f.rewritable()
	if err := c.Lower(Limits{MemoryBytes: 128 << 20, Pids: 40, CPUs: 0.25}); err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{
		"memory/" + name + "/memory.limit_in_bytes":       "134217728",
		"memory/" + name + "/memory.memsw.limit_in_bytes": "134217728",
		"pids/" + name + "/pids.max":                      "40",
		"cpu,cpuacct/" + name + "/cpu.cfs_quota_us":       "25000",
		"cpu,cpuacct/" + name + "/cpu.cfs_period_us":      "100000",
	} {
		if got := f.read(file); got != want {
			t.Errorf("%s = %q, want %q", file, got, want)
		}
	}
}

// SetCPUs sets the CPU quota alone, above the limit as well as below.
func TestV1SetCPUs(t *testing.T) {
	f := fakeV1(t, hostV1...)
	c := newTestCgroup(t, f, true)
	f.rewritable()
	for _, cpus := range []struct {
		n    float64
		want string
	}{{2, "200000"}, {0.5, "50000"}} {
		if err := c.SetCPUs(cpus.n); err != nil {
			t.Fatal(err)
		}
		if got := f.read("cpu,cpuacct/" + name + "/cpu.cfs_quota_us"); got != cpus.want {
			t.Errorf("%g CPUs: quota %q, want %q", cpus.n, got, cpus.want)
		}
	}
	if got := f.read("memory/" + name + "/memory.limit_in_bytes"); got != "268435456" {
		t.Errorf("the memory limit changed: %q", got)
	}
}
