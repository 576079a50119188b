package namespaces

import (
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/airlocktest"
	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/backend/backendtest"
	"github.com/airlock-sandbox/airlock/internal/cgroups"
)

// The contract of every backend, on this one.
func TestConformance(t *testing.T) {
	airlocktest.RequiresRoot(t)
	var caps backendtest.Capabilities
	if !airlocktest.CanFreeze() {
		caps.Pause = "this host has no freezer cgroup (neither cgroup v2 nor a v1 freezer hierarchy)"
	}
	backendtest.Conformance(t, backendtest.Target{
		New:          func(stateDir string) backend.Backend { return New(stateDir, slog.New(slog.DiscardHandler)) },
		Leftovers:    leftovers,
		Capabilities: caps,
	})
}

// leftovers are a state directory's sandboxes: the lock file of each
// (made before its cgroup, removed after it), their cgroups, in every
// hierarchy, and their agents' sockets.
func leftovers(stateDir string) []string {
	var paths []string
	for _, lock := range backendtest.Entries(filepath.Join(stateDir, "runs")) {
		paths = append(paths, lock)
		id := filepath.Base(lock)
		if strings.HasPrefix(id, ".") {
			continue // a lock being made: no cgroup yet
		}
		cg, _ := filepath.Glob(filepath.Join(cgroups.Root, "*", cgroups.Prefix+id))
		top, _ := filepath.Glob(filepath.Join(cgroups.Root, cgroups.Prefix+id))
		paths = append(append(paths, cg...), top...)
	}
	return append(paths, backendtest.Entries(filepath.Join(stateDir, "agents"))...)
}
