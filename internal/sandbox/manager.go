// Package sandbox manages the sandboxes of one Airlock host: creation
// (claimed from warm pools), lookup, time-to-live, and teardown.
package sandbox

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// Backend and Instance are what the manager needs of a backend.
type (
	Backend  = backend.Backend
	Instance = backend.Instance
)

// Template is a named kind of sandbox.
type Template struct {
	Name   string
	Policy policy.Policy
	// PoolSize is how many ready sandboxes to keep.
	PoolSize int
	// Backend isolates this template's sandboxes; nil: the manager's.
	Backend Backend
	// Ready, if set, readies a started sandbox before it is pooled or
	// handed out (a template's start command and its ready check).
	Ready func(ctx context.Context, agent *agentproto.Client) error
	// Version tells apart what a Source returns for one name over time
	// (an image rebuilt): a pool of another version is replaced.
	Version string
	// Snapshot, if set, is the directory of a snapshot (snapshot.go) its
	// sandboxes are cloned from, running as it was, rather than started:
	// Policy is then the snapshotted sandbox's, and Ready is nil.
	Snapshot string
	// WarmSnapshot: where the backend can, the template's sandboxes are
	// clones of a save of its first ready one (warm.go), not each started
	// and readied.
	WarmSnapshot bool
}

// hostRoom reports whether the host has room for another box.
func (m *Manager) hostRoom() error {
	if m.cfg.HostRoom != nil {
		return m.cfg.HostRoom()
	}
	return hostRoom()
}

// backend returns the backend of t's sandboxes.
func (m *Manager) backendOf(t *Template) Backend {
	if t.Backend != nil {
		return t.Backend
	}
	return m.backend
}

// Config is the manager's configuration.
type Config struct {
	Templates []Template
	// PoolMemoryBudget caps the memory all pooled (unclaimed) sandboxes
	// may use together, in bytes; 0 means no cap beyond the pool sizes.
	PoolMemoryBudget int64
	// TokenKey derives sandboxes' tokens (tokens.go); nil: a random key,
	// so that tokens of an earlier run's sandboxes are not recognised.
	TokenKey   []byte
	DefaultTTL time.Duration
	MaxTTL     time.Duration
	// IDPrefix begins every sandbox id after its "i": in a cluster, the
	// node's (cluster.IDPrefix), which routers find the node by. Up to
	// 8 lower-case hex digits.
	IDPrefix string
	// MaxSandboxes bounds running sandboxes (claimed ones; 0: no bound).
	MaxSandboxes int
	// Backends are the backends a create request may name, when
	// AllowRequestBackend is set.
	Backends            map[string]Backend
	AllowRequestBackend bool
	// Network makes the networks of sandboxes that ask for one; nil:
	// such requests are refused.
	Network Network
	// Source finds the templates Templates does not name (the image
	// store's); nil: only those.
	Source TemplateSource
	// MetricsInterval is how often running sandboxes are measured for
	// their metrics history; 0: DefaultMetricsInterval.
	MetricsInterval time.Duration
	// StateDir keeps the records of sandboxes saved to disk (saved.go),
	// which BackendByName finds the backends of; "": none outlives the
	// manager.
	StateDir      string
	BackendByName func(name string) (Backend, error)
	// PauseInMemory: a pause always freezes the sandbox in memory, even
	// where its backend could save it to disk.
	PauseInMemory bool
	// HostRoom reports whether the host has room for another box (nil:
	// hostroom.go's, of its tasks and memory); none is started, for a
	// create or a pool, while it has not.
	HostRoom func() error
}

// TemplateSource finds templates by name; an unknown one is
// ErrUnknownTemplate.
type TemplateSource interface {
	Template(name string) (Template, error)
}

// Errors the API maps to statuses.
var (
	ErrNotFound        = errors.New("sandbox not found")
	ErrUnknownTemplate = errors.New("unknown template")
	ErrTooMany         = errors.New("too many sandboxes")
	ErrInvalid         = errors.New("invalid request")
	// ErrUnrestorable: a sandbox saved to disk could not be brought back
	// (an UnrestorableError says which).
	ErrUnrestorable = errors.New("the sandbox could not be restored")
	// ErrConflict: the request does not fit the sandbox's state.
	ErrConflict = errors.New("conflict")
	// ErrShuttingDown: the manager is stopping and takes no new sandbox.
	ErrShuttingDown = errors.New("the server is shutting down")
)

