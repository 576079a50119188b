package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// A pause saves the sandbox to disk where its backend can (a
// backend.Checkpointer: gVisor) and it has no network: its memory,
// processes and files go into the backend's state, the box ends and its
// memory is freed, and a record of what the API knows of it (ids, tokens,
// metadata, policy, time to live) goes to <StateDir>/saved/<id>.json. It
// then counts against no limit, survives a restart of the daemon (and of
// the host), and connect restores it. Elsewhere a pause freezes the box
// in memory, as before.

// savedRecord is what the manager keeps of a sandbox saved to disk.
type savedRecord struct {
	ID, TemplateID, ClientID  string
	AccessToken, TrafficToken string
	Metadata                  map[string]string
	StartedAt, EndAt          time.Time // EndAt zero: no end while paused
	CPUs                      float64
	MemoryMB, DiskMB          int64
	AutoPause, AutoResume     bool
	AutoPauseFiles            bool
	Ingress                   Ingress
	Policy                    policy.Policy
	Backend                   string // its name
	Saved                     string // the backend's name for the saved box, or savedFiles
	Env                       map[string]string
}

var recordName = lazyRegexp(`^i[0-9a-f]{19}\.json$`)

func (m *Manager) savedDir() string { return filepath.Join(m.cfg.StateDir, "saved") }

// canSave reports whether a pause of sb saves it to disk.
func (m *Manager) canSave(sb *Sandbox) bool {
	_, c := sb.inst.(backend.Checkpointer)
	_, r := sb.be.(backend.Restorer)
	return c && r && sb.net == nil && !m.cfg.PauseInMemory
}

// save saves sb to disk; sb.mu is held. On error sb runs on.
func (m *Manager) save(ctx context.Context, sb *Sandbox) error {
	start := time.Now()
	if err := m.quiesce(ctx, sb); err != nil {
		return err
	}
	inst := sb.inst
	name, err := inst.(backend.Checkpointer).Checkpoint(ctx)
	if err != nil {
		return err
	}
	// Its box has ended; the watcher (waiting for sb.mu) sees it is no
	// longer sb's.
	sb.inst, sb.saved = nil, name
	m.saved.Add(1)
	m.log.Info("sandbox saved to disk", "sandbox", sb.ID, "ms", time.Since(start).Milliseconds())
	return nil
}

// quiesce has sb's agent let go of the host's socket, which checkpoints
// cannot keep: every connection to it ends here, as on E2B's pause. The
// backend's Checkpoint or Snapshot tells it to listen again. sb.mu is
// held.
func (m *Manager) quiesce(ctx context.Context, sb *Sandbox) error {
	// Not sb.transport: it dials through sb.instance(), which waits for
	// sb.mu, held here.
	if err := postAgent(ctx, sb.inst, (*agentproto.Client).Checkpoint, 10*time.Second); err != nil {
		return err
	}
	sb.transport.CloseIdleConnections()
	sb.ports.CloseIdleConnections()
	return nil
}

// writeRecord writes sb's record; sb.mu is held.
func (m *Manager) writeRecord(sb *Sandbox) error {
	if m.cfg.StateDir == "" {
		return nil
	}
	rec := savedRecord{
		ID: sb.ID, TemplateID: sb.TemplateID, ClientID: sb.ClientID, AccessToken: sb.AccessToken, TrafficToken: sb.TrafficToken,
		Metadata: sb.Metadata, StartedAt: sb.StartedAt, CPUs: sb.CPUs, MemoryMB: sb.MemoryMB, DiskMB: sb.DiskMB,
		AutoPause: sb.autoPause, AutoResume: sb.AutoResume, AutoPauseFiles: sb.autoPauseFiles, Ingress: sb.Ingress, Policy: sb.pol,
		Backend: sb.be.Name(), Saved: sb.saved, Env: sb.env,
	}
	if m.cfg.MaxTTL > 0 {
		rec.EndAt = sb.endAt
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(m.savedDir(), 0o700); err != nil {
		return err
	}
	tmp := filepath.Join(m.savedDir(), "."+sb.ID+".new")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(m.savedDir(), sb.ID+".json"))
}

