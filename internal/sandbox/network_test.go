package sandbox

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// fakeNetwork attaches networks that are only remembered: their
// namespace is /dev/null, which the fake backend only keeps.
type fakeNetwork struct {
	mu       sync.Mutex
	err      error
	attached map[string]*fakeAttachment // by sandbox id (pooled ones: "pool-<template>")
	all      []*fakeAttachment
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
	n.all = append(n.all, a)
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
	name      string // the sandbox it was last named for
}

func (a *fakeAttachment) Name(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.name = id
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
	// Paused to disk, its network goes and its policy stays, for the
	// network its resume makes (an update meanwhile included).
	if err := m.Pause(t.Context(), sb.ID, true); err != nil {
		t.Fatal(err)
	}
	if sb.State() != Saved || !att.isClosed() {
		t.Errorf("paused: %s, its network closed %v; want saved, closed", sb.State(), att.isClosed())
	}
	if pol, ok := sb.Network(); !ok || pol.Mode != policy.NetFiltered || len(pol.AllowOut) != 0 {
		t.Errorf("Network() of the saved sandbox = %+v, %v", pol, ok)
	}
	if err := m.UpdateNetwork(sb.ID, internet); err != nil {
		t.Fatalf("update the network of a saved sandbox: %v", err)
	}
	if err := m.Resume(t.Context(), sb.ID, 0); err != nil {
		t.Fatal(err)
	}
	again := n.get(sb.ID)
	if again == att || instance(sb).NetNS() != again.ns || again.Policy().Mode != policy.NetInternet {
		t.Errorf("resumed outside a new network under its policy: %+v", again.Policy())
	}
	att = again
	// A snapshot's template has no network of its own (each create asks
	// for one; a pool without networks must hand out none); the network
	// the sandbox had is the fork's.
	of, err := m.Snapshot(t.Context(), sb.ID, t.TempDir()+"/s")
	if err != nil {
		t.Fatal(err)
	}
	if of.Policy.Network.Mode != policy.NetNone || of.Network.Mode != policy.NetInternet {
		t.Errorf("snapshot: template network %+v, the sandbox's %+v", of.Policy.Network, of.Network)
	}
	// Its copies each get a network of their own, under its policy.
	copies, err := m.Fork(t.Context(), sb.ID, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range copies {
		if c.Err != nil {
			t.Fatal(c.Err)
		}
		ca := n.get(c.Sandbox.ID)
		if ca == nil || ca == att || instance(c.Sandbox).NetNS() != ca.ns || ca.Policy().Mode != policy.NetInternet {
			t.Errorf("copy %s: not in a network of its own under the original's policy", c.Sandbox.ID)
		}
		if err := m.Kill(c.Sandbox.ID); err != nil {
			t.Fatal(err)
		}
		<-c.Sandbox.Done()
		if !ca.isClosed() {
			t.Error("a copy's network outlived it")
		}
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

// With NetworkedPools (the E2B API's default, the internet), pools keep
// sandboxes in networks closed to everything, and a create with a network
// claims one, whose policy becomes the request's: as fast as a claim
// without one. A create without a network makes the pool keep those too.
func TestNetworkedPool(t *testing.T) {
	n := &fakeNetwork{}
	m, b := newManager(t, Config{Network: n, NetworkedPools: true}, 1)
	waitFor(t, m, "the pool is full", func() bool { return pooled(m) == 1 })
	if got := len(b.Instances()); got != 1 {
		t.Fatalf("%d boxes started, want one, in a network", got)
	}
	waiting := n.get("pool-base")
	if waiting == nil || !closed(waiting.Policy()) {
		t.Fatalf("the pooled sandbox's network: %+v, want one closed to everything", waiting)
	}
	if b.Instances()[0].NetNS() != waiting.ns {
		t.Fatal("the pooled sandbox runs outside its network")
	}
	starts := b.Starts()
	sb := create(t, m, CreateRequest{Network: internet})
	if instance(sb) != b.Instances()[0] {
		t.Error("a create with a network did not claim the pooled sandbox")
	}
	if pol, ok := sb.Network(); !ok || pol.Mode != policy.NetInternet || waiting.Policy().Mode != policy.NetInternet {
		t.Errorf("claimed: Network() = %+v, %v; its attachment's %+v; want the internet", pol, ok, waiting.Policy())
	}
	// Its network's log lines (refusals) name the sandbox, not the pool.
	waiting.mu.Lock()
	name := waiting.name
	waiting.mu.Unlock()
	if name != sb.ID {
		t.Errorf("the claimed network is named %q, want the sandbox's id %q", name, sb.ID)
	}
	// Sealed (E2B's allowInternetAccess false): from the pool too, and
	// updateNetwork opens it and closes it again.
	waitFor(t, m, "the pool is refilled", func() bool { return pooled(m) == 1 })
	if b.Starts() != starts+1 {
		t.Errorf("%d boxes started for a claim, want only the refill", b.Starts()-starts)
	}
	refill := b.Instances()[len(b.Instances())-1]
	sealed := create(t, m, CreateRequest{Network: policy.Network{Mode: policy.NetFiltered}})
	// The pool refills again at once: which box it got says more than
	// how many have started.
	if instance(sealed) != refill {
		t.Error("a sealed create did not claim the pooled sandbox")
	}
	for _, pol := range []policy.Network{internet, {Mode: policy.NetFiltered}} {
		if err := m.UpdateNetwork(sealed.ID, pol); err != nil {
			t.Fatal(err)
		}
		if got, _ := sealed.Network(); got.Mode != pol.Mode {
			t.Errorf("after updateNetwork to %q: %q", pol.Mode, got.Mode)
		}
	}
	// A create without a network is started for it; from then on the
	// pool keeps one of those too.
	plain := create(t, m, CreateRequest{})
	if _, ok := plain.Network(); ok || instance(plain).NetNS() != nil {
		t.Error("a create without a network got one")
	}
	waitFor(t, m, "the pool keeps both kinds", func() bool {
		p := m.pools["base"]
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.ready[plainKind]) == 1 && len(p.ready[netKind]) == 1
	})
	again := create(t, m, CreateRequest{})
	if instance(again).NetNS() != nil || again.net != nil {
		t.Error("a create without a network claimed one with")
	}
	// A policy the network refuses at claim: the claimed sandbox goes,
	// and the create fails.
	waitFor(t, m, "the pool is refilled", func() bool { return pooled(m) == 2 })
	n.mu.Lock()
	next := n.all[len(n.all)-1]
	n.mu.Unlock()
	next.mu.Lock()
	next.updateErr = errors.New("bad rule")
	next.mu.Unlock()
	if _, err := m.Create(t.Context(), CreateRequest{TemplateID: "base", Network: internet}); !errors.Is(err, ErrInvalid) {
		t.Errorf("a claim whose policy is refused: %v, want ErrInvalid", err)
	}
	for deadline := time.Now().Add(10 * time.Second); !next.isClosed(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the refused sandbox's network outlived it")
		}
	}
	for _, s := range []*Sandbox{sb, sealed, plain, again} {
		if err := m.Kill(s.ID); err != nil {
			t.Fatal(err)
		}
		<-s.Done()
	}
	if !waiting.isClosed() {
		t.Error("a claimed sandbox's network outlived it")
	}
}

// A sandbox whose pause keeps only its files has a network like any
// other: its box and network go at the pause, and its resume makes both
// anew under the policy it had.
func TestFilesOnlyPauseKeepsTheNetwork(t *testing.T) {
	n := &fakeNetwork{}
	m, _ := newManager(t, Config{Network: n, NetworkedPools: true, StateDir: t.TempDir()}, 0)
	sb := create(t, m, CreateRequest{Network: policy.Network{Mode: policy.NetFiltered}, AutoPause: true, AutoPauseFiles: true})
	att := n.get(sb.ID)
	if _, ok := sb.Network(); !ok || att == nil {
		t.Fatal("a sandbox whose pause keeps only files has no network")
	}
	if err := m.UpdateNetwork(sb.ID, internet); err != nil {
		t.Fatal(err)
	}
	if err := m.Pause(t.Context(), sb.ID, false); err != nil {
		t.Fatal(err)
	}
	if sb.State() != SavedFiles || !att.isClosed() {
		t.Errorf("paused: %s, its network closed %v", sb.State(), att.isClosed())
	}
	if err := m.Resume(t.Context(), sb.ID, 0); err != nil {
		t.Fatal(err)
	}
	if again := n.get(sb.ID); again == att || instance(sb).NetNS() != again.ns || again.Policy().Mode != policy.NetInternet {
		t.Error("resumed outside a new network under its policy")
	}
}
