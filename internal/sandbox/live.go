package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// Live restore (Config.LiveRestore): sandboxes outlive the daemon. Each
// one running, or paused in memory, on a backend whose boxes outlive
// their process (a backend.Adopter) has a record of what the API knows
// of it in <StateDir>/live/<id>.json, written at every change (create,
// pause, resume, time to live, network) and removed when it ends or is
// saved to disk. A daemon that starts takes back the box of each record
// (Adopt), and its network (NetworkAdopter): same ids, tokens, metadata,
// time to live and policy; its processes never stopped. Its open
// connections through the daemon (to its agent, through the proxy) ended
// with the daemon that held them. What the backend kept that no record
// names (a pool's box, one being created) is removed (DropUnadopted).

// NetworkAdopter is a Network that can take back a network an earlier
// process made: the one handle names, whose sandbox runs in ns still
// (which it closes on error).
type NetworkAdopter interface {
	Adopt(ctx context.Context, id, handle string, ns *os.File, pol policy.Network) (NetAttachment, error)
}

// keptNet is a NetAttachment that a NetworkAdopter can take back.
type keptNet interface{ Handle() string }

func (m *Manager) liveDir() string { return filepath.Join(m.cfg.StateDir, "live") }

// keepLive writes sb's record if it is to outlive the daemon, running
// or paused in memory, and removes it otherwise; sb.mu is held. A
// record that cannot be written leaves the sandbox to die with the
// daemon, as without live restore: said in the log.
func (m *Manager) keepLive(sb *Sandbox) {
	if !m.cfg.LiveRestore || m.cfg.StateDir == "" || sb.private {
		return
	}
	a, ok := bare(sb.inst).(backend.Adoptable)
	if !ok || a.Handle() == "" || (sb.state != Running && sb.state != Paused) {
		m.dropLive(sb.ID)
		return
	}
	rec := m.record(sb)
	rec.Handle, rec.Paused, rec.EndAt = a.Handle(), sb.state == Paused, sb.endAt
	if rec.Paused && m.cfg.MaxTTL == 0 {
		rec.EndAt = time.Time{} // no end while paused
	}
	if sb.net != nil {
		k, ok := sb.net.(keptNet)
		if !ok {
			m.dropLive(sb.ID)
			return
		}
		rec.Net = k.Handle()
		rec.Policy.Network = sb.net.Policy()
	}
	if err := writeJSON(m.liveDir(), sb.ID, rec); err != nil {
		m.log.Error("live sandbox's record: it will not outlive this daemon", "sandbox", sb.ID, "err", err)
	}
}

// dropLive removes sandbox id's live record, if it has one.
func (m *Manager) dropLive(id string) {
	if m.cfg.StateDir != "" {
		os.Remove(filepath.Join(m.liveDir(), id+".json"))
	}
}

// outlives reports whether sb is left running at Shutdown: with live
// restore, a box whose backend can take it back.
func (m *Manager) outlives(sb *Sandbox) bool {
	if !m.cfg.LiveRestore || sb.private {
		return false
	}
	a, ok := bare(sb.instance()).(backend.Adoptable)
	return ok && a.Handle() != ""
}

// adoptLive takes back the sandboxes of the live records, then has the
// backends remove what they kept that none of them names. It runs before
// any box of this process starts: until a backend has taken back its
// boxes, what it holds for them (host ids, network slots) looks free.
func (m *Manager) adoptLive() {
	if m.cfg.StateDir == "" || m.cfg.BackendByName == nil {
		return
	}
	entries, _ := os.ReadDir(m.liveDir())
	start, n := m.clock.Now(), 0
	backends := map[string]bool{"namespaces": true, "gvisor": true}
	for _, e := range entries {
		if !recordName(e.Name()) {
			if filepath.Ext(e.Name()) == ".new" {
				os.Remove(filepath.Join(m.liveDir(), e.Name()))
			}
			continue
		}
		path := filepath.Join(m.liveDir(), e.Name())
		if err := m.adopt(path, backends); err != nil {
			m.log.Error("a live sandbox could not be taken back: it is removed", "record", e.Name(), "err", err)
			os.Remove(path)
			continue
		}
		n++
	}
	for name := range backends {
		if be, err := m.cfg.BackendByName(name); err == nil {
			if a, ok := be.(backend.Adopter); ok {
				a.DropUnadopted()
			}
		}
	}
	if n > 0 {
		m.log.Info("live sandboxes taken back", "count", n, "ms", m.since(start).Milliseconds())
	}
}

// adopt takes back the sandbox of the record at path, adding its
// backend's name to backends.
func (m *Manager) adopt(path string, backends map[string]bool) error {
	var rec savedRecord
	if err := readJSON(path, &rec); err != nil {
		return err
	}
	backends[rec.Backend] = true
	if rec.ID+".json" != filepath.Base(path) || rec.Handle == "" {
		return errors.New("not a record of a live sandbox")
	}
	be, err := m.cfg.BackendByName(rec.Backend)
	if err != nil {
		return err
	}
	a, ok := be.(backend.Adopter)
	if !ok {
		return fmt.Errorf("backend %s takes back no sandbox", rec.Backend)
	}
	ctx := m.ctx
	inst, netns, err := a.Adopt(ctx, rec.Handle)
	if err != nil {
		return err
	}
	var att NetAttachment
	if netns != nil {
		na, ok := m.cfg.Network.(NetworkAdopter)
		if ok && rec.Policy.Network.Mode != policy.NetNone {
			att, err = na.Adopt(ctx, rec.ID, rec.Net, netns, rec.Policy.Network)
		} else {
			err = errors.New("its network cannot be taken back")
			netns.Close()
		}
		if err != nil {
			inst.Kill(context.Background())
			inst.Wait()
			return fmt.Errorf("network: %w", err)
		}
		inst = netInstance{inst, att}
	}
	usage, _ := inst.Usage(ctx)
	sb := m.fromRecord(&rec, be, inst, att)
	sb.atStart = usage
	sb.apiMark = cpuMark{usage.CPU, m.clock.Now()}
	sb.sampleMark = sb.apiMark
	state := Running
	if rec.Paused {
		state = Paused
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if err := m.transition(sb, opAdopt, state); err != nil {
		inst.Kill(context.Background())
		inst.Wait()
		return err
	}
	m.mu.Lock()
	if m.sandboxes[sb.ID] != nil {
		// Saved to disk too (a daemon died between the two records): its
		// box ended with the save.
		m.mu.Unlock()
		inst.Kill(context.Background())
		inst.Wait()
		return errors.New("it was saved to disk since")
	}
	m.sandboxes[sb.ID] = sb
	m.mu.Unlock()
	// Its time to live runs on from where it was.
	m.armRecorded(sb)
	m.watch(sb, inst)
	m.log.Info("live sandbox taken back", "sandbox", sb.ID, "state", state.String())
	return nil
}
