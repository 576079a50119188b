package sandbox

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/backend/fake"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/sandboxid"
)

// An id is E2B-like, begins with the node's prefix, and is what the
// cluster's router reads the node from.
func TestSandboxIDs(t *testing.T) {
	shape := regexp.MustCompile(`^i[0-9a-f]{19}$`)
	seen := map[string]bool{}
	for range 100 {
		id := newSandboxID("")
		if !shape.MatchString(id) || seen[id] {
			t.Fatalf("id %q: malformed or repeated", id)
		}
		seen[id] = true
	}
	prefix := sandboxid.NodePrefix("node-a")
	id := newSandboxID(prefix)
	if !shape.MatchString(id) || sandboxid.NodeOf(id) != prefix {
		t.Errorf("id %q: its node is %q, want %q", id, sandboxid.NodeOf(id), prefix)
	}
	if !recordName(id + ".json") {
		t.Errorf("the record of %s would not be found again", id)
	}
	m, _ := newManager(t, Config{IDPrefix: prefix}, 0)
	if sb := create(t, m, CreateRequest{}); sandboxid.NodeOf(sb.ID) != prefix {
		t.Errorf("a created sandbox's id %s is not of its node", sb.ID)
	}
}

func TestRegistry(t *testing.T) {
	m, _ := newManager(t, Config{}, 0)
	a := create(t, m, CreateRequest{})
	b := create(t, m, CreateRequest{})
	if got, err := m.Get(a.ID); err != nil || got != a {
		t.Errorf("Get: %v %v", got, err)
	}
	if _, err := m.Get("nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get of an unknown id: %v", err)
	}
	if err := m.Kill("nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Kill of an unknown id: %v", err)
	}
	if all := m.All(); len(all) != 2 {
		t.Errorf("All() holds %d", len(all))
	}
	running, _ := m.Counts()
	if running["base"] != 2 {
		t.Errorf("Counts: %v", running)
	}
	if err := m.Kill(b.ID); err != nil {
		t.Fatal(err)
	}
	if err := m.Kill(b.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("a second Kill: %v", err)
	}
	if b.State() != Gone {
		t.Errorf("killed: %s", b.State())
	}
	// The first of two removals wins; the second does nothing.
	m.remove(b, "again")
	if got := m.metrics.ended.Load(); got != 1 {
		t.Errorf("ended = %d after a second removal, want 1", got)
	}
	if a.BackendName() != "fake" || a.Transport() == nil || a.Done() == nil {
		t.Error("a sandbox's accessors")
	}
}

func TestTemplates(t *testing.T) {
	m, _ := newManager(t, Config{}, 0)
	if !m.IsConfigured("base") || !m.TemplateExists("base") {
		t.Error("base is configured")
	}
	if m.IsConfigured("img") || m.TemplateExists("img") {
		t.Error("an unknown template exists")
	}
	src := &source{}
	src.set(Template{Name: "img", Policy: baseOf(m)})
	sm, b := newManager(t, Config{Source: src}, 0)
	if sm.IsConfigured("img") || !sm.TemplateExists("img") || sm.TemplateExists("nope") {
		t.Error("a Source's template exists, and is not configured")
	}
	sb := create(t, sm, CreateRequest{TemplateID: "img"})
	if sb.TemplateID != "img" || b.Starts() != 1 {
		t.Errorf("created %s with %d starts", sb.TemplateID, b.Starts())
	}
	if _, err := sm.Create(t.Context(), CreateRequest{TemplateID: "nope"}); !errors.Is(err, ErrUnknownTemplate) {
		t.Errorf("an unknown template: %v", err)
	}
}

// A Source's template gets a pool when asked for one, by SetPoolSize or
// its own PoolSize; a new version of it replaces its pool.
func TestSourcePools(t *testing.T) {
	src := &source{}
	m, b := newManager(t, Config{Source: src}, 0)
	src.set(Template{Name: "img", Policy: baseOf(m), Version: "1"})
	m.SetPoolSize("img", 1)
	waitFor(t, m, "the image's pool fills", func() bool { return pooledOf(m, "img") == 1 })
	sb := create(t, m, CreateRequest{TemplateID: "img"})
	if instance(sb) != b.Instances()[0] {
		t.Error("the create did not claim the pooled sandbox")
	}
	waitFor(t, m, "the pool refills", func() bool { return pooledOf(m, "img") == 1 })
	old := b.Instances()[1]
	src.set(Template{Name: "img", Policy: baseOf(m), Version: "2"})
	create(t, m, CreateRequest{TemplateID: "img"}) // started for version 2: a new pool
	removed(t, old)
	waitFor(t, m, "the new version's pool fills", func() bool { return pooledOf(m, "img") == 1 })
	pools, budget := m.Pools(t.Context())
	if budget != 0 || len(pools) != 2 || pools[0].Template != "base" || pools[1].Template != "img" || pools[1].Ready != 1 {
		t.Errorf("Pools() = %+v, %d", pools, budget)
	}
	// A template gone from the Source retires its pool at its next look.
	src.mu.Lock()
	delete(src.m, "img")
	src.mu.Unlock()
	m.SetPoolSize("img", 2)
	waitFor(t, m, "the pool of a template gone is retired", func() bool {
		_, ok := m.Counts()
		_, has := ok["img"]
		return !has
	})
}

