package sandbox

import (
	"context"
	"net/http"
	"sync"
	"time"
)

// pool keeps ready sandboxes of one template, agent up and answering, so
// that a create is a claim. A filler goroutine tops it up in the
// background; a claim never waits for it.
type pool struct {
	m      *Manager
	tmpl   Template
	refill chan struct{}

	mu    sync.Mutex
	ready []Instance
}

// claim takes a ready sandbox, or returns nil when the pool is empty.
func (p *pool) claim() (Instance, bool) {
	defer p.kick()
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.ready) > 0 {
		inst := p.ready[0]
		p.ready = p.ready[1:]
		select {
		case <-inst.Done(): // died while waiting: discard it
			p.m.discard(inst)
		default:
			return inst, true
		}
	}
	return nil, false
}

func (p *pool) kick() {
	select {
	case p.refill <- struct{}{}:
	default:
	}
}

// idleEstimate is what a fresh pooled sandbox is assumed to use before
// one has been measured (init, agent, a small root).
const idleEstimate = 16 << 20

// fill keeps the pool at its size, within the memory budget, until the
// manager shuts down.
func (p *pool) fill() {
	defer p.m.wg.Done()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		for p.wanted() && p.m.ctx.Err() == nil {
			inst, err := p.m.backendOf(&p.tmpl).Start(p.m.ctx, p.tmpl.Policy, nil)
			if err != nil {
				p.m.log.Error("pool: start sandbox", "template", p.tmpl.Name, "err", err)
				break // retry at the next tick, not in a tight loop
			}
			if err := warm(p.m.ctx, inst); err != nil {
				p.m.log.Error("pool: agent not answering", "template", p.tmpl.Name, "err", err)
				p.m.discard(inst)
				break
			}
			p.mu.Lock()
			p.ready = append(p.ready, inst)
			p.mu.Unlock()
		}
		select {
		case <-p.m.ctx.Done():
			return
		case <-p.refill:
		case <-tick.C:
			p.prune()
		}
	}
}

// wanted reports whether the pool should get one more sandbox.
func (p *pool) wanted() bool {
	p.mu.Lock()
	n := len(p.ready)
	p.mu.Unlock()
	if n >= p.tmpl.PoolSize {
		return false
	}
	budget := p.m.cfg.PoolMemoryBudget
	if budget <= 0 {
		return true
	}
	total, largest := p.m.pooledMemory(p)
	return total+max(largest, idleEstimate) <= budget
}

// prune drops ready sandboxes that died while waiting.
func (p *pool) prune() {
	p.mu.Lock()
	defer p.mu.Unlock()
	alive := p.ready[:0]
	for _, inst := range p.ready {
		select {
		case <-inst.Done():
			p.m.discard(inst)
		default:
			alive = append(alive, inst)
		}
	}
	p.ready = alive
}

// drain kills every ready sandbox and waits until they are gone.
func (p *pool) drain() {
	p.mu.Lock()
	ready := p.ready
	p.ready = nil
	p.mu.Unlock()
	for _, inst := range ready {
		if err := inst.Kill(context.Background()); err != nil {
			p.m.log.Error("pool: kill sandbox", "template", p.tmpl.Name, "err", err)
		}
	}
	for _, inst := range ready {
		inst.Wait()
	}
}

// pooledMemory is what all pools' ready sandboxes use now, and the most
// that one ready sandbox of pool q uses: what q's next is expected to use.
func (m *Manager) pooledMemory(q *pool) (total, largest int64) {
	for _, p := range m.pools {
		p.mu.Lock()
		for _, inst := range p.ready {
			used := int64(idleEstimate)
			if u, err := inst.Usage(m.ctx); err == nil && u.Memory > 0 {
				used = u.Memory
			}
			total += used
			if p == q {
				largest = max(largest, used)
			}
		}
		p.mu.Unlock()
	}
	return total, largest
}

// warm waits until the agent answers its health check, so that a claimed
// sandbox serves its first request without paying the agent's start.
func warm(ctx context.Context, inst Instance) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tr := agentTransport(inst)
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent/health", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}
