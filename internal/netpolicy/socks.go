package netpolicy

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	xproxy "golang.org/x/net/proxy"
)

// dial opens the daemon's connection to dst, which the policy allowed:
// straight, or through the sandbox's egress proxy (E2B's
// network.egressProxy), a SOCKS5 proxy of the user's, asked for dst by
// address. A proxy that cannot be reached, or refuses, fails the
// connection: nothing goes out another way.
func (p *proxy) dial(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	ep := p.a.policy().EgressProxy
	if ep == nil {
		return p.dialer.DialContext(ctx, "tcp4", dst.String())
	}
	var auth *xproxy.Auth
	if ep.Username != "" {
		auth = &xproxy.Auth{User: ep.Username, Password: ep.Password}
	}
	// The proxy's own address is checked where it is connected to, after
	// its name resolved (it may have changed since the policy was set):
	// never the host's, a private or reserved one, or a sandbox's.
	forward := &net.Dialer{Timeout: dialTimeout, Control: func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil || p.a.filter.special(ap.Addr()) {
			return fmt.Errorf("the egress proxy's address %s is not a public one", address)
		}
		return nil
	}}
	d, err := xproxy.SOCKS5("tcp4", ep.Address, auth, forward)
	if err != nil {
		return nil, err
	}
	return d.(xproxy.ContextDialer).DialContext(ctx, "tcp4", dst.String())
}
