package gvisor

import (
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/airlocktest"
	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/backend/backendtest"
	"github.com/airlock-sandbox/airlock/internal/cgroups"
)

// The contract of every backend, on this one.
func TestConformance(t *testing.T) {
	runsc := testBackend(t).runsc
	var caps backendtest.Capabilities
	if !airlocktest.CanFreeze() {
		caps.Pause = "this host has no freezer cgroup (neither cgroup v2 nor a v1 freezer hierarchy)"
	}
	backendtest.Conformance(t, backendtest.Target{
		New:          func(stateDir string) backend.Backend { return New(runsc, stateDir, slog.New(slog.DiscardHandler)) },
		Leftovers:    leftovers,
		Capabilities: caps,
	})
}

// leftovers are a state directory's sandboxes: each one's bundle (made
// before its cgroup, removed after it) and its cgroups, in every
// hierarchy runsc may have added it to, runsc's state and the agents'
// directories.
func leftovers(stateDir string) []string {
	var paths []string
	for _, bundle := range backendtest.Entries(filepath.Join(stateDir, "bundles")) {
		paths = append(paths, bundle)
		name := cgroups.Prefix + filepath.Base(bundle)
		cg, _ := filepath.Glob(filepath.Join(cgroups.Root, "*", name))
		top, _ := filepath.Glob(filepath.Join(cgroups.Root, name))
		paths = append(append(paths, cg...), top...)
	}
	paths = append(paths, backendtest.Entries(filepath.Join(stateDir, "state"))...)
	return append(paths, backendtest.Entries(filepath.Join(stateDir, "agents"))...)
}
