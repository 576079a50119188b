package sandbox

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// A pause that keeps only the files (E2B's keepMemory: false; the
// autoPauseMemory: false of a create) works on every backend: the
// sandbox's agent streams what its user can change of its file system
// (agent/filestate.go) into <StateDir>/saved/<id>.tar, its box ends, and
// its record is written as for a pause to disk, with Saved savedFiles. A
// resume starts a new box of its template with its limits, has its agent
// write the files back and its environment set again, and then it is the
// same sandbox — ids, tokens, metadata — with nothing running: kernels,
// background processes and open connections are gone, as after E2B's
// cold boot from a file-system snapshot.
//
// The daemon only stores the stream, never reads it: it is the sandbox's.
// It is kept within the sandbox's disk limit (and a little for the tar
// headers).

// savedFiles is the record's Saved of a sandbox that keeps only its
// files (SavedFiles).
const savedFiles = "files"

func (m *Manager) filesPath(id string) string { return filepath.Join(m.savedDir(), id+".tar") }

// filesPausable says why a sandbox of template cannot keep only its
// files, or nil.
func (m *Manager) filesPausable(template string) error {
	switch {
	case m.cfg.StateDir == "":
		return fmt.Errorf("%w: a pause that keeps only the files needs a state directory, which this server has not", ErrInvalid)
	case !m.IsConfigured(template):
		// A template's image may let the sandbox write anywhere, and
		// its start command expects what it left: not kept yet.
		return fmt.Errorf("%w: a pause that keeps only the files is for sandboxes of base and code-interpreter-v1; pause this one with its memory", ErrInvalid)
	}
	return nil
}

// filesPausableWith refuses a pause that keeps only the files of a
// sandbox with volumes: a volume mounted in its home or /tmp would be
// saved with them, and its old copy written back over the volume, which
// other sandboxes share, at the resume.
func filesPausableWith(vms []VolumeMount) error {
	if len(vms) > 0 {
		return fmt.Errorf("%w: a pause that keeps only the files is not for a sandbox with volumes; pause it with its memory", ErrInvalid)
	}
	return nil
}

// saveFiles saves sb's files and ends its box; sb.mu is held. On error
// sb runs on.
func (m *Manager) saveFiles(ctx context.Context, sb *Sandbox) error {
	if err := m.filesPausable(sb.TemplateID); err != nil {
		return err
	}
	if err := filesPausableWith(sb.VolumeMounts); err != nil {
		return err
	}
	start := m.clock.Now()
	if err := os.MkdirAll(m.savedDir(), 0o700); err != nil {
		return err
	}
	tmp := filepath.Join(m.savedDir(), "."+sb.ID+".tar.new")
	err := m.fetchFiles(ctx, sb, tmp)
	if err == nil {
		err = os.Rename(tmp, m.filesPath(sb.ID))
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("save the files of sandbox %s: %w", sb.ID, err)
	}
	// Its box ends, and its network with it (the policy stays, for the
	// next box); the watcher (waiting for sb.mu) sees it is no longer
	// sb's.
	inst := sb.inst
	sb.inst = nil
	if sb.net != nil {
		sb.setNetwork(nil, sb.net.Policy())
	}
	if err := inst.Kill(ctx); err != nil {
		m.log.Error("kill sandbox", "sandbox", sb.ID, "err", err)
	}
	if err := inst.Wait(); err != nil {
		m.log.Error("sandbox teardown", "sandbox", sb.ID, "err", err)
	}
	sb.transport.CloseIdleConnections()
	sb.ports.CloseIdleConnections()
	m.log.Info("sandbox's files saved", "sandbox", sb.ID, "ms", m.since(start).Milliseconds())
	return nil
}

// fetchFiles writes the tar stream of sb's files to path.
func (m *Manager) fetchFiles(ctx context.Context, sb *Sandbox, path string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	limit := int64(math.MaxInt64 - 1)
	if d := sb.pol.DiskBytes; d > 0 {
		limit = d + d/8 + 1<<20 // and the tar headers and padding
	}
	// Not sb.transport: it dials through sb.instance(), which waits for
	// sb.mu, held here.
	tr := agentTransport(the(sb.inst))
	defer tr.CloseIdleConnections()
	err = (&agentproto.Client{Transport: tr}).SaveFiles(ctx, f, limit)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	switch {
	case errors.Is(err, agentproto.ErrTooLarge):
		return errors.New("its files are larger than its disk")
	case errors.Is(err, agentproto.ErrFilesIncomplete):
		// The agent could not read all of them; it logged why.
		return errors.New("its agent could not read all of them")
	}
	return err
}

// restoreFiles starts a new box for sb, which keeps only its files, in a
// network of its own under its policy if it has one, and gives it them;
// sb.mu is held.
func (m *Manager) restoreFiles(ctx context.Context, sb *Sandbox) (Instance, NetAttachment, error) {
	m.mu.Lock()
	p := m.pools[sb.TemplateID]
	m.mu.Unlock()
	if p == nil || p.dynamic {
		return nil, nil, fmt.Errorf("its template %s is not this server's", sb.TemplateID)
	}
	tmpl := &p.tmpl
	var inst Instance
	var att NetAttachment
	tp, pol := tmpl.Policy, sb.pol
	if pol.MemoryBytes == tp.MemoryBytes && pol.CPUs == tp.CPUs && pol.Pids == tp.Pids && pol.DiskBytes == tp.DiskBytes && sb.be == m.backendOf(tmpl) {
		inst, att = m.cloneWarm(ctx, m.warmSnapshot(tmpl, false), sb.ID, pol)
	}
	if inst == nil {
		var err error
		if inst, att, err = m.startTemplate(ctx, sb.be, tmpl, sb.ID, pol); err != nil {
			return nil, nil, err
		}
		if err := prepare(ctx, tmpl, inst); err != nil {
			m.discard(inst)
			return nil, nil, err
		}
	}
	tr := agentTransport(the(inst))
	defer tr.CloseIdleConnections()
	err := putFiles(ctx, tr, m.filesPath(sb.ID))
	if err == nil {
		err = setupAgent(ctx, tr, sb.env)
	}
	if err != nil {
		m.discard(inst)
		return nil, nil, err
	}
	return inst, att, nil
}

// putFiles sends the tar stream at path to the agent tr reaches.
func putFiles(ctx context.Context, tr http.RoundTripper, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	err = (&agentproto.Client{Transport: tr}).RestoreFiles(ctx, f)
	if e := (*agentproto.Error)(nil); errors.As(err, &e) {
		return fmt.Errorf("its agent refused its files: %s", e.Message)
	}
	return err
}
