package sandbox

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/backend/fake"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// A private sandbox (a template build's) answers through its agent, is
// never listed nor counted, and is gone once closed.
func TestPrivateSandbox(t *testing.T) {
	m, b := newManager(t, Config{MaxSandboxes: 1}, 0)
	pv, err := m.StartPrivate(t.Context(), nil, policy.Default())
	if err != nil {
		t.Fatal(err)
	}
	resp, err := pv.Agent().Do(t.Context(), agentproto.InterpreterPort, http.MethodGet, "/health", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("its agent's health: %d", resp.StatusCode)
	}
	if n := len(m.List(nil)); n != 0 {
		t.Errorf("a private sandbox is listed: %d", n)
	}
	create(t, m, CreateRequest{}) // the limit is the clients' alone
	if err := pv.ExportRoot(t.Context(), &bytes.Buffer{}); err == nil {
		t.Error("ExportRoot on a backend that cannot read back a root")
	}
	box := b.Instances()[0]
	pv.Close()
	pv.Close() // twice is once
	if !box.Waited() {
		t.Error("Close returned before the box was removed")
	}
}

// Shutdown closes the private sandboxes it finds, and refuses new ones.
func TestShutdownClosesPrivateSandboxes(t *testing.T) {
	m, b := newManager(t, Config{}, 0)
	if _, err := m.StartPrivate(t.Context(), nil, policy.Default()); err != nil {
		t.Fatal(err)
	}
	m.Shutdown()
	if !b.Instances()[0].Waited() {
		t.Error("Shutdown left a private sandbox")
	}
	if _, err := m.StartPrivate(t.Context(), nil, policy.Default()); !errors.Is(err, ErrShuttingDown) {
		t.Errorf("a private sandbox after Shutdown: %v", err)
	}
	for i, inst := range b.Instances() {
		removed(t, inst)
		if !inst.Killed() {
			t.Errorf("instance %d not killed", i)
		}
	}
}

// A private sandbox starts on the backend it names, in a network of its
// own if its policy has one; a start that fails returns its error.
func TestPrivateSandboxBackendAndNetwork(t *testing.T) {
	n := &fakeNetwork{}
	m, b := newManager(t, Config{Network: n}, 0)
	other := fake.New(t.TempDir(), nil)
	p := policy.Default()
	p.Network = internet
	pv, err := m.StartPrivate(t.Context(), other, p)
	if err != nil {
		t.Fatal(err)
	}
	defer pv.Close()
	if other.Starts() != 1 || b.Starts() != 0 {
		t.Errorf("starts: named backend %d, the manager's %d", other.Starts(), b.Starts())
	}
	n.mu.Lock()
	attached := len(n.attached)
	n.mu.Unlock()
	if attached != 1 {
		t.Errorf("%d networks attached, want 1", attached)
	}
	b.SetStartError(errors.New("no box"))
	if _, err := m.StartPrivate(t.Context(), nil, policy.Default()); err == nil {
		t.Error("a private sandbox whose box fails started")
	}
}
