package sandbox

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// startBox starts a box of t under pol, in netns where pol has a network
// (inNetwork): cloned from t's snapshot if it has one.
func startBox(ctx context.Context, be Backend, t *Template, pol policy.Policy, netns *os.File) (Instance, error) {
	if t.Snapshot == "" {
		return be.Start(ctx, pol, netns)
	}
	c, ok := be.(backend.Cloner)
	if !ok {
		return nil, fmt.Errorf("%w: the %s backend cannot start a sandbox from a snapshot", backend.ErrUnsupported, be.Name())
	}
	return c.Clone(ctx, t.Snapshot, pol, netns)
}

// startTemplate starts a box of t for sandbox id under pol, in a network
// of its own if pol has one.
func (m *Manager) startTemplate(ctx context.Context, be Backend, t *Template, id string, pol policy.Policy) (Instance, NetAttachment, error) {
	return m.inNetwork(ctx, id, pol, func(netns *os.File) (Instance, error) { return startBox(ctx, be, t, pol, netns) })
}

// prepare makes a started sandbox of t ready to be handed out: its agent
// answers, and its template's start command is ready.
func prepare(ctx context.Context, t *Template, inst Instance) error {
	if err := warm(ctx, inst); err != nil {
		return err
	}
	if t.Ready == nil {
		return nil
	}
	tr := agentTransport(the(inst))
	defer tr.CloseIdleConnections()
	return t.Ready(ctx, &agentproto.Client{Transport: tr})
}

// warm waits until the agent answers its health check, so that a claimed
// sandbox serves its first request without paying the agent's start.
func warm(ctx context.Context, inst Instance) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tr := agentTransport(the(inst))
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent/health", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// watch removes sb when inst, its box, dies by itself (its agent crashed,
// the OOM killer), unless inst is no longer sb's: saved to disk.
func (m *Manager) watch(sb *Sandbox, inst Instance) {
	go func() {
		<-inst.Done()
		if sb.instance() == inst {
			m.remove(sb, "ended")
		}
	}()
}

// discard kills inst, which was never handed out, and removes it in the
// background; Shutdown waits for that too.
func (m *Manager) discard(inst Instance) {
	if err := inst.Kill(context.Background()); err != nil {
		m.log.Error("kill sandbox", "err", err)
	}
	m.removing.Add(1)
	go func() {
		defer m.removing.Done()
		if err := inst.Wait(); err != nil {
			m.log.Error("sandbox teardown", "err", err)
		}
	}()
}
