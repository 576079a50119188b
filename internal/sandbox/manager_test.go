package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/backend/fake"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// newManager returns a manager on a fake backend with one template,
// "base", whose pool holds poolSize; a zero DefaultTTL in cfg is a minute,
// a zero MaxTTL an hour, and its clock is a fake one (clockOf) unless cfg
// has one. The manager is shut down when the test ends.
func newManager(t *testing.T, cfg Config, poolSize int, setup ...func(*fake.Backend)) (*Manager, *fake.Backend) {
	t.Helper()
	b := fake.New(t.TempDir(), testLog(t))
	for _, f := range setup {
		f(b)
	}
	return managerOn(t, cfg, poolSize, b), b
}

func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// managerOn is newManager's manager on b.
func managerOn(t *testing.T, cfg Config, poolSize int, b *fake.Backend) *Manager {
	t.Helper()
	if cfg.DefaultTTL == 0 {
		cfg.DefaultTTL = time.Minute
	}
	if cfg.MaxTTL == 0 {
		cfg.MaxTTL = time.Hour
	}
	if cfg.Clock == nil {
		cfg.Clock = newFakeClock()
	}
	cfg.Templates = append(cfg.Templates, Template{Name: "base", Policy: policy.Default(), PoolSize: poolSize})
	m := NewManager(cfg, b, testLog(t))
	t.Cleanup(func() {
		m.Shutdown()
		if n := b.Live(); n != 0 {
			t.Errorf("%d instances still live after Shutdown", n)
		}
	})
	return m
}

// waitFor waits until cond holds, checking it again at each change m
// announces (a sandbox's state, what a pool holds): no sleep, no poll.
// It fails t if nothing changes for a bound far above what anything
// takes; it never asserts a duration.
func waitFor(t *testing.T, m *Manager, what string, cond func() bool) {
	t.Helper()
	for {
		changed := m.changes.wait()
		if cond() {
			return
		}
		select {
		case <-changed:
		case <-time.After(10 * time.Second):
			t.Fatalf("gave up waiting until %s", what)
		}
	}
}

// removed waits until inst's teardown, which may run in the background,
// has removed it.
func removed(t *testing.T, inst *fake.Instance) {
	t.Helper()
	select {
	case <-inst.Removed():
	case <-time.After(10 * time.Second):
		t.Fatal("gave up waiting for an instance's removal")
	}
}

// clockOf is m's fake clock.
func clockOf(m *Manager) *fakeClock { return m.clock.(*fakeClock) }

func pooled(m *Manager) int {
	_, p := m.Counts()
	return p["base"]
}

func create(t *testing.T, m *Manager, req CreateRequest) *Sandbox {
	t.Helper()
	if req.TemplateID == "" {
		req.TemplateID = "base"
	}
	sb, err := m.Create(t.Context(), req)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	return sb
}

func gone(m *Manager, id string) func() bool {
	return func() bool {
		_, err := m.Get(id)
		return errors.Is(err, ErrNotFound)
	}
}

// instance is sb's box, which a network's wrapper may hold.
func instance(sb *Sandbox) *fake.Instance {
	inst := sb.instance()
	if n, ok := inst.(netInstance); ok {
		inst = n.Instance
	}
	return inst.(*fake.Instance)
}

func TestPoolRefillsAfterClaim(t *testing.T) {
	m, b := newManager(t, Config{}, 2)
	waitFor(t, m, "the pool is full", func() bool { return pooled(m) == 2 })
	first := b.Instances()[:2]

	sb := create(t, m, CreateRequest{})
	if !slices.Contains(first, instance(sb)) {
		t.Error("the create started a sandbox of its own, want one claimed from the pool")
	}
	if warm := m.metrics.creates[1].Load(); warm != 1 {
		t.Errorf("warm creates = %d, want 1", warm)
	}
	waitFor(t, m, "the pool is full again", func() bool { return pooled(m) == 2 })
	if got := b.Starts(); got != 3 {
		t.Errorf("starts = %d, want 3: two for the pool, one to refill it", got)
	}
}

