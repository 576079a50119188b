package sandbox

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// pool keeps ready sandboxes of one template, agent up and answering, so
// that a create is a claim. A filler goroutine tops it up in the
// background; a claim never waits for it.
type pool struct {
	m      *Manager
	tmpl   Template
	refill chan struct{}
	// dynamic: the pool of a Source's template, made at its first create
	// and replaced when the template changes.
	dynamic bool
	ctx     context.Context // ends when the pool is replaced or at Shutdown
	cancel  context.CancelFunc

	mu sync.Mutex
	// ready are the sandboxes waiting, of each kind.
	ready [kinds][]Instance
	// plain: a create without a network came, so the pool keeps such
	// sandboxes too (wants).
	plain atomic.Bool
	// starting is the sandbox the filler is starting, if any.
	starting atomic.Bool
}

// The kinds of sandboxes a pool keeps.
const (
	// plainKind: without a network, loopback only.
	plainKind = iota
	// netKind: in a network of its own whose policy is closed, opened as
	// the create that claims it asks (a netInstance). Swapping a policy
	// costs microseconds; making a network ~3 ms and, on a cold start,
	// the whole start: without these, every create of the E2B API's
	// default (the internet) would be started cold.
	netKind
	kinds
)

// kindOf is the kind of pooled sandbox a sandbox under pol is claimed as.
func kindOf(pol policy.Network) int {
	if pol.Mode == policy.NetNone {
		return plainKind
	}
	return netKind
}

// claim takes a ready sandbox of kind k, or returns nil when the pool has
// none. The pool refills at once, or, with !refill, when the claimer
// kicks it.
func (p *pool) claim(k int, refill bool) (Instance, bool) {
	if k == plainKind && !p.plain.Swap(true) {
		p.m.changes.notify()
	}
	if refill {
		defer p.kick()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.ready[k]) > 0 {
		inst := p.ready[k][0]
		p.ready[k] = p.ready[k][1:]
		p.m.changes.notify()
		select {
		case <-inst.Done(): // died while waiting: discard it
			p.m.discard(inst)
		default:
			return inst, true
		}
	}
	return nil, false
}

// wants reports whether the pool keeps sandboxes of kind k: with a
// network where the manager's pools are networked (the E2B API's
// default) and the template can have one; without one where they are not,
// or once a create without a network came (MCP's, a sealed server's).
func (p *pool) wants(k int) bool {
	if k == plainKind {
		return !p.networked() || p.plain.Load()
	}
	return p.networked()
}

// networked reports whether the pool keeps sandboxes with a network: not
// for a template with a start command, which would run before the
// network is open.
func (p *pool) networked() bool {
	return p.m.cfg.NetworkedPools && p.m.cfg.Network != nil && p.tmpl.Ready == nil
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
	if p.dynamic {
		// Replaced, or shut down: what it holds is of no use now.
		defer p.drain()
	}
	if p.size() > 0 {
		// A template with a pool has its warm snapshot (if it wants one)
		// even while the memory budget keeps the pool empty: its cold
		// creates are clones.
		p.m.warmSnapshot(&p.tmpl, true)
	}
	tick := p.m.clock.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if p.dynamic && !p.current() {
			return // its template changed or is gone: its filler drains it
		}
		p.trim()
		for p.ctx.Err() == nil {
			k, ok := p.wanted()
			if !ok {
				break
			}
			p.starting.Store(true)
			inst, err := p.start(k)
			p.starting.Store(false)
			if err != nil {
				p.m.log.Error("pool: start sandbox", "template", p.tmpl.Name, "err", err)
				break // retry at the next tick, not in a tight loop
			}
			p.mu.Lock()
			p.ready[k] = append(p.ready[k], inst)
			p.mu.Unlock()
			p.m.changes.notify()
		}
		select {
		case <-p.ctx.Done():
			return
		case <-p.refill:
		case <-tick.C():
			p.prune()
		}
	}
}

