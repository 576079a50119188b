// Package airlocktest holds helpers shared by Airlock's tests.
package airlocktest

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
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

// ProcsOfUID lists host pids whose real uid is uid.
func ProcsOfUID(uid int) []int {
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
		for _, line := range strings.Split(string(data), "\n") {
			if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
				f := strings.Fields(rest)
				if len(f) > 0 && f[0] == strconv.Itoa(uid) {
					pids = append(pids, pid)
				}
			}
		}
	}
	return pids
}

// Cgroups lists every cgroup directory on the host whose name contains
// "airlock", at the depth the namespaces backend creates them.
func Cgroups() []string {
	var found []string
	for _, pattern := range []string{"/sys/fs/cgroup/*/*airlock*", "/sys/fs/cgroup/*airlock*"} {
		m, _ := filepath.Glob(pattern)
		found = append(found, m...)
	}
	return found
}

// CheckNoLeftovers fails t if any sandbox process, cgroup or run lock
// remains. sandboxUIDs are the host uids sandboxes run as.
func CheckNoLeftovers(t testing.TB, stateDir string, sandboxUIDs ...int) {
	t.Helper()
	for _, uid := range sandboxUIDs {
		if pids := ProcsOfUID(uid); len(pids) > 0 {
			t.Errorf("sandbox processes left running (host uid %d): %v", uid, pids)
		}
	}
	if cg := Cgroups(); len(cg) > 0 {
		t.Errorf("cgroups left behind: %v", cg)
	}
	if runs, _ := os.ReadDir(filepath.Join(stateDir, "runs")); len(runs) > 0 {
		t.Errorf("run locks left behind: %d in %s/runs", len(runs), stateDir)
	}
	if mounts, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(mounts), stateDir) {
		t.Errorf("mounts under %s left in the host mount namespace", stateDir)
	}
}