// Sandbox is a claimed sandbox, as the API describes it.
type Sandbox struct {
	ID          string
	TemplateID  string
	ClientID    string
	AccessToken string // for the agent's envd port (X-Access-Token)
	// TrafficToken opens the sandbox's other ports, such as the code
	// interpreter's (E2B-Traffic-Access-Token); AccessToken does too.
	TrafficToken string
	Metadata     map[string]string
	StartedAt    time.Time
	CPUs         float64
	MemoryMB     int64
	DiskMB       int64
	// AutoResume: traffic to the sandbox while paused resumes it.
	AutoResume bool
	Ingress    Ingress

	inst      Instance      // nil while saved (below); read it with instance()
	net       NetAttachment // nil: loopback only
	pol       policy.Policy // what it was started with, for a restore
	be        Backend
	ended     chan struct{} // closed when it is removed
	transport *http.Transport
	ports     *http.Transport // to the sandbox's own servers, through the agent

	mu    sync.Mutex
	endAt time.Time
	timer *time.Timer
	// The CPU time used at the last Usage call (or the claim) and when:
	// the next call's CPU share is over the time between. The history's
	// sampler keeps a mark of its own, so that neither shortens the
	// other's interval.
	apiMark, sampleMark cpuMark
	// paused: every process stopped, no time to live running. autoPause:
	// the end of its time to live pauses it instead of killing it
	// (keeping only its files if autoPauseFiles). gone: being killed; it
	// must not be paused again.
	paused, autoPause, autoPauseFiles, gone bool
	// saved: while paused, the backend's name for the sandbox saved to
	// disk, its memory freed, or savedFiles (saved.go); "": paused in
	// memory, or running.
	saved string
	// env: the environment variables it was created with, which a new
	// box started for it at a resume of savedFiles is given again.
	env     map[string]string
	history []Sample // the sampler's, oldest first
}

// instance is the box that runs s; nil while s is saved.
func (s *Sandbox) instance() Instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inst
}

// OnTimeout is what the end of s's time to live does: "pause" or "kill".
func (s *Sandbox) OnTimeout() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.autoPause {
		return "pause"
	}
	return "kill"
}

// Paused reports whether s is paused.
func (s *Sandbox) Paused() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.paused
}

// EndAt is when the sandbox's time to live runs out.
func (s *Sandbox) EndAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.endAt
}

// Transport reaches the sandbox's agent.
func (s *Sandbox) Transport() http.RoundTripper { return s.transport }

// CheckToken reports whether token is this sandbox's access token, in
// constant time.
func (s *Sandbox) CheckToken(token string) bool {
	return subtle.ConstantTimeCompare([]byte(token), []byte(s.AccessToken)) == 1
}

// CheckTrafficToken reports whether token is this sandbox's traffic token.
func (s *Sandbox) CheckTrafficToken(token string) bool {
	return subtle.ConstantTimeCompare([]byte(token), []byte(s.TrafficToken)) == 1
}

// Usage is what a sandbox uses, for the metrics API.
type Usage struct {
	// CPUPercent is the share of its CPU limit it used since the previous
	// Usage call, or since it was handed out: 0 to 100.
	CPUPercent float64
	Memory     int64 // bytes in use
	Disk       int64 // bytes its writable file systems hold
}

// Usage measures s now. Its disk use comes from the agent, which is as
// untrusted as the code: it is bounded, and only ever shown to the
// sandbox's own client; an agent that does not answer counts as 0.
func (s *Sandbox) Usage(ctx context.Context) (Usage, error) { return s.usage(ctx, &s.apiMark) }

// cpuMark is a sandbox's CPU time so far at a moment.
type cpuMark struct {
	cpu time.Duration
	at  time.Time
}

