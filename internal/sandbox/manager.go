package sandbox

import (
	"context"
	"log/slog"
	"maps"
	"slices"
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
	// VolumeMounts are the volumes a snapshot's sandbox mounted, which
	// its clones mount again (a clone's kernel has them mounted): Policy
	// has their mounts, looked up again by name at each create.
	VolumeMounts []VolumeMount
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
	// Volumes are the volumes sandboxes may mount (volumes.go); nil:
	// none.
	Volumes Volumes
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
	// NetworkedPools: pools keep sandboxes in networks of their own,
	// closed until claimed (pool.go's netKind), for the E2B API whose
	// creates have a network by default; sandboxes without one are kept
	// too once one was asked for.
	NetworkedPools bool
	// Sealed: no sandbox reaches the internet (network.default "none"),
	// whatever policy it was saved or copied with before the seal: a
	// network made under one that opens it is made closed instead.
	Sealed bool
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
	// LiveRestore: sandboxes outlive the manager where their backend can
	// take them back (live.go), and the manager takes back those an
	// earlier one left. Needs StateDir.
	LiveRestore bool
	// PauseInMemory: a pause always freezes the sandbox in memory, even
	// where its backend could save it to disk.
	PauseInMemory bool
	// HostRoom reports whether the host has room for another box (nil:
	// hostroom.go's, of its tasks and memory); none is started, for a
	// create or a pool, while it has not.
	HostRoom func() error
	// Clock is the manager's time (nil: the wall clock).
	Clock Clock
}

// TemplateSource finds templates by name; an unknown one is
// ErrUnknownTemplate.
type TemplateSource interface {
	Template(name string) (Template, error)
}

// Manager owns every sandbox of the host.
type Manager struct {
	cfg     Config
	backend Backend
	log     *slog.Logger
	metrics *Metrics
	clock   Clock

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
	changes   broadcast      // a sandbox's state or a pool changed
	uses      map[string]use // by template name (templates.go)
	started   time.Time

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
		ctx: ctx, cancel: cancel, clock: cfg.Clock,
	}
	if m.clock == nil {
		m.clock = realClock{}
	}
	m.started, m.uses = m.clock.Now().UTC(), map[string]use{}
	if len(m.cfg.TokenKey) == 0 {
		m.cfg.TokenKey = newTokenKey()
	}
	interval := cfg.MetricsInterval
	if interval <= 0 {
		interval = DefaultMetricsInterval
	}
	m.wg.Add(1)
	go m.sample(interval)
	// Before any box starts: what the sandboxes left running hold looks
	// free until they are taken back (live.go).
	m.loadSaved()
	m.adoptLive()
	// Under the lock: each filler reads the pools (pooledMemory) as soon
	// as it starts.
	m.mu.Lock()
	for _, t := range cfg.Templates {
		m.pools[t.Name] = m.newPool(t, false)
	}
	m.mu.Unlock()
	return m
}

// since is how long ago t was, on the manager's clock.
func (m *Manager) since(t time.Time) time.Duration { return m.clock.Now().Sub(t) }

// Metrics returns the manager's counters.
func (m *Manager) Metrics() *Metrics { return m.metrics }

// StateDir is the host directory of the manager's saved state ("" for none).
func (m *Manager) StateDir() string { return m.cfg.StateDir }

// Shutdown kills every sandbox, pooled ones included, and stops
// refilling; with live restore, those that can outlive it are left
// running, for the next manager to take back.
func (m *Manager) Shutdown() {
	m.mu.Lock()
	m.closed = true
	registered := slices.Collect(maps.Values(m.sandboxes))
	m.mu.Unlock()
	var all []*Sandbox
	for _, sb := range registered {
		// What is saved to disk stays there.
		if !sb.State().saved() && !m.outlives(sb) {
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