// start starts a ready sandbox of kind k for the pool, and has its agent
// start the kernels its template starts only in a pool (see
// agentproto.PrestartLateEnv): they are no part of a warm snapshot.
func (p *pool) start(k int) (Instance, error) {
	inst, err := p.startReady(k)
	if err != nil || !startsLate(&p.tmpl) {
		return inst, err
	}
	// In the background, answered at once: a failure costs the first
	// cell of that language its kernel's start, no more.
	if err := postAgent(p.ctx, inst, (*agentproto.Client).WarmLate, 10*time.Second); err != nil {
		p.m.log.Warn("pool: late kernels not started", "template", p.tmpl.Name, "err", err)
	}
	return inst, nil
}

// startsLate reports whether t's agent starts kernels once in a pool.
func startsLate(t *Template) bool {
	return slices.ContainsFunc(t.Policy.Env, func(kv string) bool { return strings.HasPrefix(kv, agentproto.PrestartLateEnv+"=") })
}

// startReady starts a ready sandbox of kind k for the pool: a clone of
// its template's warm snapshot, waiting for the first one to be made, or
// started and readied; with a network, in a network closed to
// everything.
func (p *pool) startReady(k int) (Instance, error) {
	pol := p.tmpl.Policy
	pol.Network = policy.Network{} // plainKind: loopback only
	if k == netKind {
		pol.Network = policy.Network{Mode: policy.NetFiltered}
	}
	id := "pool-" + p.tmpl.Name
	w := p.m.warmSnapshot(&p.tmpl, true)
	if w != nil {
		select {
		case <-w.done:
		case <-p.ctx.Done():
			return nil, p.ctx.Err()
		}
	}
	if inst, _ := p.m.cloneWarm(p.ctx, w, id, pol); inst != nil {
		return inst, nil
	}
	inst, _, err := p.m.startTemplate(p.ctx, p.m.backendOf(&p.tmpl), &p.tmpl, id, pol)
	if err != nil {
		return nil, err
	}
	if err := prepare(p.ctx, &p.tmpl, inst); err != nil {
		p.m.discard(inst)
		return nil, fmt.Errorf("not ready: %w", err)
	}
	return inst, nil
}

// wanted reports whether the pool should get one more sandbox, and of
// which kind: with a network first, where it keeps both.
func (p *pool) wanted() (int, bool) {
	size := p.size()
	k := -1
	p.mu.Lock()
	for _, kind := range []int{netKind, plainKind} {
		if p.wants(kind) && len(p.ready[kind]) < size {
			k = kind
			break
		}
	}
	p.mu.Unlock()
	if k < 0 || p.m.hostRoom() != nil {
		return 0, false
	}
	budget := p.m.cfg.PoolMemoryBudget
	if budget <= 0 {
		return k, true
	}
	total, largest := p.m.pooledMemory(p)
	return k, total+max(largest, idleEstimate) <= budget
}

// size is how many ready sandboxes the pool keeps: its template's
// PoolSize, unless SetPoolSize said otherwise.
func (p *pool) size() int {
	p.m.mu.Lock()
	defer p.m.mu.Unlock()
	if n, ok := p.m.poolSizes[p.tmpl.Name]; ok {
		return n
	}
	return p.tmpl.PoolSize
}

// trim kills the ready sandboxes beyond the pool's size, newest first,
// and those of a kind it no longer keeps.
func (p *pool) trim() {
	n := p.size()
	p.mu.Lock()
	var surplus []Instance
	for k := range p.ready {
		keep := n
		if !p.wants(k) {
			keep = 0
		}
		if len(p.ready[k]) > keep {
			surplus = append(surplus, p.ready[k][keep:]...)
			p.ready[k] = p.ready[k][:keep]
		}
	}
	p.mu.Unlock()
	for _, inst := range surplus {
		p.m.discard(inst)
	}
	if len(surplus) > 0 {
		p.m.changes.notify()
	}
}

// SetPoolSize makes the pool of template name keep size ready sandboxes
// from now on, whatever its configuration says; a negative size goes
// back to the configuration. A template that this host does not have
// (yet) gets the size when it is first created from.
func (m *Manager) SetPoolSize(name string, size int) {
	m.mu.Lock()
	if size < 0 {
		delete(m.poolSizes, name)
	} else {
		m.poolSizes[name] = size
	}
	p := m.pools[name]
	m.mu.Unlock()
	if p != nil {
		p.kick()
		return
	}
	// An image-store template gets its pool now, not at its first create.
	if m.cfg.Source != nil && size > 0 {
		if t, err := m.cfg.Source.Template(name); err == nil {
			m.sourcePool(&t)
		}
	}
}

