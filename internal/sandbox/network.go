package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// Network makes the networks of sandboxes whose policy has one (package
// netpolicy's Host, adapted by cmd).
type Network interface {
	Attach(ctx context.Context, id string, pol policy.Network) (NetAttachment, error)
}

// NetAttachment is one sandbox's network.
type NetAttachment interface {
	// Namespace is the network namespace the sandbox must run in.
	Namespace() *os.File
	Policy() policy.Network
	// Update replaces the policy; connections it no longer allows end.
	Update(policy.Network) error
	// Name names the sandbox it is for in its log lines (a pooled
	// sandbox's network is made before its claim gives it an id).
	Name(id string)
	// Close removes the network; the sandbox must be gone.
	Close() error
}

// Ingress is how the gateway reaches a sandbox's own servers, as E2B's
// network options say.
type Ingress struct {
	// Public: requests to the sandbox's ports need no traffic token
	// (E2B's allowPublicTraffic, true unless asked otherwise).
	Public bool
	// MaskHost replaces the Host header of requests passed to the
	// sandbox's ports; "${PORT}" in it becomes the port.
	MaskHost string
	// HTTPSPorts are ports whose servers speak TLS: the gateway talks TLS
	// to them, without checking their certificate.
	HTTPSPorts []int
}

// netInstance is an instance with a network of its own, which goes with it.
type netInstance struct {
	Instance
	net NetAttachment
}

// Wait removes the box, then its network: nothing may run in it by then.
func (i netInstance) Wait() error {
	err := i.Instance.Wait()
	return errors.Join(err, i.net.Close())
}

// ExportRoot passes the export of a root (backend.RootExporter) through.
func (i netInstance) ExportRoot(ctx context.Context, w io.Writer) error {
	e, ok := i.Instance.(backend.RootExporter)
	if !ok {
		return errors.New("this backend cannot read back a sandbox's root")
	}
	return e.ExportRoot(ctx, w)
}

// inNetwork starts a box for sandbox id under pol with start: in a
// network made for it, closed to all but what pol's network allows, if
// pol has one (start gets its namespace; the box and the network go
// together from then on), else without one (start gets nil). Every box
// with a network starts here: made afresh, cloned or restored.
func (m *Manager) inNetwork(ctx context.Context, id string, pol policy.Policy, start func(netns *os.File) (Instance, error)) (Instance, NetAttachment, error) {
	if pol.Network.Mode == policy.NetNone {
		inst, err := start(nil)
		return inst, nil, err
	}
	if m.cfg.Network == nil {
		return nil, nil, networkError{fmt.Errorf("%w: this server gives sandboxes no network: create with allowInternetAccess (allow_internet_access) false and without network.allowOut/denyOut (SDKs that send allowInternetAccess true by default need it said)", ErrInvalid)}
	}
	if m.cfg.Sealed && pol.Network.OpenInternet() {
		// Saved or copied before the server was sealed: fail closed.
		m.log.Warn("sealed server: a sandbox's network that opened the internet is made closed", "sandbox", id)
		pol.Network = policy.Network{Mode: policy.NetFiltered}
	}
	att, err := m.cfg.Network.Attach(ctx, id, pol.Network)
	if err != nil {
		return nil, nil, networkError{fmt.Errorf("network: %w", err)}
	}
	inst, err := start(att.Namespace())
	if err != nil {
		att.Close()
		return nil, nil, err
	}
	return netInstance{inst, att}, att, nil
}

// networkError is a failure to make a box's network, not of the box or
// of what it is made from: a snapshot that meets one is not broken.
type networkError struct{ error }

func (e networkError) Unwrap() error { return e.error }

// bare is the backend's own instance of inst: what it can save, copy
// or export, its network aside.
func bare(inst Instance) Instance {
	if n, ok := inst.(netInstance); ok {
		return n.Instance
	}
	return inst
}

// UpdateNetwork replaces the network policy of sandbox id. A sandbox made
// without a network cannot get one: its isolation was built without an
// interface (gVisor's netstack takes the interfaces it finds at start).
// Through the E2B API every sandbox has one where the server gives
// networks, a sealed one's closed; not MCP's, nor on a sealed server,
// nor one that cannot have a network yet.
func (m *Manager) UpdateNetwork(id string, pol policy.Network) error {
	sb, err := m.Get(id)
	if err != nil {
		return err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.net == nil && sb.pol.Network.Mode != policy.NetNone && sb.state.saved() {
		// Paused to disk, it has no network now: the policy is its
		// restore's, kept only once its record says so.
		if pol.Mode == policy.NetNone {
			pol.Mode = policy.NetFiltered
		}
		if err := pol.Validate(); err != nil {
			return fmt.Errorf("%w: %v", ErrInvalid, err)
		}
		old := sb.pol.Network
		sb.setNetwork(nil, pol)
		if err := m.writeRecord(sb); err != nil {
			sb.setNetwork(nil, old)
			return err
		}
		sb.Log("info", "sandbox", "network updated")
		return nil
	}
	if sb.net == nil {
		return fmt.Errorf("%w: sandbox %s has no network interface, so its network cannot change: it was created without one (by MCP, or on a server without networks or sealed by network.default \"none\")", ErrConflict, id)
	}
	if pol.Mode == policy.NetNone {
		pol.Mode = policy.NetFiltered // its interface stays, closed to everything
	}
	if err := sb.net.Update(pol); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	m.keepLive(sb)
	sb.Log("info", "sandbox", "network updated")
	return nil
}