func (m *Manager) removeRecord(id string) {
	if m.cfg.StateDir != "" {
		os.Remove(filepath.Join(m.savedDir(), id+".json"))
	}
}

// PublicError is a refusal whose message is fit for clients, with a cause
// that is not (host paths, a backend's words): the API logs the cause and
// answers with Err alone.
type PublicError struct {
	Err   error // what the client is told; wraps the kind (ErrInvalid, …)
	Cause error
}

func (e *PublicError) Error() string { return e.Err.Error() }
func (e *PublicError) Unwrap() error { return e.Err }

// UnrestorableError is a restore that failed: its saved state is corrupt,
// or of another version of the backend's runtime, or the host lacks
// what it needs. The saved state stays, for another try or a kill.
type UnrestorableError struct {
	ID string
	// Snapshot: ID is a snapshot's, which a sandbox was to start from,
	// rather than a paused sandbox's.
	Snapshot bool
	Err      error // the backend's words: for the log, not for clients
}

func (e *UnrestorableError) Error() string {
	if e.Snapshot {
		return fmt.Sprintf("start from snapshot %s: %v", e.ID, e.Err)
	}
	return fmt.Sprintf("restore sandbox %s: %v", e.ID, e.Err)
}
func (e *UnrestorableError) Unwrap() []error { return []error{ErrUnrestorable, e.Err} }

// Public is what a client is told: the backend's reason where it gave
// one fit for clients (a backend.StateError).
func (e *UnrestorableError) Public() string {
	why := "(it may be corrupt, or saved by another version of the runtime)"
	var se *backend.StateError
	if errors.As(e.Err, &se) {
		why = "(" + se.Error() + ")"
	}
	if e.Snapshot {
		return fmt.Sprintf("no sandbox can start from snapshot %s %s; delete it", e.ID, why)
	}
	return fmt.Sprintf("sandbox %s could not be restored from its saved state %s; it stays paused until killed", e.ID, why)
}

// restore brings sb back from disk; sb.mu is held.
func (m *Manager) restore(ctx context.Context, sb *Sandbox) error {
	start := time.Now()
	if sb.saved == savedFiles {
		inst, err := m.restoreFiles(ctx, sb)
		if err != nil {
			return &UnrestorableError{ID: sb.ID, Err: err}
		}
		os.Remove(m.filesPath(sb.ID))
		return m.restored(sb, inst, start)
	}
	inst, err := sb.be.(backend.Restorer).Restore(ctx, sb.saved, sb.pol)
	if err != nil {
		return &UnrestorableError{ID: sb.ID, Err: err}
	}
	if err := warm(ctx, inst); err != nil {
		// Its saved state stays, for another try.
		inst.Kill(context.Background())
		inst.Wait()
		return &UnrestorableError{ID: sb.ID, Err: fmt.Errorf("its agent: %w", err)}
	}
	return m.restored(sb, inst, start)
}

// restored makes inst, restored since start, sb's box; sb.mu is held.
func (m *Manager) restored(sb *Sandbox, inst Instance, start time.Time) error {
	sb.inst, sb.saved = inst, ""
	m.saved.Add(-1)
	m.watch(sb, inst)
	m.removeRecord(sb.ID)
	m.log.Info("sandbox restored from disk", "sandbox", sb.ID, "ms", time.Since(start).Milliseconds())
	return nil
}

// forget removes what is saved of sb; sb.mu is held.
func (m *Manager) forget(sb *Sandbox) {
	if sb.saved == savedFiles {
		os.Remove(m.filesPath(sb.ID))
	} else if err := sb.be.(backend.Restorer).Forget(sb.saved); err != nil {
		m.log.Error("forget saved sandbox", "sandbox", sb.ID, "err", err)
	}
	sb.saved = ""
	m.saved.Add(-1)
	m.removeRecord(sb.ID)
}