// prune drops ready sandboxes that died while waiting.
func (p *pool) prune() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k := range p.ready {
		alive := p.ready[k][:0]
		for _, inst := range p.ready[k] {
			select {
			case <-inst.Done():
				p.m.discard(inst)
				p.m.changes.notify()
			default:
				alive = append(alive, inst)
			}
		}
		p.ready[k] = alive
	}
}

// drain kills every ready sandbox and waits until they are gone.
func (p *pool) drain() {
	p.mu.Lock()
	ready := slices.Concat(p.ready[:]...)
	p.ready = [kinds][]Instance{}
	p.mu.Unlock()
	for _, inst := range ready {
		if err := inst.Kill(context.Background()); err != nil {
			p.m.log.Error("pool: kill sandbox", "template", p.tmpl.Name, "err", err)
		}
	}
	for _, inst := range ready {
		inst.Wait()
	}
	p.m.changes.notify()
}

// PoolStatus is a template's pool as an operator looks at it.
type PoolStatus struct {
	Template string `json:"template"`
	Size     int    `json:"size"`     // how many it keeps
	Ready    int    `json:"ready"`    // waiting to be claimed
	Starting int    `json:"starting"` // being started now
	// MemoryBytes is what its ready sandboxes use now (their cgroups).
	MemoryBytes int64 `json:"memoryBytes"`
}

// Pools are the manager's pools, by template name, and the memory
// budget they share (0: none).
func (m *Manager) Pools(ctx context.Context) ([]PoolStatus, int64) {
	m.mu.Lock()
	pools := slices.Collect(maps.Values(m.pools))
	m.mu.Unlock()
	var out []PoolStatus
	for _, p := range pools {
		st := PoolStatus{Template: p.tmpl.Name, Size: p.size()}
		if p.starting.Load() {
			st.Starting = 1
		}
		p.mu.Lock()
		ready := slices.Concat(p.ready[:]...)
		p.mu.Unlock()
		st.Ready = len(ready)
		for _, inst := range ready {
			if u, err := inst.Usage(ctx); err == nil {
				st.MemoryBytes += u.Memory
			}
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b PoolStatus) int { return strings.Compare(a.Template, b.Template) })
	return out, m.cfg.PoolMemoryBudget
}

// pooledMemory is what all pools' ready sandboxes use now, and the most
// that one ready sandbox of pool q uses: what q's next is expected to use.
func (m *Manager) pooledMemory(q *pool) (total, largest int64) {
	m.mu.Lock()
	pools := slices.Collect(maps.Values(m.pools))
	m.mu.Unlock()
	for _, p := range pools {
		p.mu.Lock()
		for _, inst := range slices.Concat(p.ready[:]...) {
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

// current reports whether a Source's template is still the pool's, and
// if not retires the pool.
func (p *pool) current() bool {
	t, err := p.m.cfg.Source.Template(p.tmpl.Name)
	if err == nil && t.Version == p.tmpl.Version {
		return true
	}
	p.m.mu.Lock()
	if p.m.pools[p.tmpl.Name] == p {
		delete(p.m.pools, p.tmpl.Name)
	}
	p.m.mu.Unlock()
	p.cancel()
	return false
}

// newPool starts the filler of a pool of t.
func (m *Manager) newPool(t Template, dynamic bool) *pool {
	ctx, cancel := context.WithCancel(m.ctx)
	p := &pool{m: m, tmpl: t, refill: make(chan struct{}, 1), dynamic: dynamic, ctx: ctx, cancel: cancel}
	m.wg.Add(1)
	go p.fill()
	return p
}

// sourcePool is the pool of the Source's template t, made now if t
// wants one and replacing one of an older version; nil if t has none.
func (m *Manager) sourcePool(t *Template) *pool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n, ok := m.poolSizes[t.Name]; ok {
		t.PoolSize = n
	}
	if t.PoolSize <= 0 || m.closed {
		return nil
	}
	old := m.pools[t.Name]
	if old != nil && old.tmpl.Version == t.Version {
		return old
	}
	if old != nil {
		old.cancel() // its filler drains it
	}
	p := m.newPool(*t, true)
	m.pools[t.Name] = p
	return p
}
