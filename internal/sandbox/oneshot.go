package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// RunTemplate is the configured template whose pooled sandboxes are what
// airlock run builds for a command: the host's view (no image root, no
// mounts, nothing added to the environment), nothing started in it but
// the agent, pooled, on the backend of that name. ok is false where the
// server has none.
func (m *Manager) RunTemplate(backendName string) (name string, pol policy.Policy, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	names := make([]string, 0, len(m.pools))
	for n, p := range m.pools {
		if !p.dynamic {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	for _, n := range names {
		t := &m.pools[n].tmpl
		p := &t.Policy
		if t.PoolSize > 0 && t.Ready == nil && t.Snapshot == "" && !t.WarmSnapshot &&
			len(p.RootLayers) == 0 && !p.Root && len(p.Mounts) == 0 && len(p.Env) == 0 &&
			m.backendOf(t).Name() == backendName {
			return n, t.Policy, true
		}
	}
	return "", policy.Policy{}, false
}

// CountersAtStart is what the box running s had counted when s was
// handed out (zero where the host could not say).
func (s *Sandbox) CountersAtStart() backend.Usage { return s.atStart }

// Counters is what the box running s has counted so far: its CPU time,
// its memory's peak, the processes its memory limit killed.
func (s *Sandbox) Counters(ctx context.Context) (backend.Usage, error) {
	inst := s.instance()
	if inst == nil {
		return backend.Usage{}, errors.New("the sandbox is saved")
	}
	return inst.Usage(ctx)
}

// ErrNoCodeFiles: the sandbox's backend cannot take code files into a
// box already running (gVisor's code directory is a mount made at its
// start).
var ErrNoCodeFiles = errors.New("code files into a running sandbox are not supported by its backend")

// PlaceCode writes airlock run's code files into s (backend.CodePlacer):
// only into a sandbox nothing of its client has run in yet.
func (s *Sandbox) PlaceCode(files []backend.File) error {
	p, ok := bare(s.instance()).(backend.CodePlacer)
	if !ok {
		return ErrNoCodeFiles
	}
	return p.PlaceCode(files)
}

// ErrNoLowering: the sandbox's backend cannot lower the limits of a box
// already running (gVisor's memory and file systems are sized at its
// start).
var ErrNoLowering = errors.New("lowering a pooled sandbox's limits is not supported by its backend")

// lower gives a claimed box pol's limits, lower than its template's.
func lower(inst Instance, pol policy.Policy) error {
	l, ok := bare(inst).(backend.Lowerer)
	if !ok {
		return ErrNoLowering
	}
	if err := l.Lower(pol); err != nil {
		return fmt.Errorf("lower the pooled sandbox's limits: %w", err)
	}
	return nil
}