// usage is Usage with the CPU share since mark, which moves to now.
func (s *Sandbox) usage(ctx context.Context, mark *cpuMark) (Usage, error) {
	inst := s.instance()
	if inst == nil {
		return Usage{}, nil // saved to disk: it uses no memory, no CPU
	}
	bu, err := inst.Usage(ctx)
	if err != nil {
		return Usage{}, err
	}
	u := Usage{Memory: bu.Memory}
	if !s.Paused() { // a paused agent answers nothing
		u.Disk = s.diskUsage(ctx)
	}
	now := time.Now()
	s.mu.Lock()
	if dt := now.Sub(mark.at); dt > 0 && s.CPUs > 0 {
		u.CPUPercent = min(max(100*float64(bu.CPU-mark.cpu)/float64(dt)/s.CPUs, 0), 100)
	}
	*mark = cpuMark{bu.CPU, now}
	s.mu.Unlock()
	return u, nil
}

func (s *Sandbox) diskUsage(ctx context.Context) int64 {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	d, err := (&agentproto.Client{Transport: s.transport}).Disk(ctx)
	if err != nil {
		return 0
	}
	return min(max(d.Used, 0), s.DiskMB<<20)
}

// BackendName is the name of the backend the sandbox runs on.
func (s *Sandbox) BackendName() string { return s.be.Name() }

// Network is the sandbox's network policy now, and whether it has a
// network at all.
func (s *Sandbox) Network() (policy.Network, bool) {
	if s.net == nil {
		return policy.Network{}, false
	}
	return s.net.Policy(), true
}

// Done is closed when the sandbox has ended, whatever the reason.
func (s *Sandbox) Done() <-chan struct{} { return s.ended }

// Manager owns every sandbox of the host.
type Manager struct {
	cfg     Config
	backend Backend
	log     *slog.Logger
	metrics *Metrics

	mu        sync.Mutex
	sandboxes map[string]*Sandbox
	pools     map[string]*pool
	// poolSizes overrides templates' configured pool sizes (SetPoolSize).
	poolSizes map[string]int
	warm      map[string]*warmSnap  // by template name
	private   map[*Private]struct{} // boxes of the daemon's own (builds)
	closed    bool
	starting  int            // creates past the limit check, not yet registered
	saved     atomic.Int64   // registered sandboxes saved to disk: not running
	creating  sync.WaitGroup // the same creates, for Shutdown to wait for

	ctx      context.Context // ends at Shutdown: stops the pool fillers
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	removing sync.WaitGroup // teardowns under way
}

// NewManager starts the pools of cfg's templates.
func NewManager(cfg Config, backend Backend, log *slog.Logger) *Manager {
	ctx, cancel := context.WithCancel(context.Background())
	m := &Manager{
		cfg: cfg, backend: backend, log: log, metrics: newMetrics(),
		sandboxes: map[string]*Sandbox{}, pools: map[string]*pool{}, poolSizes: map[string]int{}, warm: map[string]*warmSnap{}, private: map[*Private]struct{}{},
		ctx: ctx, cancel: cancel,
	}
	if len(m.cfg.TokenKey) == 0 {
		m.cfg.TokenKey = newTokenKey()
	}
	interval := cfg.MetricsInterval
	if interval <= 0 {
		interval = DefaultMetricsInterval
	}
	m.wg.Add(1)
	go m.sample(interval)
	// Under the lock: each filler reads the pools (pooledMemory) as soon
	// as it starts.
	m.mu.Lock()
	for _, t := range cfg.Templates {
		m.pools[t.Name] = m.newPool(t, false)
	}
	m.mu.Unlock()
	m.loadSaved()
	return m
}

// Metrics returns the manager's counters.
func (m *Manager) Metrics() *Metrics { return m.metrics }