func TestPoolNeverAboveItsSize(t *testing.T) {
	const size = 3
	m, b := newManager(t, Config{}, size)
	p := m.pools["base"]
	claims := 0
	for range 5 {
		waitFor(t, m, "the pool is full", func() bool {
			p.kick() // refill requests beyond need must not overfill it
			n := pooled(m)
			if n > size {
				t.Fatalf("pool holds %d, above its size %d", n, size)
			}
			return n == size
		})
		create(t, m, CreateRequest{})
		claims++
	}
	waitFor(t, m, "the pool is full", func() bool { return pooled(m) == size })
	if got, want := b.Starts(), size+claims; got != want {
		t.Errorf("starts = %d, want %d: the pool's size and one per claim", got, want)
	}
}

func TestSetPoolSize(t *testing.T) {
	m, b := newManager(t, Config{}, 1)
	waitFor(t, m, "the configured pool is full", func() bool { return pooled(m) == 1 })
	sizeOf := func() int {
		pools, _ := m.Pools(t.Context())
		return pools[0].Size
	}
	m.SetPoolSize("base", 3)
	waitFor(t, m, "the pool grows to 3", func() bool { return pooled(m) == 3 })
	if got := sizeOf(); got != 3 {
		t.Errorf("Pools says size %d, want 3", got)
	}
	m.SetPoolSize("base", 0)
	waitFor(t, m, "the pool empties", func() bool { return pooled(m) == 0 })
	for _, inst := range b.Instances() {
		removed(t, inst)
	}
	m.SetPoolSize("base", -1)
	waitFor(t, m, "the pool is back at its configured size", func() bool { return pooled(m) == 1 })
	if got := sizeOf(); got != 1 {
		t.Errorf("Pools says size %d, want the configured 1", got)
	}
	// A template this host does not have: nothing happens, nothing fails.
	m.SetPoolSize("nowhere", 2)
}

func TestPoolMemoryBudget(t *testing.T) {
	// Each sandbox uses 40M: a 100M budget holds two of them, not the
	// three that the 16M guess for an unmeasured one would let in.
	const each, budget = 40 << 20, 100 << 20
	m, _ := newManager(t, Config{PoolMemoryBudget: budget}, 5, func(b *fake.Backend) { b.SetMemory(each) })
	p := m.pools["base"]
	waitFor(t, m, "the pool wants no more", func() bool { _, more := p.wanted(); return pooled(m) > 0 && !more })
	if got := pooled(m); got != 2 {
		t.Errorf("pool holds %d, want 2 (%dM each in a %dM budget)", got, each>>20, budget>>20)
	}
	if used := int64(pooled(m)) * each; used > budget {
		t.Errorf("pooled sandboxes use %dM, above the budget of %dM", used>>20, budget>>20)
	}
}

func TestCustomLimitsSkipThePool(t *testing.T) {
	m, b := newManager(t, Config{}, 1)
	waitFor(t, m, "the pool is full", func() bool { return pooled(m) == 1 })
	sb := create(t, m, CreateRequest{Limits: Limits{MemoryBytes: 128 << 20}})
	inst := instance(sb)
	if inst == b.Instances()[0] {
		t.Fatal("a sandbox with its own limits came from the pool")
	}
	if got := inst.Policy().MemoryBytes; got != 128<<20 {
		t.Errorf("started with memory %d, want %d", got, 128<<20)
	}
	if sb.MemoryMB != 128 {
		t.Errorf("MemoryMB = %d, want 128", sb.MemoryMB)
	}
	if got := pooled(m); got != 1 {
		t.Errorf("pool holds %d after the create, want its sandbox untouched", got)
	}
}

