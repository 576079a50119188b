// Package airlocktest holds helpers shared by Airlock's tests.
package airlocktest

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// RequiresRoot skips t unless the test runs as root, which building
// sandboxes needs. CI runs as root, so these tests run there.
func RequiresRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (CI runs as root): sandboxes map uids and create cgroups")
	}
}

// SandboxUIDs is the range [lo, hi) of host uids sandboxes run as; the
// namespaces backend sets it (this package may not import backends).
var SandboxUIDs = [2]int{1 << 30, 1 << 31}

// SandboxProcs lists host pids whose real uid is a sandbox's, but for
// the dead ones the host's init has yet to reap.
func SandboxProcs() []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		// A zombie handed to the host's init (its sandbox's pid
		// namespace ended) is dead: reaping it is that init's business,
		// which may take a moment.
		fields := map[string]string{}
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok {
				fields[k] = strings.TrimSpace(v)
			}
		}
		if strings.HasPrefix(fields["State"], "Z") && fields["PPid"] == "1" {
			continue
		}
		if f := strings.Fields(fields["Uid"]); len(f) > 0 {
			if uid, err := strconv.Atoi(f[0]); err == nil && uid >= SandboxUIDs[0] && uid < SandboxUIDs[1] {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// Cgroups lists the cgroup directories on the host whose name contains
// "airlock", at the depth the namespaces backend creates them, that were
// not there when this test binary started. Those are another run's: a test
// run that was killed leaves its sandboxes' empty cgroups, which only a
// daemon started on that run's (temporary) state directory would reclaim,
// and they are no leak of the tests that run now.
func Cgroups() []string {
	var found []string
	for _, p := range airlockCgroups() {
		if !preexisting[p] {
			found = append(found, p)
		}
	}
	return found
}

var preexisting = func() map[string]bool {
	m := map[string]bool{}
	for _, p := range airlockCgroups() {
		m[p] = true
	}
	return m
}()

func airlockCgroups() []string {
	var found []string
	for _, pattern := range []string{"/sys/fs/cgroup/*/*airlock*", "/sys/fs/cgroup/*airlock*"} {
		m, _ := filepath.Glob(pattern)
		found = append(found, m...)
	}
	return found
}

// CheckNoLeftovers fails t if any sandbox process, cgroup or run lock
// remains.
func CheckNoLeftovers(t testing.TB, stateDir string) {
	t.Helper()
	if pids := SandboxProcs(); len(pids) > 0 {
		t.Errorf("sandbox processes left running: %v", pids)
	}
	if cg := Cgroups(); len(cg) > 0 {
		t.Errorf("cgroups left behind: %v", cg)
	}
	var runs []string
	for _, e := range readDir(filepath.Join(stateDir, "runs")) {
		if !runsAtStart[filepath.Join(stateDir, "runs", e)] {
			runs = append(runs, e)
		}
	}
	if len(runs) > 0 {
		t.Errorf("run locks left behind: %d in %s/runs", len(runs), stateDir)
	}
	var mounts []string
	for _, m := range MountsUnder(stateDir) {
		if !mountsAtStart[m] {
			mounts = append(mounts, m)
		}
	}
	if len(mounts) > 0 {
		t.Errorf("mounts under %s left in the host mount namespace: %v", stateDir, mounts)
	}
}

// DefaultStateDir is the namespaces backend's default state directory
// (this package may not import backends), whose run locks and mounts a
// killed earlier run may have left.
const DefaultStateDir = "/run/airlock"

// What was there when this test binary started is another run's, as
// with cgroups (preexisting): a run killed mid-sandbox leaves its run
// lock until the next airlock run on the state directory reclaims it.
var runsAtStart, mountsAtStart = func() (runs, mounts map[string]bool) {
	runs, mounts = map[string]bool{}, map[string]bool{}
	for _, e := range readDir(filepath.Join(DefaultStateDir, "runs")) {
		runs[filepath.Join(DefaultStateDir, "runs", e)] = true
	}
	for _, m := range MountsUnder("/") {
		mounts[m] = true
	}
	return runs, mounts
}()

func readDir(dir string) []string {
	entries, _ := os.ReadDir(dir)
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	return names
}

// MountsUnder lists the mount points of this mount namespace at dir or
// beneath it. Mount points, not substrings: /run/airlock-gvisor is not
// under /run/airlock.
func MountsUnder(dir string) []string {
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	dir = filepath.Clean(dir)
	var found []string
	for _, line := range strings.Split(string(info), "\n") {
		// Field 5 is the mount point, octal-escaped (\040 for a space).
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := f[4]
		if mp == dir || strings.HasPrefix(mp, strings.TrimSuffix(dir, "/")+"/") {
			found = append(found, mp)
		}
	}
	return found
}

// Hosts differ, even of one kind: a test that relies on a host feature
// probes it with these first and says so when it skips.

// CgroupV2 reports whether the host runs the unified cgroup hierarchy only.
func CgroupV2() bool {
	_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	return err == nil
}

// CanFreeze reports whether sandboxes can be paused here: cgroup v2, or a
// v1 freezer hierarchy.
func CanFreeze() bool {
	if CgroupV2() {
		return true
	}
	_, err := os.Stat("/sys/fs/cgroup/freezer/freezer.state")
	if err != nil {
		_, err = os.Stat("/sys/fs/cgroup/freezer/cgroup.procs")
	}
	return err == nil
}

// RequiresFreezer skips t on a host where sandboxes cannot be paused.
func RequiresFreezer(t testing.TB) {
	t.Helper()
	if !CanFreeze() {
		t.Skip("this host has no freezer cgroup (neither cgroup v2 nor a v1 freezer hierarchy): sandboxes cannot be paused here")
	}
}

// LandlockABI is the Landlock ABI version the kernel offers, 0 if none.
func LandlockABI() int {
	const createRulesetVersion = 1 << 0 // LANDLOCK_CREATE_RULESET_VERSION
	v, _, errno := syscall.Syscall(sysLandlockCreateRuleset, 0, 0, createRulesetVersion)
	if errno != 0 {
		return 0
	}
	return int(v)
}

// sysLandlockCreateRuleset is landlock_create_ruleset's number, the same
// on every architecture (the syscall table is unified from 444 on).
const sysLandlockCreateRuleset = 444