// StateDir is the host directory of the manager's saved state ("" for none).
func (m *Manager) StateDir() string { return m.cfg.StateDir }

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
	// AutoPauseFiles: that pause keeps only its files (saved.go).
	AutoPauseFiles bool
	// Network is what the sandbox may reach; the zero value: loopback
	// only. A sandbox with a network is started for the request, not
	// taken from the pool.
	Network policy.Network
	Ingress Ingress
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
	start := time.Now()
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
	pol, custom, err := req.Limits.apply(tmpl.Policy)
	if err != nil {
		return nil, err
	}
	if err := req.Network.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	pol.Network = req.Network
	networked := pol.Network.Mode != policy.NetNone
	if req.AutoPauseFiles {
		if err := m.filesPausable(req.TemplateID, networked); err != nil {
			return nil, err
		}
	}
	if networked && tmpl.Snapshot != "" {
		return nil, fmt.Errorf("%w: a sandbox from a snapshot cannot have a network yet: create it without allowInternetAccess and network", ErrInvalid)
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, ErrShuttingDown
	}
	// Sandboxes still starting count against the limit: checking the
	// registry alone would let a burst of concurrent creates past it.
	if m.cfg.MaxSandboxes > 0 && m.running()+m.starting >= m.cfg.MaxSandboxes {
		m.mu.Unlock()
		return nil, fmt.Errorf("%w: the limit is %d", ErrTooMany, m.cfg.MaxSandboxes)
	}
	m.starting++
	m.creating.Add(1)
	m.mu.Unlock()
	// A sandbox stops counting as starting in the same critical section
	// that registers it: counted in both for a moment, it would make a
	// burst's last creates refused below the limit.
	registered := false
	defer func() {
		m.mu.Lock()
		if !registered {
			m.starting--
		}
		m.mu.Unlock()
		m.creating.Done()
	}()
	be := m.backendOf(tmpl)
	if req.Backend != "" {
		if !m.cfg.AllowRequestBackend {
			return nil, fmt.Errorf("%w: this server does not let a request choose its backend", ErrInvalid)
		}
		b, ok := m.cfg.Backends[req.Backend]
		if !ok {
			return nil, fmt.Errorf("%w: unknown backend %q", ErrInvalid, req.Backend)
		}
		be = b
	}
	id := newSandboxID(m.cfg.IDPrefix)
	var inst Instance
	var netAtt NetAttachment
	pooled := false
	// The pool holds sandboxes of the template's own backend and limits,
	// without a network.
	poolable := be == m.backendOf(tmpl) && !custom && !networked
	if p != nil && poolable {
		inst, pooled = p.claim()
	}
	if inst == nil {
		if err := m.hostRoom(); err != nil {
			return nil, err
		}
	}
	if inst == nil && poolable {
		inst = m.cloneWarm(ctx, m.warmSnapshot(tmpl, false), pol)
	}
	if inst == nil {
		if networked {
			inst, netAtt, err = m.startNetworked(ctx, be, id, pol)
		} else {
			inst, err = startBox(ctx, be, tmpl, pol)
		}
		if errors.Is(err, ErrInvalid) {
			return nil, err
		}
		if errors.Is(err, backend.ErrUnsupported) {
			return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
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
			if tmpl.Snapshot != "" {
				return nil, &UnrestorableError{ID: tmpl.Name, Snapshot: true, Err: err}
			}
			return nil, fmt.Errorf("start sandbox: %w", err)
		}
	}
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
		StartedAt:      time.Now().UTC(),
		CPUs:           pol.CPUs,
		MemoryMB:       pol.MemoryBytes >> 20,
		DiskMB:         pol.WritableBytes() >> 20, // what its file systems hold, not the limit asked
		inst:           inst,
		pol:            pol,
		be:             be,
		ended:          make(chan struct{}),
		apiMark:        cpuMark{usage.CPU, time.Now()},
		sampleMark:     cpuMark{usage.CPU, time.Now()},
		autoPause:      req.AutoPause,
		autoPauseFiles: req.AutoPauseFiles,
		env:            req.EnvVars,
		AutoResume:     req.AutoResume,
		Ingress:        req.Ingress,
		net:            netAtt,
	}
	sb.transport, sb.ports = agentTransport(sb.instance), portTransport(sb.instance)
	if sb.Metadata == nil {
		sb.Metadata = map[string]string{}
	}
	if err := m.setup(ctx, sb, req.EnvVars); err != nil {
		m.discard(inst)
		m.metrics.createFailures.Add(1)
		return nil, fmt.Errorf("set up sandbox: %w", err)
	}
	// Locked until its time to live is set: a client may find it in a
	// list the moment it is registered, and pause it or set its timeout.
	sb.mu.Lock()
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		sb.mu.Unlock()
		m.discard(inst)
		return nil, ErrShuttingDown
	}
	m.sandboxes[sb.ID] = sb
	m.starting--
	registered = true
	m.mu.Unlock()
	sb.endAt = time.Now().Add(ttl)
	sb.timer = time.AfterFunc(ttl, func() { m.expire(sb) })
	sb.mu.Unlock()
	m.watch(sb, inst)
	m.metrics.observeCreate(time.Since(start), pooled)
	m.log.Info("sandbox created", "sandbox", sb.ID, "template", sb.TemplateID, "warm", pooled,
		"ms", float64(time.Since(start).Microseconds())/1000)
	return sb, nil
}

