package build

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"time"

	"github.com/airlock-sandbox/airlock/internal/policy"
)

// PublicRegistries is the transport of the images that API clients ask a
// build to pull: it dials internet addresses only, checked on the address
// actually dialed (after DNS, so a name cannot rebind to one), and never
// through a proxy. A client's fromImage must not make the daemon reach
// its host's loopback, its network's private services or a cloud's
// metadata address, none of which its sandboxes may reach either.
func PublicRegistries() http.RoundTripper {
	d := &net.Dialer{
		Timeout: 30 * time.Second,
		Control: func(network, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil || !policy.Public(ap.Addr()) {
				return fmt.Errorf("registry address %s is not an internet address: this server pulls clients' images from public registries only (builds.privateRegistries allows others)", address)
			}
			return nil
		},
	}
	return &http.Transport{
		DialContext:           d.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          16,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   15 * time.Second,
		ResponseHeaderTimeout: 60 * time.Second,
	}
}
