package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"

	"github.com/airlock-sandbox/airlock/internal/config"
	"github.com/airlock-sandbox/airlock/internal/netpolicy"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// networkHost returns the network configuration of cfg.
func networkHost(cfg *config.Config) (netpolicy.Config, error) {
	n := netpolicy.Config{Upstream: cfg.Network.DNS, LocalZones: cfg.Network.LocalZones,
		Limits: netpolicy.Limits{Connections: cfg.Network.Connections, Bandwidth: int64(cfg.Network.Bandwidth)},
		Budget: int64(cfg.Network.Budget)}
	if cfg.Network.Subnet != "" {
		p, err := netip.ParsePrefix(cfg.Network.Subnet)
		if err != nil {
			return n, fmt.Errorf("network.subnet %q is not a CIDR prefix", cfg.Network.Subnet)
		}
		n.Subnet = p
	}
	if n.Limits.Connections < 0 || n.Limits.Bandwidth < 0 || n.Budget < 0 {
		return n, errors.New("network.connections, network.bandwidth and network.budget must not be negative")
	}
	for _, r := range []struct {
		field, s string
		to       *netpolicy.Rate
	}{{"dnsRate", cfg.Network.DNSRate, &n.Limits.DNSRate}, {"connectionRate", cfg.Network.ConnectionRate, &n.Limits.ConnectionRate}} {
		if r.s == "" {
			continue
		}
		rate, err := netpolicy.ParseRate(r.s)
		if err != nil {
			return n, fmt.Errorf("network.%s: %v", r.field, err)
		}
		*r.to = rate
	}
	return n, nil
}

// newNetwork makes the host side of sandboxes' networks and removes what
// a dead daemon's sandboxes left of theirs; nil when the configuration
// disables networks.
func newNetwork(cfg *config.Config, log *slog.Logger) (*hostNetwork, error) {
	if cfg.Network.Disabled {
		return nil, nil
	}
	ncfg, err := networkHost(cfg)
	if err != nil {
		return nil, err
	}
	h, err := netpolicy.NewHost(ncfg, log)
	if errors.Is(err, netpolicy.ErrUnavailable) {
		// The rest of the server works; requests for a network are told
		// why there is none.
		log.Warn("sandboxes cannot have networks on this host", "err", err)
		return &hostNetwork{unavailable: err}, nil
	}
	if err != nil {
		return nil, err
	}
	return &hostNetwork{h: h}, nil
}

// useEgress has the proxy intercept HTTPS for request rules with eg's CA
// and fill in eg's secrets.
func (n *hostNetwork) useEgress(eg *egress) {
	if n != nil && n.h != nil {
		n.h.UseEgress(netpolicy.Egress{CA: eg.ca, Secrets: eg.value, Audit: eg.audit.Record})
	}
}

// cleanup removes what a dead daemon's sandboxes left of their networks,
// once the manager has taken back those still running (live restore).
func (n *hostNetwork) cleanup(log *slog.Logger) {
	if n == nil || n.h == nil {
		return
	}
	if err := n.h.Cleanup(); err != nil {
		log.Warn("cleanup of earlier sandbox networks", "err", err)
	}
}

// hostNetwork is a netpolicy.Host as the manager sees it, or why the
// host has none.
type hostNetwork struct {
	h           *netpolicy.Host
	unavailable error
}

// close removes the host's nftables table if no sandbox on the host has a
// network any more: call it once the manager's sandboxes are gone.
func (n *hostNetwork) close(log *slog.Logger) {
	if n == nil || n.h == nil {
		return
	}
	if err := n.h.Close(); err != nil {
		log.Warn("removing the host's network table", "err", err)
	}
}

func (n *hostNetwork) Attach(ctx context.Context, id string, pol policy.Network) (sandbox.NetAttachment, error) {
	if n.unavailable != nil {
		return nil, fmt.Errorf("%w: this host cannot give sandboxes a network (the server log says why): create with allowInternetAccess (allow_internet_access) false and without network.allowOut/denyOut", sandbox.ErrInvalid)
	}
	a, err := n.h.Attach(ctx, id, pol)
	if err != nil {
		return nil, err
	}
	return a, nil
}

// Adopt takes back the network that handle names of a sandbox an
// earlier daemon left running in ns.
func (n *hostNetwork) Adopt(ctx context.Context, id, handle string, ns *os.File, pol policy.Network) (sandbox.NetAttachment, error) {
	if n.h == nil {
		ns.Close()
		return nil, errors.New("this host gives sandboxes no network now")
	}
	a, err := n.h.Adopt(ctx, id, handle, ns, pol)
	if err != nil {
		return nil, err
	}
	return a, nil
}
