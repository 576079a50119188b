package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// CreateRequest is what a client asks for.
type CreateRequest struct {
	TemplateID string
	Metadata   map[string]string
	EnvVars    map[string]string
	TTL        time.Duration // 0: the default
	ClientID   string
	// Backend names the isolation for this sandbox ("" : the template's).
	Backend string
	// Limits lower the template's for this sandbox.
	Limits Limits
	// AutoPause: at the end of its time to live the sandbox is paused,
	// not killed. AutoResume: traffic to it resumes it.
	AutoPause, AutoResume bool
	// AutoPauseFiles: that pause keeps only its files (savedfiles.go).
	AutoPauseFiles bool
	// Network is what the sandbox may reach; the zero value: loopback
	// only. A closed one (no rule, not the internet) is dropped where the
	// sandbox cannot have a network yet (the template of a snapshot, a
	// pause that keeps only files): it then has loopback only, and its
	// network cannot change.
	Network policy.Network
	Ingress Ingress
	// PoolOnly: a sandbox from the template's pool or none (ErrPoolEmpty),
	// never one started for the request: airlock run asks so, and runs
	// its command itself where the pool is empty.
	PoolOnly bool
	// Volumes are mounted into the sandbox (volumes.go): it starts
	// afresh, never from a pool, whose sandboxes have no mounts.
	Volumes []VolumeMount
	// Private: the sandbox is its creator's alone. No client of the API
	// finds it (Get, List, All answer as if it did not exist), so none
	// gets its tokens; its creator ends it with End.
	Private bool
}

// Limits are the resource limits a create request may ask for. A zero
// field keeps the template's; a sandbox never gets more than its
// template allows, so the operator's configuration bounds every request.
type Limits struct {
	MemoryBytes int64
	CPUs        float64
	Pids        int64
	DiskBytes   int64
}

// The least a request may ask for: the agent (a Go program, whose threads
// count as pids) and a Jupyter kernel must fit.
const (
	minRequestMemory = 64 << 20
	minRequestPids   = 32
	minRequestDisk   = 4 << 20
)