func TestCreateErrors(t *testing.T) {
	m, b := newManager(t, Config{MaxTTL: time.Hour}, 0)
	boom := errors.New("boom")
	for _, tc := range []struct {
		name string
		req  CreateRequest
		fail error // injected into Start
		want error
	}{
		{"unknown template", CreateRequest{TemplateID: "nope"}, nil, ErrUnknownTemplate},
		{"negative ttl", CreateRequest{TTL: -time.Second}, nil, ErrInvalid},
		{"ttl above the maximum", CreateRequest{TTL: 2 * time.Hour}, nil, ErrInvalid},
		{"limits above the template's", CreateRequest{Limits: Limits{CPUs: 64}}, nil, ErrInvalid},
		{"backend not allowed", CreateRequest{Backend: "fake"}, nil, ErrInvalid},
		{"the backend fails", CreateRequest{}, boom, boom},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b.SetStartError(tc.fail)
			defer b.SetStartError(nil)
			if tc.req.TemplateID == "" {
				tc.req.TemplateID = "base"
			}
			sb, err := m.Create(t.Context(), tc.req)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, %v; want %v", sb, err, tc.want)
			}
		})
	}
	if n := len(m.List(nil)); n != 0 {
		t.Errorf("%d sandboxes registered after failed creates", n)
	}
}

