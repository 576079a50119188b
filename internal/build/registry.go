package build

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"time"

	"github.com/airlock-sandbox/airlock/internal/policy"
)

// PullRule is which addresses the pulls of clients' builds may dial. A
// client's fromImage names any registry, and the daemon pulls from the
// host's network: a name that resolves to the host's loopback, one of
// its own addresses (its public one included, where its API and other
// services listen), its network's private services or a cloud's
// metadata address would make the daemon reach them for the client,
// which its sandboxes may not.
type PullRule struct {
	// Private lets pulls dial the private ranges (10/8, 172.16/12,
	// 192.168/16, fc00::/7): registries of the operator's network
	// (builds.privateRegistries). Never the host's own addresses.
	Private bool
	// Allow are prefixes pulls may dial whatever they are, the host's
	// own addresses and loopback included: the operator's registries,
	// listed exactly (builds.registryAddresses).
	Allow []netip.Prefix
}

// RefusedError is a pull that the rule refused: the registry named (by
// the image, a redirect or a token realm) and the address it resolved to.
type RefusedError struct {
	Registry string
	Addr     string
}

// Error is one line for the client. It does not say which rule refused
// the address, so that it tells a client nothing about the host's own
// addresses that a client could not know.
func (e *RefusedError) Error() string {
	return fmt.Sprintf("registry %s refused: its address %s is not an internet address of another host (builds pull from the internet only; the operator may allow a registry with builds.registryAddresses)", e.Registry, e.Addr)
}

// metadata are cloud metadata services outside link-local space, which
// the private ranges would otherwise let in.
var metadata = []netip.Prefix{
	netip.MustParsePrefix("fd00:ec2::254/128"), // AWS IMDS over IPv6
}

// allows reports whether a pull may dial a; local lists the host's own
// addresses. In order, first match wins:
func (r PullRule) allows(a netip.Addr, local func() ([]netip.Addr, error)) bool {
	a = a.Unmap()
	if a.Zone() != "" {
		return false // an interface-scoped address: link-local, the host's own network
	}
	// 1. The operator's registries, wherever they are.
	for _, p := range r.Allow {
		if p.Contains(a) {
			return true
		}
	}
	// 2. Never the host: loopback, the unspecified address (which the
	// kernel connects to the host itself), or any address of its
	// interfaces. Listed at each dial: addresses come and go. Failing to
	// list them refuses.
	if a.IsLoopback() || a.IsUnspecified() {
		return false
	}
	own, err := local()
	if err != nil {
		return false
	}
	for _, o := range own {
		if o.Unmap() == a {
			return false
		}
	}
	// 3. Never a metadata service.
	for _, p := range metadata {
		if p.Contains(a) {
			return false
		}
	}
	// 4. The internet (which is not link-local, where the usual metadata
	// address is, nor multicast); the private ranges if allowed.
	return policy.Public(a) || r.Private && a.IsPrivate()
}

// localAddrs lists the addresses of the host's interfaces (of the
// daemon's network namespace).
func localAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}

// Transport carries the pulls of clients' builds (image, token realm
// and every redirect alike, each a new connection): it dials only what
// the rule allows, checked on the address actually dialed, after DNS,
// so that a name cannot rebind to an address the rule refuses. It never
// goes through a proxy, whose address would be the one checked.
func (r PullRule) Transport() http.RoundTripper {
	return &http.Transport{
		DialContext:           r.dial,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          16,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   15 * time.Second,
		ResponseHeaderTimeout: 60 * time.Second,
	}
}

// dial connects to address (the registry's host:port, as a URL named
// it) at an address the rule allows.
func (r PullRule) dial(ctx context.Context, network, address string) (net.Conn, error) {
	d := &net.Dialer{
		Timeout: 30 * time.Second,
		// Control runs for each address the name resolved to, on the
		// socket about to connect: nothing is sent to a refused one.
		Control: func(_, dialed string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(dialed)
			if err != nil || !r.allows(ap.Addr(), localAddrs) {
				host, _, _ := net.SplitHostPort(dialed)
				return &RefusedError{Registry: address, Addr: host}
			}
			return nil
		},
	}
	return d.DialContext(ctx, network, address)
}