// apply returns the template policy t with l's limits, and whether any
// differs from t's.
func (l Limits) apply(t policy.Policy) (policy.Policy, bool, error) {
	p := t
	set := func(name string, v, min, max int64, dst *int64, format func(int64) string) error {
		switch {
		case v == 0:
			return nil
		case v > max:
			return fmt.Errorf("%w: %s %s is above the template's %s", ErrInvalid, name, format(v), format(max))
		case v < min:
			return fmt.Errorf("%w: %s %s is below %s, the least a sandbox and its agent run in", ErrInvalid, name, format(v), format(min))
		}
		*dst = v
		return nil
	}
	count := func(v int64) string { return fmt.Sprint(v) }
	for _, err := range []error{
		set("memory", l.MemoryBytes, minRequestMemory, t.MemoryBytes, &p.MemoryBytes, policy.FormatSize),
		set("pids", l.Pids, minRequestPids, t.Pids, &p.Pids, count),
		set("disk", l.DiskBytes, minRequestDisk, t.DiskBytes, &p.DiskBytes, policy.FormatSize),
	} {
		if err != nil {
			return t, false, err
		}
	}
	if l.CPUs > t.CPUs {
		return t, false, fmt.Errorf("%w: cpus %g is above the template's %g", ErrInvalid, l.CPUs, t.CPUs)
	} else if l.CPUs != 0 {
		p.CPUs = l.CPUs
	}
	if err := p.Validate(); err != nil {
		return t, false, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	custom := p.MemoryBytes != t.MemoryBytes || p.CPUs != t.CPUs || p.Pids != t.Pids || p.DiskBytes != t.DiskBytes
	return p, custom, nil
}

// Create hands out a sandbox of the requested template: a warm one from
// the pool when there is one, else one started now.
func (m *Manager) Create(ctx context.Context, req CreateRequest) (*Sandbox, error) {
	start := m.clock.Now()
	// A configured template has a pool; one of the image store is
	// started for the request.
	var tmpl *Template
	m.mu.Lock()
	p, ok := m.pools[req.TemplateID]
	m.mu.Unlock()
	if ok && !p.dynamic {
		tmpl = &p.tmpl
	} else if m.cfg.Source != nil {
		t, err := m.cfg.Source.Template(req.TemplateID)
		if err != nil {
			return nil, err
		}
		tmpl = &t
		p = m.sourcePool(tmpl)
	} else {
		return nil, fmt.Errorf("%w %q", ErrUnknownTemplate, req.TemplateID)
	}
	return m.create(ctx, req, tmpl, p, start)
}

// create hands out a sandbox of tmpl, from pool p if it has one (p may
// be nil).
func (m *Manager) create(ctx context.Context, req CreateRequest, tmpl *Template, p *pool, start time.Time) (*Sandbox, error) {
	ttl, err := m.ttl(req.TTL)
	if err != nil {
		return nil, err
	}
	pol, custom, err := m.requestPolicy(req, tmpl)
	if err != nil {
		return nil, err
	}
	done, err := m.reserve()
	if err != nil {
		return nil, err
	}
	registered := false
	defer func() { done(registered) }()
	be, err := m.requestBackend(req, tmpl)
	if err != nil {
		return nil, err
	}
	id := newSandboxID(m.cfg.IDPrefix)
	// The pool holds sandboxes of the template's own backend and limits;
	// a pool-only create takes one under lower limits too, lowered now.
	poolable := be == m.backendOf(tmpl) && (!custom || req.PoolOnly)
	inst, netAtt, pooled, err := m.box(ctx, be, tmpl, pol, id, p, poolable, req.PoolOnly)
	if err != nil {
		return nil, err
	}
	if pooled && custom {
		if err := lower(inst, pol); err != nil {
			m.discard(inst)
			if req.PoolOnly {
				p.kick()
			}
			return nil, err
		}
	}
	sb := m.newSandbox(ctx, id, req, pol, be, inst, netAtt)
	sb.private = req.Private
	if len(tmpl.VolumeMounts) > 0 {
		sb.VolumeMounts = append(slices.Clone(tmpl.VolumeMounts), req.Volumes...)
	}
	if req.PoolOnly {
		// Its pool refills when it ends, or now if it is not handed out.
		sb.refill = p
		defer func() {
			if !registered {
				p.kick()
			}
		}()
	}
	if err := m.setup(ctx, sb, req.EnvVars); err != nil {
		m.discard(inst)
		m.metrics.createFailures.Add(1)
		return nil, fmt.Errorf("set up sandbox: %w", err)
	}
	sb.Log("info", "sandbox", "sandbox created", "template", sb.TemplateID, "backend", be.Name(), "fromPool", strconv.FormatBool(pooled))
	if err := m.register(sb, ttl); err != nil {
		m.discard(inst)
		return nil, err
	}
	registered = true
	m.used(tmpl.Name)
	m.watch(sb, inst)
	m.metrics.observeCreate(m.since(start), pooled)
	m.log.Info("sandbox created", "sandbox", sb.ID, "template", sb.TemplateID, "warm", pooled,
		"ms", float64(m.since(start).Microseconds())/1000)
	return sb, nil
}

// requestPolicy is the policy of a sandbox of tmpl as req asks for it,
// and whether its limits differ from the template's.
func (m *Manager) requestPolicy(req CreateRequest, tmpl *Template) (policy.Policy, bool, error) {
	pol, custom, err := req.Limits.apply(tmpl.Policy)
	if err != nil {
		return pol, false, err
	}
	if err := req.Network.Validate(); err != nil {
		return pol, false, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	pol.Network = req.Network
	if pol, err = m.snapshotVolumes(pol, tmpl); err != nil {
		return pol, false, err
	}
	if len(req.Volumes) > 0 {
		if pol, err = m.volumePolicy(pol, req.Volumes); err != nil {
			return pol, false, err
		}
		custom = true
	}
	if req.AutoPauseFiles {
		if err := m.filesPausable(req.TemplateID); err != nil {
			return pol, false, err
		}
		if err := filesPausableWith(req.Volumes); err != nil {
			return pol, false, err
		}
	}
	return pol, custom, nil
}

// closed reports whether n is an interface that reaches nothing.
func closed(n policy.Network) bool {
	return n.Mode == policy.NetFiltered && len(n.AllowOut) == 0
}

// reserve counts a create as starting, against the limit, until done.
// Sandboxes still starting count against the limit: checking the
// registry alone would let a burst of concurrent creates past it. A
// sandbox stops counting as starting in the same critical section that
// registers it (register): counted in both for a moment, it would make a
// burst's last creates refused below the limit; done(registered) ends
// the count of a create that registered nothing.
func (m *Manager) reserve() (done func(registered bool), err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrShuttingDown
	}
	if m.cfg.MaxSandboxes > 0 && m.running()+m.starting >= m.cfg.MaxSandboxes {
		return nil, fmt.Errorf("%w: the limit is %d", ErrTooMany, m.cfg.MaxSandboxes)
	}
	m.starting++
	m.creating.Add(1)
	return func(registered bool) {
		m.mu.Lock()
		if !registered {
			m.starting--
		}
		m.mu.Unlock()
		m.creating.Done()
	}, nil
}

// requestBackend is the backend req asks for, or tmpl's.
func (m *Manager) requestBackend(req CreateRequest, tmpl *Template) (Backend, error) {
	if req.Backend == "" {
		return m.backendOf(tmpl), nil
	}
	if !m.cfg.AllowRequestBackend {
		return nil, fmt.Errorf("%w: this server does not let a request choose its backend", ErrInvalid)
	}
	b, ok := m.cfg.Backends[req.Backend]
	if !ok {
		return nil, fmt.Errorf("%w: unknown backend %q", ErrInvalid, req.Backend)
	}
	return b, nil
}

// box is a ready box on be for sandbox id of tmpl, under pol: a poolable
// one is claimed from pool p (one with a network gets its policy then),
// and with poolOnly, that is all; or else cloned from the template's warm snapshot; any other, or if
// neither has one, is started now. Made now, it has a network of its own
// if pol has one.
func (m *Manager) box(ctx context.Context, be Backend, tmpl *Template, pol policy.Policy, id string, p *pool, poolable, poolOnly bool) (inst Instance, netAtt NetAttachment, pooled bool, err error) {
	kind := kindOf(pol.Network)
	if p != nil && poolable {
		// A sandbox only a pool would do for (airlock run's) refills
		// its pool when it ends: a refill now would take the CPU from
		// the command it runs, which is over in milliseconds.
		if inst, pooled = p.claim(kind, !poolOnly); inst != nil {
			if kind == plainKind {
				return inst, nil, true, nil
			}
			// Nothing of the request has run in it yet: its network,
			// closed until now, becomes the request's.
			att := inst.(netInstance).net
			att.Name(id)
			if err := att.Update(pol.Network); err != nil {
				m.discard(inst)
				return nil, nil, false, fmt.Errorf("%w: %v", ErrInvalid, err)
			}
			return inst, att, true, nil
		}
	}
	if poolOnly {
		return nil, nil, false, ErrPoolEmpty
	}
	if err := m.hostRoom(); err != nil {
		return nil, nil, false, err
	}
	if poolable {
		if inst, netAtt = m.cloneWarm(ctx, m.warmSnapshot(tmpl, false), id, pol); inst != nil {
			return inst, netAtt, false, nil
		}
	}
	inst, netAtt, err = m.startTemplate(ctx, be, tmpl, id, pol)
	if errors.Is(err, ErrInvalid) {
		return nil, nil, false, err
	}
	if errors.Is(err, backend.ErrUnsupported) {
		return nil, nil, false, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if err == nil {
		// As a pooled one: a create returns a sandbox whose agent
		// answers, or an error, never one still starting.
		if err = prepare(ctx, tmpl, inst); err != nil {
			m.discard(inst)
		}
	}
	if err != nil {
		m.metrics.createFailures.Add(1)
		if tmpl.Snapshot != "" && !errors.As(err, new(networkError)) {
			return nil, nil, false, &UnrestorableError{ID: tmpl.Name, Snapshot: true, Err: err}
		}
		return nil, nil, false, fmt.Errorf("start sandbox: %w", err)
	}
	return inst, netAtt, false, nil
}

// newSandbox is sandbox id, of req, running in inst.
func (m *Manager) newSandbox(ctx context.Context, id string, req CreateRequest, pol policy.Policy, be Backend, inst Instance, netAtt NetAttachment) *Sandbox {
	// The CPU share of its first getMetrics counts from now. A host that
	// cannot say (no cpuacct) counts from 0, as getMetrics will.
	usage, err := inst.Usage(ctx)
	if err != nil {
		m.log.Warn("sandbox usage", "err", err)
	}
	sb := &Sandbox{
		ID:             id,
		TemplateID:     req.TemplateID,
		ClientID:       req.ClientID,
		AccessToken:    m.token(accessToken, id),
		TrafficToken:   m.token(trafficToken, id),
		Metadata:       req.Metadata,
		StartedAt:      m.clock.Now().UTC(),
		CPUs:           pol.CPUs,
		MemoryMB:       pol.MemoryBytes >> 20,
		DiskMB:         pol.WritableBytes() >> 20, // what its file systems hold, not the limit asked
		inst:           inst,
		pol:            pol,
		be:             be,
		ended:          make(chan struct{}),
		clock:          m.clock,
		atStart:        usage,
		apiMark:        cpuMark{usage.CPU, m.clock.Now()},
		sampleMark:     cpuMark{usage.CPU, m.clock.Now()},
		autoPause:      req.AutoPause,
		autoPauseFiles: req.AutoPauseFiles,
		env:            req.EnvVars,
		AutoResume:     req.AutoResume,
		Ingress:        req.Ingress,
		VolumeMounts:   req.Volumes,
		net:            netAtt,
	}
	sb.transport, sb.ports = agentTransport(sb.instance), portTransport(sb.instance)
	if sb.Metadata == nil {
		sb.Metadata = map[string]string{}
	}
	return sb
}

// IsConfigured reports whether name is one of the configured templates
// (base, code-interpreter-v1), not one of the Source's.
func (m *Manager) IsConfigured(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.pools[name]
	return ok && !p.dynamic
}

// TemplateExists reports whether a create of name would find its
// template.
func (m *Manager) TemplateExists(name string) bool {
	if m.IsConfigured(name) {
		return true
	}
	if m.cfg.Source == nil {
		return false
	}
	_, err := m.cfg.Source.Template(name)
	return err == nil
}
