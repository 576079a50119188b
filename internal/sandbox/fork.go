package sandbox

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"
)

// A fork (snapshot.go says what a snapshot is) clones a running sandbox's
// copy count times at once and forgets the copy.

// ForkResult is one fork's outcome: a sandbox, or why it did not start.
type ForkResult struct {
	Sandbox *Sandbox
	Err     error
}

// Fork makes count copies of running sandbox id, each with ttl to live,
// from one snapshot of it; id runs on, its time to live untouched. The
// error is the snapshot's; each copy's is in its result.
func (m *Manager) Fork(ctx context.Context, id string, count int, ttl time.Duration) ([]ForkResult, error) {
	if count < 1 || count > MaxForks {
		return nil, fmt.Errorf("%w: count %d is out of range: a fork makes 1 to %d sandboxes", ErrInvalid, count, MaxForks)
	}
	if _, err := m.ttl(ttl); err != nil {
		return nil, err
	}
	tmp, err := m.scratchDir("forks")
	if err != nil {
		return nil, err
	}
	// Every clone has read what it needs once it answers: runsc restores
	// the memory before the agent runs again.
	defer os.RemoveAll(tmp)
	of, err := m.Snapshot(ctx, id, filepath.Join(tmp, "state"))
	if err != nil {
		return nil, err
	}
	tmpl := of.template(filepath.Join(tmp, "state"))
	sb, _ := m.Get(id) // for what the copies inherit; it may be gone by now
	// Each copy has a network of its own where the original had one,
	// under the policy it had: its own addresses, the same rules.
	req := CreateRequest{TemplateID: of.Template, TTL: ttl, Network: of.Network}
	if sb != nil {
		req.ClientID, req.AutoPause, req.AutoResume, req.Ingress = sb.ClientID, sb.autoPause, sb.AutoResume, sb.Ingress
	}
	out := make([]ForkResult, count)
	// A few restores at a time, not count at once: each checks the
	// host's room (hostroom.go) before it starts, which a hundred
	// started together would all pass before any of them used memory.
	slots := make(chan struct{}, forkParallel())
	var wg sync.WaitGroup
	for i := range out {
		wg.Go(func() {
			select {
			case slots <- struct{}{}:
				defer func() { <-slots }()
			case <-ctx.Done():
				out[i].Err = ctx.Err()
				return
			}
			r := req
			r.Metadata = maps.Clone(of.Metadata)
			out[i].Sandbox, out[i].Err = m.create(ctx, r, &tmpl, nil, m.clock.Now())
		})
	}
	wg.Wait()
	return out, nil
}

// template is the template whose sandboxes are clones of the snapshot in
// dir.
func (of SnapshotOf) template(dir string) Template {
	return Template{Name: of.Template, Policy: of.Policy, Backend: of.Backend, Snapshot: dir, VolumeMounts: of.VolumeMounts}
}

// scratchDir makes a directory for a fork's snapshot (kind "forks") or
// a warm one ("warm"): in the state directory, where the next start
// removes what a crash left.
func (m *Manager) scratchDir(kind string) (string, error) {
	if m.cfg.StateDir == "" {
		return os.MkdirTemp("", "airlock-"+kind+"-")
	}
	dir := filepath.Join(m.cfg.StateDir, kind)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	return os.MkdirTemp(dir, "")
}

// MaxForks bounds one fork request's count: E2B's.
const MaxForks = 100

// forkParallel is how many of a fork's copies start at once: a restore
// is mostly CPU (runsc reading the image back), so more than a few per
// core only queue in the kernel.
func forkParallel() int { return min(max(2*runtime.NumCPU(), 4), 32) }
