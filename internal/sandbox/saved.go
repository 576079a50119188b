package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/sandboxid"
)

// A sandbox saved to disk (savedisk.go) or that kept only its files
// (savedfiles.go) has a record of what the API knows of it (ids, tokens,
// metadata, policy, time to live) in <StateDir>/saved/<id>.json, written
// when it is paused and removed when it is resumed or killed. A daemon
// that starts registers the sandboxes of those records, saved and
// paused, as they were (loadSaved).

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
	VolumeMounts              []VolumeMount
	Policy                    policy.Policy
	Backend                   string // its name
	Saved                     string // the backend's name for the saved box, or savedFiles
	Env                       map[string]string
	// A live sandbox's (live.go): the backend's name for its box, whether
	// it is paused (in memory), and its network's.
	Handle string `json:",omitempty"`
	Paused bool   `json:",omitempty"`
	Net    string `json:",omitempty"`
}

// recordName reports whether name is a saved sandbox's record: its id
// and ".json".
func recordName(name string) bool {
	id, ok := strings.CutSuffix(name, ".json")
	return ok && sandboxid.Valid(id)
}

func (m *Manager) savedDir() string { return filepath.Join(m.cfg.StateDir, "saved") }

// writeRecord writes the record of sb, Saved or SavedFiles; sb.mu is held.
func (m *Manager) writeRecord(sb *Sandbox) error {
	if m.cfg.StateDir == "" {
		return nil
	}
	saved := sb.savedName
	if sb.state == SavedFiles {
		saved = savedFiles
	}
	rec := m.record(sb)
	rec.Saved = saved
	if err := writeJSON(m.savedDir(), sb.ID, rec); err != nil {
		return err
	}
	m.dropLive(sb.ID)
	return nil
}

// record is what the API knows of sb; sb.mu is held.
func (m *Manager) record(sb *Sandbox) *savedRecord {
	rec := &savedRecord{
		ID: sb.ID, TemplateID: sb.TemplateID, ClientID: sb.ClientID, AccessToken: sb.AccessToken, TrafficToken: sb.TrafficToken,
		Metadata: sb.Metadata, StartedAt: sb.StartedAt, CPUs: sb.CPUs, MemoryMB: sb.MemoryMB, DiskMB: sb.DiskMB,
		AutoPause: sb.autoPause, AutoResume: sb.AutoResume, AutoPauseFiles: sb.autoPauseFiles, Ingress: sb.Ingress, VolumeMounts: sb.VolumeMounts, Policy: sb.pol,
		Backend: sb.be.Name(), Env: sb.env,
	}
	if m.cfg.MaxTTL > 0 {
		rec.EndAt = sb.endAt
	}
	return rec
}

// readJSON reads the record at path into v.
func readJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("unreadable: %v", err)
	}
	return nil
}

// writeJSON writes v as dir/<id>.json, whole or not at all.
func writeJSON(dir, id string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+id+".new")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, id+".json"))
}

func (m *Manager) removeRecord(id string) {
	if m.cfg.StateDir != "" {
		os.Remove(filepath.Join(m.savedDir(), id+".json"))
	}
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
		if !recordName(e.Name()) {
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
		named[sb.be.Name()][sb.savedName] = true
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
	var rec savedRecord
	if err := readJSON(path, &rec); err != nil {
		return nil, err
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
	sb := m.fromRecord(&rec, be, nil, nil)
	state := SavedFiles
	if rec.Saved != savedFiles {
		state, sb.savedName = Saved, rec.Saved
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if err := m.transition(sb, opLoad, state); err != nil {
		return nil, err
	}
	m.mu.Lock()
	m.sandboxes[sb.ID] = sb
	m.mu.Unlock()
	m.armRecorded(sb)
	m.log.Info("saved sandbox found", "sandbox", sb.ID)
	return sb, nil
}

// fromRecord is the sandbox rec describes, on be, in inst with network
// att (nil while it has no box).
func (m *Manager) fromRecord(rec *savedRecord, be Backend, inst Instance, att NetAttachment) *Sandbox {
	sb := &Sandbox{
		ID: rec.ID, TemplateID: rec.TemplateID, ClientID: rec.ClientID, AccessToken: rec.AccessToken, TrafficToken: rec.TrafficToken,
		Metadata: rec.Metadata, StartedAt: rec.StartedAt, CPUs: rec.CPUs, MemoryMB: rec.MemoryMB, DiskMB: rec.DiskMB,
		AutoResume: rec.AutoResume, Ingress: rec.Ingress, VolumeMounts: rec.VolumeMounts, pol: rec.Policy, be: be,
		ended: make(chan struct{}), clock: m.clock, inst: inst, net: att,
		autoPause: rec.AutoPause, autoPauseFiles: rec.AutoPauseFiles, endAt: rec.EndAt, env: rec.Env,
	}
	if sb.Metadata == nil {
		sb.Metadata = map[string]string{}
	}
	sb.transport, sb.ports = agentTransport(sb.instance), portTransport(sb.instance)
	return sb
}

// armRecorded sets the timer of sb, registered from its record, to end
// it at endAt (now, if that has passed while no daemon ran); without an
// end (paused, no maxTimeout) it waits, stopped, for the time to live a
// resume gives it.
func (m *Manager) armRecorded(sb *Sandbox) {
	sb.timer = m.clock.AfterFunc(max(sb.endAt.Sub(m.clock.Now()), 0), func() { m.expire(sb) })
	if sb.endAt.IsZero() {
		sb.timer.Stop()
	}
}

// lazyRegexp compiles expr at its first use, not at every start of the
// binary: a counted repetition such as {0,127} takes a fraction of a
// millisecond to compile, which airlock run would pay each time.
func lazyRegexp(expr string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })
}