// running is how many registered sandboxes run (or are paused in
// memory); m.mu is held.
func (m *Manager) running() int { return len(m.sandboxes) - int(m.saved.Load()) }

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

// setup tells the agent the sandbox's environment.
func (m *Manager) setup(ctx context.Context, sb *Sandbox, env map[string]string) error {
	return setupAgent(ctx, sb.transport, env)
}

// setupAgent gives the agent that tr reaches the sandbox's environment.
func setupAgent(ctx context.Context, tr http.RoundTripper, env map[string]string) error {
	if len(env) == 0 {
		return nil
	}
	return (&agentproto.Client{Transport: tr}).Setup(ctx, agentproto.Setup{EnvVars: env})
}

func (m *Manager) ttl(d time.Duration) (time.Duration, error) {
	if d == 0 {
		d = m.cfg.DefaultTTL
	}
	if d < 0 {
		return 0, fmt.Errorf("%w: timeout must not be negative", ErrInvalid)
	}
	if m.cfg.MaxTTL > 0 && d > m.cfg.MaxTTL {
		return 0, fmt.Errorf("%w: timeout %s is above this server's maximum of %s", ErrInvalid, d, m.cfg.MaxTTL)
	}
	return d, nil
}

// Get returns the sandbox with id.
func (m *Manager) Get(id string) (*Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, ok := m.sandboxes[id]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return sb, nil
}

// All returns every sandbox, in no order: what a caller that looks at
// each one needs, without List's sorting under the manager's lock.
func (m *Manager) All() []*Sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*Sandbox, 0, len(m.sandboxes))
	for _, sb := range m.sandboxes {
		out = append(out, sb)
	}
	return out
}