// loadSaved registers the sandboxes an earlier daemon saved, paused, and
// forgets what its backends saved that no record names (a daemon that
// died between the two).
func (m *Manager) loadSaved() {
	if m.cfg.StateDir == "" || m.cfg.BackendByName == nil {
		return
	}
	// A fork's snapshot outlives no fork (snapshot.go), a warm one no
	// daemon (warm.go).
	os.RemoveAll(filepath.Join(m.cfg.StateDir, "forks"))
	os.RemoveAll(filepath.Join(m.cfg.StateDir, "warm"))
	named := map[string]map[string]bool{} // backend → saved names with a record
	recorded := map[string]bool{}         // ids
	entries, _ := os.ReadDir(m.savedDir())
	for _, e := range entries {
		if !recordName().MatchString(e.Name()) {
			continue
		}
		path := filepath.Join(m.savedDir(), e.Name())
		sb, err := m.loadRecord(path)
		if err != nil {
			m.log.Error("saved sandbox left out", "record", e.Name(), "err", err)
			continue
		}
		recorded[sb.ID] = true
		if named[sb.be.Name()] == nil {
			named[sb.be.Name()] = map[string]bool{}
		}
		named[sb.be.Name()][sb.saved] = true
	}
	// Files of no record: a daemon that died while saving them.
	for _, e := range entries {
		name := e.Name()
		if id, ok := strings.CutSuffix(name, ".tar"); ok || strings.HasSuffix(name, ".tar.new") {
			if !ok || !recorded[id] {
				m.log.Info("forgetting saved files without a record", "file", name)
				os.Remove(filepath.Join(m.savedDir(), name))
			}
		}
	}
	for _, name := range []string{"namespaces", "gvisor"} {
		be, err := m.cfg.BackendByName(name)
		r, ok := be.(backend.Restorer)
		if err != nil || !ok {
			continue
		}
		saved, _ := r.Saved()
		for _, s := range saved {
			if !named[name][s] {
				m.log.Info("forgetting a saved sandbox without a record", "backend", name, "saved", s)
				r.Forget(s)
			}
		}
	}
}

func (m *Manager) loadRecord(path string) (*Sandbox, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rec savedRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("unreadable: %v", err)
	}
	if rec.ID+".json" != filepath.Base(path) || rec.Saved == "" {
		return nil, errors.New("not a record of a saved sandbox")
	}
	be, err := m.cfg.BackendByName(rec.Backend)
	if err != nil {
		return nil, err
	}
	if rec.Saved == savedFiles {
		if _, err := os.Stat(m.filesPath(rec.ID)); err != nil {
			return nil, errors.New("its saved files are missing")
		}
	} else if _, ok := be.(backend.Restorer); !ok {
		return nil, fmt.Errorf("backend %s restores nothing", rec.Backend)
	}
	sb := &Sandbox{
		ID: rec.ID, TemplateID: rec.TemplateID, ClientID: rec.ClientID, AccessToken: rec.AccessToken, TrafficToken: rec.TrafficToken,
		Metadata: rec.Metadata, StartedAt: rec.StartedAt, CPUs: rec.CPUs, MemoryMB: rec.MemoryMB, DiskMB: rec.DiskMB,
		AutoResume: rec.AutoResume, Ingress: rec.Ingress, pol: rec.Policy, be: be, ended: make(chan struct{}),
		autoPause: rec.AutoPause, autoPauseFiles: rec.AutoPauseFiles, paused: true, saved: rec.Saved, endAt: rec.EndAt,
		env: rec.Env,
	}
	if sb.Metadata == nil {
		sb.Metadata = map[string]string{}
	}
	sb.transport, sb.ports = agentTransport(sb.instance), portTransport(sb.instance)
	m.saved.Add(1)
	m.mu.Lock()
	m.sandboxes[sb.ID] = sb
	m.mu.Unlock()
	// Its timer ends it at endAt; without one (no maxTimeout) it waits,
	// stopped, for the time to live a resume gives it.
	sb.mu.Lock()
	sb.timer = time.AfterFunc(max(time.Until(sb.endAt), 0), func() { m.expire(sb) })
	if sb.endAt.IsZero() {
		sb.timer.Stop()
	}
	sb.mu.Unlock()
	m.log.Info("saved sandbox found", "sandbox", sb.ID)
	return sb, nil
}

// lazyRegexp compiles expr at its first use, not at every start of the
// binary: a counted repetition such as {0,127} takes a fraction of a
// millisecond to compile, which airlock run would pay each time.
func lazyRegexp(expr string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })
}
