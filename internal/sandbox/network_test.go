package sandbox

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// fakeNetwork attaches networks that are only remembered: their
// namespace is /dev/null, which the fake backend only keeps.
type fakeNetwork struct {
	mu       sync.Mutex
	err      error
	attached map[string]*fakeAttachment // by sandbox id
}

func (n *fakeNetwork) Attach(_ context.Context, id string, pol policy.Network) (NetAttachment, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.err != nil {
		return nil, n.err
	}
	ns, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	a := &fakeAttachment{ns: ns, pol: pol}
	if n.attached == nil {
		n.attached = map[string]*fakeAttachment{}
	}
	n.attached[id] = a
	return a, nil
}

func (n *fakeNetwork) get(id string) *fakeAttachment {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.attached[id]
}

type fakeAttachment struct {
	ns        *os.File
	mu        sync.Mutex
	pol       policy.Network
	updateErr error
	closed    bool
}

func (a *fakeAttachment) Namespace() *os.File { return a.ns }

func (a *fakeAttachment) Policy() policy.Network {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pol
}

func (a *fakeAttachment) Update(p policy.Network) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.updateErr != nil {
		return a.updateErr
	}
	a.pol = p
	return nil
}

func (a *fakeAttachment) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	return a.ns.Close()
}

func (a *fakeAttachment) isClosed() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.closed
}

var internet = policy.Network{Mode: policy.NetInternet}

// A sandbox with a network is started for its request, in a network made
// for it, which goes when its box has gone.
func TestNetworkedSandbox(t *testing.T) {
	n := &fakeNetwork{}
	m, b := newManager(t, Config{Network: n}, 1)
	waitFor(t, m, "the pool is full", func() bool { return pooled(m) == 1 })
	sb := create(t, m, CreateRequest{Network: internet})
	att := n.get(sb.ID)
	if att == nil {
		t.Fatal("no network attached for the sandbox")
	}
	if instance(sb) == b.Instances()[0] || instance(sb).NetNS() != att.ns {
		t.Error("a sandbox with a network came from the pool, or runs outside its network")
	}
	if pol, ok := sb.Network(); !ok || pol.Mode != policy.NetInternet {
		t.Errorf("Network() = %v, %v", pol, ok)
	}
	if err := m.UpdateNetwork(sb.ID, policy.Network{Mode: policy.NetFiltered, AllowOut: []policy.Rule{{Name: "example.com"}}}); err != nil {
		t.Fatal(err)
	}
	if pol, _ := sb.Network(); pol.Mode != policy.NetFiltered || len(pol.AllowOut) != 1 {
		t.Errorf("after the update: %+v", pol)
	}
	// Closed to everything, its interface stays.
	if err := m.UpdateNetwork(sb.ID, policy.Network{}); err != nil {
		t.Fatal(err)
	}
	if pol, _ := sb.Network(); pol.Mode != policy.NetFiltered || len(pol.AllowOut) != 0 {
		t.Errorf("after closing it: %+v", pol)
	}
	att.updateErr = errors.New("bad rule")
	if err := m.UpdateNetwork(sb.ID, internet); !errors.Is(err, ErrInvalid) {
		t.Errorf("a refused update: %v, want ErrInvalid", err)
	}
	// Its pause keeps it in memory: a copy would carry its addresses.
	if err := m.Pause(t.Context(), sb.ID, true); err != nil {
		t.Fatal(err)
	}
	if sb.State() != Paused {
		t.Errorf("paused: %s, want paused in memory", sb.State())
	}
	if err := m.Resume(t.Context(), sb.ID, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Snapshot(t.Context(), sb.ID, t.TempDir()+"/s"); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "network") {
		t.Errorf("snapshot of a networked sandbox: %v", err)
	}
	var buf bytes.Buffer
	if err := sb.instance().(backend.RootExporter).ExportRoot(t.Context(), &buf); err == nil {
		t.Error("ExportRoot through a backend that cannot")
	}
	if err := m.Kill(sb.ID); err != nil {
		t.Fatal(err)
	}
	<-sb.Done()
	if !att.isClosed() {
		t.Error("the network outlived its sandbox")
	}
}

func TestNetworkRefusals(t *testing.T) {
	m, _ := newManager(t, Config{}, 0)
	if _, err := m.Create(t.Context(), CreateRequest{TemplateID: "base", Network: internet}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "no network") {
		t.Errorf("a network on a server without: %v", err)
	}
	if _, err := m.Create(t.Context(), CreateRequest{TemplateID: "base", Network: policy.Network{Mode: "nope"}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("an unknown mode: %v", err)
	}
	plain := create(t, m, CreateRequest{})
	if err := m.UpdateNetwork(plain.ID, internet); !errors.Is(err, ErrConflict) {
		t.Errorf("a network for a sandbox made without: %v, want ErrConflict", err)
	}
	if err := m.UpdateNetwork("nope", internet); !errors.Is(err, ErrNotFound) {
		t.Errorf("an unknown sandbox: %v", err)
	}
	if _, ok := plain.Network(); ok {
		t.Error("Network() of a sandbox without one")
	}

	n := &fakeNetwork{err: errors.New("no addresses left")}
	nm, nb := newManager(t, Config{Network: n}, 0)
	if _, err := nm.Create(t.Context(), CreateRequest{TemplateID: "base", Network: internet}); err == nil || !strings.Contains(err.Error(), "network: no addresses left") {
		t.Errorf("a network that cannot be made: %v", err)
	}
	if nb.Starts() != 0 {
		t.Errorf("%d boxes started without their network", nb.Starts())
	}
	n.err = nil
	nb.SetStartError(errors.New("no box"))
	if _, err := nm.Create(t.Context(), CreateRequest{TemplateID: "base", Network: internet}); err == nil {
		t.Fatal("a create whose box fails succeeded")
	}
	n.mu.Lock()
	for id, a := range n.attached {
		if !a.isClosed() {
			t.Errorf("the network of %s outlived its failed start", id)
		}
	}
	n.mu.Unlock()
}