// List returns the sandboxes whose metadata contains every pair of
// filter, oldest first.
func (m *Manager) List(filter map[string]string) []*Sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*Sandbox
	for _, sb := range m.sandboxes {
		match := true
		for k, v := range filter {
			if sb.Metadata[k] != v {
				match = false
				break
			}
		}
		if match {
			out = append(out, sb)
		}
	}
	slices.SortFunc(out, func(a, b *Sandbox) int {
		if c := a.StartedAt.Compare(b.StartedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// SetTTL makes the sandbox end d from now.
func (m *Manager) SetTTL(id string, d time.Duration) error {
	return m.withTTL(id, d, func(sb *Sandbox, d time.Duration) error {
		if sb.paused {
			return fmt.Errorf("%w: sandbox %s is paused: connect to resume it", ErrConflict, id)
		}
		sb.endAt = time.Now().Add(d)
		sb.timer.Reset(d)
		return nil
	})
}

// withTTL calls f with sandbox id, locked and not being killed, and d
// checked against the server's bounds (0: the default).
func (m *Manager) withTTL(id string, d time.Duration, f func(*Sandbox, time.Duration) error) error {
	sb, err := m.Get(id)
	if err != nil {
		return err
	}
	if d, err = m.ttl(d); err != nil {
		return err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.gone {
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return f(sb, d)
}

// Pause stops every process of sandbox id. A paused sandbox keeps its
// memory and files (or, unless keepMemory, only its files: saved.go) but
// uses no CPU, and its time to live is stopped: it lasts until resumed,
// killed, or the server's longest time to live has passed.
func (m *Manager) Pause(ctx context.Context, id string, keepMemory bool) error {
	sb, err := m.Get(id)
	if err != nil {
		return err
	}
	return m.pause(ctx, sb, keepMemory)
}

func (m *Manager) pause(ctx context.Context, sb *Sandbox, keepMemory bool) error {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.gone {
		return fmt.Errorf("%w: %s", ErrNotFound, sb.ID)
	}
	if sb.paused {
		return fmt.Errorf("%w: sandbox %s is already paused", ErrConflict, sb.ID)
	}
	saved := false
	if !keepMemory {
		// Not cut short by a client that goes away: the box ends in it.
		if err := m.saveFiles(context.WithoutCancel(ctx), sb); err != nil {
			return err
		}
		saved = true
	} else if m.canSave(sb) {
		// Not cut short by a client that goes away mid-checkpoint.
		err := m.save(context.WithoutCancel(ctx), sb)
		if err != nil {
			m.log.Warn("could not save the sandbox to disk: pausing it in memory", "sandbox", sb.ID, "err", err)
		}
		saved = err == nil
	}
	if !saved {
		if err := sb.inst.Pause(ctx); err != nil {
			_ = sb.inst.Resume(context.WithoutCancel(ctx)) // never half paused
			return fmt.Errorf("pause sandbox %s: %w", sb.ID, err)
		}
	}
	// Paused, it is removed when the server's longest time to live has
	// passed (without a bound, when killed).
	sb.timer.Stop()
	if max := m.cfg.MaxTTL; max > 0 {
		sb.endAt = time.Now().Add(max)
		sb.timer.Reset(max)
	}
	sb.paused = true
	if saved {
		if err := m.writeRecord(sb); err != nil {
			m.log.Error("saved sandbox's record: it will not outlive this daemon", "sandbox", sb.ID, "err", err)
		}
	}
	m.log.Info("sandbox paused", "sandbox", sb.ID, "to disk", saved)
	return nil
}

// Resume restarts sandbox id if it is paused, with a time to live of d
// (0: the default). A running sandbox is left as it is.
func (m *Manager) Resume(ctx context.Context, id string, d time.Duration) error {
	return m.withTTL(id, d, func(sb *Sandbox, d time.Duration) error {
		if !sb.paused {
			return nil
		}
		// Not cut short by a client that goes away: a box thawed but
		// still marked paused would refuse its traffic.
		if sb.saved != "" {
			m.mu.Lock()
			full := m.cfg.MaxSandboxes > 0 && m.running()+m.starting >= m.cfg.MaxSandboxes
			m.mu.Unlock()
			if full {
				return fmt.Errorf("%w: the limit is %d", ErrTooMany, m.cfg.MaxSandboxes)
			}
			if err := m.hostRoom(); err != nil {
				return err
			}
			if err := m.restore(context.WithoutCancel(ctx), sb); err != nil {
				return err
			}
		} else if err := sb.inst.Resume(context.WithoutCancel(ctx)); err != nil {
			return fmt.Errorf("resume sandbox %s: %w", id, err)
		}
		sb.paused = false
		sb.endAt = time.Now().Add(d)
		sb.timer.Reset(d)
		m.log.Info("sandbox resumed", "sandbox", id)
		return nil
	})
}

// Kill ends the sandbox with id now.
func (m *Manager) Kill(id string) error {
	sb, err := m.Get(id)
	if err != nil {
		return err
	}
	m.remove(sb, "killed")
	return nil
}

// expire ends sb's time to live: it is killed, or paused if it asked to
// be (and killed if it cannot be). A paused one is killed.
func (m *Manager) expire(sb *Sandbox) {
	sb.mu.Lock()
	auto := sb.autoPause && !sb.paused
	// A timer that fired just before a pause, a resume or a new time to
	// live is stale.
	stale := time.Now().Before(sb.endAt)
	sb.mu.Unlock()
	if stale {
		return
	}
	if auto {
		if err := m.pause(m.ctx, sb, !sb.autoPauseFiles); err == nil || errors.Is(err, ErrConflict) {
			return
		}
	}
	m.remove(sb, "expired")
}

// remove unregisters sb and destroys it; the first caller wins.
func (m *Manager) remove(sb *Sandbox, why string) {
	m.mu.Lock()
	if m.sandboxes[sb.ID] != sb {
		m.mu.Unlock()
		return
	}
	delete(m.sandboxes, sb.ID)
	// Shutdown waits for this teardown, too: one that began just before
	// it must not be cut short by the process exiting.
	m.removing.Add(1)
	defer m.removing.Done()
	m.mu.Unlock()
	// Killed under the sandbox's lock, which a pause takes too: no pause
	// can come after the kill and freeze what is dying.
	sb.mu.Lock()
	if sb.timer != nil {
		sb.timer.Stop()
	}
	sb.gone = true
	inst := sb.inst
	if inst == nil {
		m.forget(sb)
	} else if err := inst.Kill(context.Background()); err != nil {
		m.log.Error("kill sandbox", "sandbox", sb.ID, "err", err)
	}
	sb.mu.Unlock()
	if inst != nil {
		if err := inst.Wait(); err != nil {
			m.log.Error("sandbox teardown", "sandbox", sb.ID, "err", err)
		}
	}
	close(sb.ended)
	sb.transport.CloseIdleConnections()
	sb.ports.CloseIdleConnections()
	m.metrics.ended.Add(1)
	m.log.Info("sandbox "+why, "sandbox", sb.ID)
}

// Shutdown kills every sandbox, pooled ones included, and stops refilling.
func (m *Manager) Shutdown() {
	m.mu.Lock()
	m.closed = true
	registered := slices.Collect(maps.Values(m.sandboxes))
	m.mu.Unlock()
	var all []*Sandbox
	for _, sb := range registered {
		if sb.instance() != nil { // what is saved to disk stays there
			all = append(all, sb)
		}
	}
	m.cancel()
	m.wg.Wait()
	var wg sync.WaitGroup
	for _, sb := range all {
		wg.Add(1)
		go func() { defer wg.Done(); m.remove(sb, "killed at shutdown") }()
	}
	m.mu.Lock()
	pools := slices.Collect(maps.Values(m.pools))
	privates := slices.Collect(maps.Keys(m.private))
	m.mu.Unlock()
	for _, p := range pools {
		p.drain()
	}
	for _, b := range privates {
		wg.Add(1)
		go func() { defer wg.Done(); b.Close() }()
	}
	wg.Wait()
	// A create under way finds the manager closed when it would register
	// its sandbox, and discards it (a teardown waited for below).
	m.creating.Wait()
	m.removeWarm()
	m.removing.Wait()
}

// Counts reports running (claimed) and pooled sandboxes per template.
func (m *Manager) Counts() (running map[string]int, pooled map[string]int) {
	running, pooled = map[string]int{}, map[string]int{}
	m.mu.Lock()
	for _, sb := range m.sandboxes {
		running[sb.TemplateID]++
	}
	pools := maps.Clone(m.pools)
	m.mu.Unlock()
	for name, p := range pools {
		p.mu.Lock()
		pooled[name] = len(p.ready)
		p.mu.Unlock()
	}
	return running, pooled
}

// agentTransport speaks HTTP to the agent inside inst. Streams must not be
// cut by timeouts here: the SDK sets its own.
func agentTransport(inst func() Instance) *http.Transport {
	return &http.Transport{
		DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx, inst) },
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
}

// portTransport speaks HTTP to the servers in inst, each connection one
// that the agent made to the port on the sandbox's loopback. URLs name
// the port as their host's ("http://127.0.0.1:3000/…"); an https URL
// speaks TLS to the server without checking its certificate (E2B's
// httpsPorts: the sandbox's own, often self-signed).
func portTransport(inst func() Instance) *http.Transport {
	return &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			_, p, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			port, err := strconv.Atoi(p)
			if err != nil {
				return nil, err
			}
			c, err := dial(ctx, inst)
			if err != nil {
				return nil, err
			}
			fc, err := agentproto.DialForward(ctx, c, port)
			if err != nil {
				c.Close()
				return nil, err
			}
			return fc, nil
		},
		TLSClientConfig:     &tls.Config{InsecureSkipVerify: true},
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
}

// dial connects to the agent of the box inst returns now: none while the
// sandbox is saved to disk.
func dial(ctx context.Context, inst func() Instance) (net.Conn, error) {
	i := inst()
	if i == nil {
		return nil, errors.New("the sandbox is paused")
	}
	return i.Dial(ctx)
}

// the returns an Instance, for the transports of a box that never changes.
func the(inst Instance) func() Instance { return func() Instance { return inst } }

// PortTransport reaches the servers that processes in the sandbox run.
func (s *Sandbox) PortTransport() http.RoundTripper { return s.ports }

// newSandboxID is E2B-like: a letter and 19 lower-case hex digits, the
// first of them prefix.
func newSandboxID(prefix string) string {
	var b [10]byte
	rand.Read(b[:])
	return "i" + prefix + hex.EncodeToString(b[:])[:19-len(prefix)]
}