// The tokens are the manager's MACs of the id: checked for sandboxes
// that no longer exist, told apart by kind.
func TestTokens(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	m, _ := newManager(t, Config{TokenKey: key}, 0)
	sb := create(t, m, CreateRequest{})
	if !m.Issued(sb.ID, sb.AccessToken, false) || !m.Issued(sb.ID, sb.TrafficToken, true) {
		t.Error("the sandbox's own tokens are not recognised")
	}
	if m.Issued(sb.ID, sb.AccessToken, true) || m.Issued(sb.ID, sb.TrafficToken, false) || m.Issued(sb.ID, "", false) || m.Issued("i0", sb.AccessToken, false) {
		t.Error("a token of another kind, sandbox, or none is recognised")
	}
	if !sb.CheckToken(sb.AccessToken) || sb.CheckToken(sb.TrafficToken) || !sb.CheckTrafficToken(sb.TrafficToken) {
		t.Error("CheckToken, CheckTrafficToken")
	}
	m.Kill(sb.ID)
	if !m.Issued(sb.ID, sb.AccessToken, false) {
		t.Error("a gone sandbox's token is no longer recognised")
	}
	other, _ := newManager(t, Config{TokenKey: key}, 0)
	if !other.Issued(sb.ID, sb.AccessToken, false) {
		t.Error("a manager with the same key does not recognise the token")
	}
	if len(sb.AccessToken) != 48 {
		t.Errorf("a token of %d hex digits, want 48", len(sb.AccessToken))
	}
}

// The gateway reaches a sandbox's own servers through its agent, which
// connects to them on the sandbox's loopback.
func TestPortTransport(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "from the sandbox") }))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	m, _ := newManager(t, Config{}, 0)
	sb := create(t, m, CreateRequest{})
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://127.0.0.1:"+port+"/", nil)
	resp, err := sb.PortTransport().RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "from the sandbox" {
		t.Errorf("through the port transport: %q", body)
	}
	// A sandbox saved to disk has no box to dial.
	pm, _ := persistent(t, Config{})
	saved := create(t, pm, CreateRequest{})
	if err := pm.Pause(t.Context(), saved.ID, true); err != nil {
		t.Fatal(err)
	}
	if _, err := saved.PortTransport().RoundTrip(req.Clone(t.Context())); err == nil || !strings.Contains(err.Error(), "paused") {
		t.Errorf("dialing a saved sandbox: %v", err)
	}
}

// The sampler measures running sandboxes every interval, on the
// manager's clock; a paused one keeps what it has.
func TestHistory(t *testing.T) {
	m, _ := newManager(t, Config{MetricsInterval: time.Second, PauseInMemory: true}, 0, func(b *fake.Backend) { b.SetMemory(5 << 20) })
	clock := clockOf(m)
	start := clock.Now()
	sb := create(t, m, CreateRequest{})
	paused := create(t, m, CreateRequest{})
	if err := m.Pause(t.Context(), paused.ID, true); err != nil {
		t.Fatal(err)
	}
	// Three ticks: the third is received once the second's samples are
	// taken (the third's may be under way).
	clock.Advance(3 * time.Second)
	got := sb.History(start, start.Add(3*time.Second))
	if len(got) < 2 || len(got) > 3 {
		t.Fatalf("%d samples after three ticks, want 2 or 3", len(got))
	}
	for i, sm := range got {
		if !sm.At.After(start) || i > 0 && sm.At.Before(got[i-1].At) || sm.Usage.Memory != 5<<20 {
			t.Errorf("sample %d: %+v", i, sm)
		}
	}
	if h := sb.History(start.Add(90*time.Second), start.Add(time.Hour)); len(h) != 0 {
		t.Errorf("History outside the samples: %v", h)
	}
	if h := paused.History(start, start.Add(time.Hour)); len(h) != 0 {
		t.Errorf("a paused sandbox was sampled: %v", h)
	}
	for i := range historyLen + 5 {
		sb.record(Sample{At: start.Add(time.Duration(i) * time.Minute)})
	}
	if h := sb.History(start, start.Add(time.Hour*24)); len(h) != historyLen {
		t.Errorf("%d samples kept, want at most %d", len(h), historyLen)
	}
}

func TestErrors(t *testing.T) {
	cause := errors.New("/var/lib/airlock/x: no such file")
	pe := &PublicError{Err: ErrInvalid, Cause: cause}
	if pe.Error() != ErrInvalid.Error() || !errors.Is(pe, ErrInvalid) || strings.Contains(pe.Error(), "/var") {
		t.Errorf("PublicError says %q", pe)
	}
	ue := &UnrestorableError{ID: "i1", Err: cause}
	if !errors.Is(ue, ErrUnrestorable) || !errors.Is(ue, cause) || !strings.Contains(ue.Error(), "restore sandbox i1") {
		t.Errorf("UnrestorableError: %v", ue)
	}
	if pub := ue.Public(); strings.Contains(pub, "/var") || !strings.Contains(pub, "corrupt") {
		t.Errorf("the client is told %q", pub)
	}
	se := &UnrestorableError{ID: "snap", Snapshot: true, Err: &backend.StateError{Reason: "is of another runsc"}}
	if !strings.Contains(se.Error(), "start from snapshot snap") || !strings.Contains(se.Public(), "is of another runsc") || !strings.Contains(se.Public(), "delete it") {
		t.Errorf("a snapshot's: %q, %q", se.Error(), se.Public())
	}
}

// baseOf is the policy of m's template base.
func baseOf(m *Manager) policy.Policy {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pools["base"].tmpl.Policy
}

var errAny = errors.New("any")