func TestCreateOnARequestedBackend(t *testing.T) {
	other := fake.New(t.TempDir(), nil)
	m, b := newManager(t, Config{AllowRequestBackend: true, Backends: map[string]Backend{"other": other}}, 0)
	sb := create(t, m, CreateRequest{Backend: "other"})
	if other.Starts() != 1 || b.Starts() != 0 {
		t.Errorf("starts: requested backend %d, default %d; want 1, 0", other.Starts(), b.Starts())
	}
	if err := m.Kill(sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(t.Context(), CreateRequest{TemplateID: "base", Backend: "nope"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("unknown backend: %v, want ErrInvalid", err)
	}
}

func TestMaxSandboxes(t *testing.T) {
	m, _ := newManager(t, Config{MaxSandboxes: 2}, 0)
	a := create(t, m, CreateRequest{})
	create(t, m, CreateRequest{})
	if _, err := m.Create(t.Context(), CreateRequest{TemplateID: "base"}); !errors.Is(err, ErrTooMany) {
		t.Fatalf("third create: %v, want ErrTooMany", err)
	}
	if err := m.Kill(a.ID); err != nil {
		t.Fatal(err)
	}
	create(t, m, CreateRequest{})
}

func TestMaxSandboxesUnderConcurrentCreates(t *testing.T) {
	const limit, tries = 3, 12
	// Starts held until every create is in flight or refused.
	entered, release := make(chan struct{}, tries), make(chan struct{})
	m, b := newManager(t, Config{MaxSandboxes: limit}, 0, func(b *fake.Backend) {
		b.SetStartHook(func(ctx context.Context) error {
			entered <- struct{}{}
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	})
	errs := make(chan error, tries)
	var wg sync.WaitGroup
	for range tries {
		wg.Go(func() {
			_, err := m.Create(context.Background(), CreateRequest{TemplateID: "base"})
			errs <- err
		})
	}
	starting, refused := 0, 0
	for starting+refused < tries {
		select {
		case <-entered:
			starting++
		case err := <-errs:
			if !errors.Is(err, ErrTooMany) {
				t.Fatalf("a create ended before any start was let go: %v, want ErrTooMany", err)
			}
			refused++
		}
	}
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a create let past the limit: %v", err)
		}
	}
	if starting != limit || refused != tries-limit {
		t.Errorf("%d creates started a sandbox and %d were refused, want %d and %d", starting, refused, limit, tries-limit)
	}
	if got := b.Starts(); got != limit {
		t.Errorf("%d sandboxes started, want %d: refused creates start none", got, limit)
	}
}

func TestTTLExpiryKills(t *testing.T) {
	m, _ := newManager(t, Config{}, 0)
	sb := create(t, m, CreateRequest{TTL: 20 * time.Millisecond})
	clockOf(m).Advance(19 * time.Millisecond)
	if _, err := m.Get(sb.ID); err != nil {
		t.Fatalf("before the end of its time to live: %v", err)
	}
	clockOf(m).Advance(time.Millisecond)
	if !gone(m, sb.ID)() {
		t.Fatal("the sandbox outlived its time to live")
	}
	inst := instance(sb)
	if !inst.Killed() || !inst.Waited() {
		t.Errorf("the expired sandbox's instance killed %v, removed %v; want both", inst.Killed(), inst.Waited())
	}
}

func TestSetTTL(t *testing.T) {
	m, _ := newManager(t, Config{MaxTTL: time.Hour}, 0)
	clock := clockOf(m)

	t.Run("extends", func(t *testing.T) {
		sb := create(t, m, CreateRequest{TTL: 300 * time.Millisecond})
		end := sb.EndAt()
		if err := m.SetTTL(sb.ID, time.Hour); err != nil {
			t.Fatal(err)
		}
		if got, want := sb.EndAt(), clock.Now().Add(time.Hour); !got.Equal(want) || !got.After(end) {
			t.Errorf("EndAt %v, want %v, after the first %v", got, want, end)
		}
		clock.Advance(400 * time.Millisecond)
		if _, err := m.Get(sb.ID); err != nil {
			t.Errorf("past its first end: %v", err)
		}
	})
	t.Run("shortens", func(t *testing.T) {
		sb := create(t, m, CreateRequest{TTL: time.Hour})
		if err := m.SetTTL(sb.ID, 10*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		clock.Advance(10 * time.Millisecond)
		if !gone(m, sb.ID)() {
			t.Error("the sandbox outlived its shortened time to live")
		}
	})
	t.Run("bounds", func(t *testing.T) {
		sb := create(t, m, CreateRequest{})
		if err := m.SetTTL(sb.ID, 2*time.Hour); !errors.Is(err, ErrInvalid) {
			t.Errorf("above the maximum: %v, want ErrInvalid", err)
		}
		if err := m.SetTTL("nope", time.Minute); !errors.Is(err, ErrNotFound) {
			t.Errorf("unknown sandbox: %v, want ErrNotFound", err)
		}
	})
}

func TestPauseStopsTheTTLAndResumeRestartsIt(t *testing.T) {
	m, _ := newManager(t, Config{PauseInMemory: true}, 0)
	clock := clockOf(m)
	sb := create(t, m, CreateRequest{TTL: 300 * time.Millisecond})
	if err := m.Pause(t.Context(), sb.ID, true); err != nil {
		t.Fatal(err)
	}
	if !sb.Paused() || !instance(sb).Paused() {
		t.Fatalf("after Pause: sandbox paused %v, instance paused %v", sb.Paused(), instance(sb).Paused())
	}
	// Paused, it ends at the server's longest time to live (an hour).
	if got, want := sb.EndAt(), clock.Now().Add(time.Hour); !got.Equal(want) {
		t.Errorf("paused: EndAt %v, want %v", got, want)
	}
	clock.Advance(400 * time.Millisecond)
	if _, err := m.Get(sb.ID); err != nil {
		t.Fatalf("paused sandbox past its time to live: %v", err)
	}
	if err := m.SetTTL(sb.ID, time.Minute); !errors.Is(err, ErrConflict) {
		t.Errorf("SetTTL while paused: %v, want ErrConflict", err)
	}
	if err := m.Resume(t.Context(), sb.ID, 20*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if sb.Paused() || instance(sb).Paused() {
		t.Error("still paused after Resume")
	}
	clock.Advance(20 * time.Millisecond)
	if !gone(m, sb.ID)() {
		t.Error("the resumed sandbox outlived the time to live its resume gave it")
	}
}

func TestPausedSandboxEndsAtMaxTTL(t *testing.T) {
	// Paused at the end of its time to live (a pause by hand could come
	// too late), then killed when the longest has passed.
	m, _ := newManager(t, Config{PauseInMemory: true, DefaultTTL: 20 * time.Millisecond, MaxTTL: 20 * time.Millisecond}, 0)
	sb := create(t, m, CreateRequest{AutoPause: true})
	clockOf(m).Advance(20 * time.Millisecond)
	if !sb.Paused() || gone(m, sb.ID)() {
		t.Fatalf("at the end of its time to live: paused %v, gone %v; want paused", sb.Paused(), gone(m, sb.ID)())
	}
	clockOf(m).Advance(20 * time.Millisecond)
	if !gone(m, sb.ID)() {
		t.Fatal("the paused sandbox outlived the longest time to live")
	}
	if inst := instance(sb); !inst.Paused() || !inst.Killed() {
		t.Errorf("instance paused %v killed %v, want killed while paused", inst.Paused(), inst.Killed())
	}
}

func TestAutoPauseAtTheEndOfTTL(t *testing.T) {
	m, _ := newManager(t, Config{PauseInMemory: true}, 0)
	sb := create(t, m, CreateRequest{TTL: 20 * time.Millisecond, AutoPause: true})
	clockOf(m).Advance(20 * time.Millisecond)
	if !sb.Paused() {
		t.Fatal("not paused at the end of its time to live")
	}
	if _, err := m.Get(sb.ID); err != nil {
		t.Fatalf("auto-paused sandbox: %v", err)
	}
	if !instance(sb).Paused() || instance(sb).Killed() {
		t.Errorf("instance paused %v killed %v, want paused, alive", instance(sb).Paused(), instance(sb).Killed())
	}
	if err := m.Resume(t.Context(), sb.ID, time.Minute); err != nil {
		t.Fatal(err)
	}
	if sb.Paused() {
		t.Error("still paused after Resume")
	}
}

// A timer that fires after a new time to live was set is stale: the
// sandbox lives on (a timer may fire while SetTTL waits for the lock).
func TestStaleTimerIsIgnored(t *testing.T) {
	m, _ := newManager(t, Config{}, 0)
	sb := create(t, m, CreateRequest{TTL: time.Minute})
	sb.mu.Lock()
	sb.endAt = m.clock.Now().Add(time.Hour) // as a SetTTL that came between
	sb.mu.Unlock()
	m.expire(sb)
	if _, err := m.Get(sb.ID); err != nil {
		t.Fatalf("a stale timer ended the sandbox: %v", err)
	}
}

func TestPauseConflicts(t *testing.T) {
	m, _ := newManager(t, Config{PauseInMemory: true}, 0)

	t.Run("twice", func(t *testing.T) {
		sb := create(t, m, CreateRequest{})
		if err := m.Pause(t.Context(), sb.ID, true); err != nil {
			t.Fatal(err)
		}
		if err := m.Pause(t.Context(), sb.ID, true); !errors.Is(err, ErrConflict) {
			t.Errorf("second pause: %v, want ErrConflict", err)
		}
	})
	t.Run("after kill", func(t *testing.T) {
		sb := create(t, m, CreateRequest{})
		if err := m.Kill(sb.ID); err != nil {
			t.Fatal(err)
		}
		if err := m.Pause(t.Context(), sb.ID, true); !errors.Is(err, ErrNotFound) {
			t.Errorf("pause by id after kill: %v, want ErrNotFound", err)
		}
		// A pause already holding the sandbox (the TTL's auto-pause) must
		// not freeze what is dying either.
		if err := m.pause(t.Context(), sb, true); !errors.Is(err, ErrNotFound) {
			t.Errorf("pause of a killed sandbox: %v, want ErrNotFound", err)
		}
		if instance(sb).Paused() {
			t.Error("a killed sandbox's instance was paused")
		}
	})
	t.Run("resume of a running one", func(t *testing.T) {
		sb := create(t, m, CreateRequest{})
		if err := m.Resume(t.Context(), sb.ID, 0); err != nil {
			t.Errorf("resume of a running sandbox: %v, want no error", err)
		}
	})
}

func TestSandboxThatDiesLeavesTheRegistry(t *testing.T) {
	m, _ := newManager(t, Config{}, 0)
	sb := create(t, m, CreateRequest{})
	keep := create(t, m, CreateRequest{})
	instance(sb).Die()
	waitFor(t, m, "the dead sandbox left the registry", gone(m, sb.ID))
	<-sb.Done()
	if !instance(sb).Waited() {
		t.Error("the dead sandbox's box was not removed by the time it was done")
	}
	if got := m.metrics.ended.Load(); got != 1 {
		t.Errorf("ended = %d, want 1", got)
	}
	if _, err := m.Get(keep.ID); err != nil {
		t.Errorf("the other sandbox: %v", err)
	}
}

func TestPooledSandboxThatDiesIsNotHandedOut(t *testing.T) {
	m, b := newManager(t, Config{}, 1)
	waitFor(t, m, "the pool is full", func() bool { return pooled(m) == 1 })
	dead := b.Instances()[0]
	dead.Die()
	<-dead.Done()
	sb := create(t, m, CreateRequest{})
	if instance(sb) == dead {
		t.Fatal("a dead pooled sandbox was handed out")
	}
	removed(t, dead)
}

func TestShutdown(t *testing.T) {
	m, b := newManager(t, Config{PauseInMemory: true}, 2)
	waitFor(t, m, "the pool is full", func() bool { return pooled(m) == 2 })
	running := []*Sandbox{create(t, m, CreateRequest{}), create(t, m, CreateRequest{})}
	paused := create(t, m, CreateRequest{})
	if err := m.Pause(t.Context(), paused.ID, true); err != nil {
		t.Fatal(err)
	}
	m.Shutdown()
	for i, inst := range b.Instances() {
		select {
		case <-inst.Done():
		default:
			t.Errorf("instance %d still running after Shutdown", i)
		}
		if !inst.Waited() {
			t.Errorf("instance %d not removed after Shutdown", i)
		}
	}
	if n := len(m.List(nil)); n != 0 {
		t.Errorf("%d sandboxes listed after Shutdown", n)
	}
	if got := pooled(m); got != 0 {
		t.Errorf("pool holds %d after Shutdown", got)
	}
	if _, err := m.Get(running[0].ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after Shutdown: %v", err)
	}
	if _, err := m.Create(t.Context(), CreateRequest{TemplateID: "base"}); !errors.Is(err, ErrShuttingDown) {
		t.Errorf("create after Shutdown: %v, want ErrShuttingDown", err)
	}
}

// A create under way when Shutdown begins ends before Shutdown returns,
// its sandbox removed: nothing may start after the manager has stopped.
func TestShutdownWaitsForCreates(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	m, b := newManager(t, Config{}, 0, func(b *fake.Backend) {
		b.SetStartHook(func(context.Context) error {
			close(entered)
			<-release
			return nil
		})
	})
	created := make(chan error, 1)
	go func() {
		_, err := m.Create(context.Background(), CreateRequest{TemplateID: "base"})
		created <- err
	}()
	<-entered
	shut := make(chan struct{})
	go func() { defer close(shut); m.Shutdown() }()
	<-m.ctx.Done() // Shutdown has begun: the manager is closed
	close(release)
	<-shut
	m.mu.Lock()
	starting := m.starting
	m.mu.Unlock()
	if starting != 0 {
		t.Errorf("Shutdown returned with %d creates still under way", starting)
	}
	for i, inst := range b.Instances() {
		if !inst.Waited() {
			t.Errorf("instance %d not removed when Shutdown returned", i)
		}
	}
	if err := <-created; !errors.Is(err, ErrShuttingDown) {
		t.Errorf("create during Shutdown: %v, want ErrShuttingDown", err)
	}
}

func TestList(t *testing.T) {
	m, _ := newManager(t, Config{}, 0)
	a := create(t, m, CreateRequest{Metadata: map[string]string{"team": "a", "env": "x"}})
	b := create(t, m, CreateRequest{Metadata: map[string]string{"team": "a"}})
	c := create(t, m, CreateRequest{Metadata: map[string]string{"team": "b"}})
	d := create(t, m, CreateRequest{})
	if d.Metadata == nil {
		t.Error("a sandbox created without metadata has nil Metadata, want empty")
	}
	for _, tc := range []struct {
		name   string
		filter map[string]string
		want   []*Sandbox
	}{
		{"all", nil, []*Sandbox{a, b, c, d}},
		{"one pair", map[string]string{"team": "a"}, []*Sandbox{a, b}},
		{"every pair", map[string]string{"team": "a", "env": "x"}, []*Sandbox{a}},
		{"no match", map[string]string{"team": "c"}, nil},
		{"unknown key", map[string]string{"nope": ""}, []*Sandbox{a, b, c, d}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := m.List(tc.filter)
			// Oldest first, the id breaking ties.
			if !slices.IsSortedFunc(got, func(x, y *Sandbox) int {
				if c := x.StartedAt.Compare(y.StartedAt); c != 0 {
					return c
				}
				return strings.Compare(x.ID, y.ID)
			}) {
				t.Error("not oldest first")
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %d sandboxes, want %d", len(got), len(tc.want))
			}
			for _, sb := range tc.want {
				if !slices.Contains(got, sb) {
					t.Errorf("%s missing", sb.ID)
				}
			}
		})
	}
}

func TestUsage(t *testing.T) {
	m, _ := newManager(t, Config{}, 0, func(b *fake.Backend) { b.SetMemory(10 << 20) })
	sb := create(t, m, CreateRequest{})
	u, err := sb.Usage(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if u.Memory != 10<<20 || u.CPUPercent != 0 {
		t.Errorf("usage %+v, want 10M of memory and no CPU", u)
	}
	// An hour of CPU since the last call is more than one CPU can do: the
	// share is capped at 100%.
	instance(sb).SetUsage(backend.Usage{Memory: 10 << 20, CPU: time.Hour})
	clockOf(m).Advance(time.Second)
	if u, _ := sb.Usage(t.Context()); u.CPUPercent != 100 {
		t.Errorf("CPUPercent = %g, want 100", u.CPUPercent)
	}
	clockOf(m).Advance(time.Second)
	if u, _ := sb.Usage(t.Context()); u.CPUPercent != 0 {
		t.Errorf("CPUPercent = %g with no CPU used since the last call, want 0", u.CPUPercent)
	}
	// Half a CPU's second in a second, of a sandbox of one CPU: 50%.
	instance(sb).SetUsage(backend.Usage{Memory: 10 << 20, CPU: time.Hour + 500*time.Millisecond})
	clockOf(m).Advance(time.Second)
	if u, _ := sb.Usage(t.Context()); u.CPUPercent != 50 {
		t.Errorf("CPUPercent = %g, want 50", u.CPUPercent)
	}
}

// A sandbox can be listed as soon as it is registered: calls on it from
// then on must find its time to live set up (a nil timer crashed the
// server when SetTTL or Pause came first).
func TestCallsOnAJustListedSandbox(t *testing.T) {
	m, _ := newManager(t, Config{PauseInMemory: true}, 0)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, sb := range m.List(nil) {
				m.SetTTL(sb.ID, time.Hour)
				m.Pause(context.Background(), sb.ID, true)
			}
			runtime.Gosched() // leave the creates a CPU
		}
	})
	for range 200 {
		sb := create(t, m, CreateRequest{})
		if err := m.Kill(sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
}
