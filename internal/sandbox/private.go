package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// Private is a sandbox the daemon runs for itself, a template build's:
// it is never listed nor handed to a client, counts against no limit of
// clients' sandboxes, and Shutdown kills it.
type Private struct {
	m         *Manager
	inst      Instance
	transport *http.Transport
	once      sync.Once
}

// StartPrivate starts a sandbox of policy p on backend b (nil: the
// manager's), in a network of its own if p has one.
func (m *Manager) StartPrivate(ctx context.Context, b Backend, p policy.Policy) (*Private, error) {
	if b == nil {
		b = m.backend
	}
	inst, _, err := m.inNetwork(ctx, "build-"+newSandboxID(""), p, func(netns *os.File) (Instance, error) { return b.Start(ctx, p, netns) })
	if err != nil {
		return nil, err
	}
	if err := warm(ctx, inst); err != nil {
		m.discard(inst)
		return nil, err
	}
	pv := &Private{m: m, inst: inst, transport: agentTransport(the(inst))}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		m.discard(inst)
		return nil, ErrShuttingDown
	}
	m.private[pv] = struct{}{}
	m.mu.Unlock()
	return pv, nil
}

// Agent is a client of the sandbox's agent.
func (p *Private) Agent() *agentproto.Client { return &agentproto.Client{Transport: p.transport} }

// ExportRoot writes what the sandbox changed of its image's root as a
// layer (policy ExportRoot).
func (p *Private) ExportRoot(ctx context.Context, w io.Writer) error {
	e, ok := p.inst.(backend.RootExporter)
	if !ok {
		return errors.New("this backend cannot read back a sandbox's root")
	}
	return e.ExportRoot(ctx, w)
}

// Close kills the sandbox and waits until it is gone.
func (p *Private) Close() {
	p.once.Do(func() {
		p.m.mu.Lock()
		delete(p.m.private, p)
		p.m.mu.Unlock()
		p.transport.CloseIdleConnections()
		if err := p.inst.Kill(context.Background()); err != nil {
			p.m.log.Error("kill sandbox", "err", err)
		}
		if err := p.inst.Wait(); err != nil {
			p.m.log.Error("sandbox teardown", "err", fmt.Errorf("private sandbox: %w", err))
		}
	})
}
