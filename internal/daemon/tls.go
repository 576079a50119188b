package daemon

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/config"
)

// serverTLS is the TLS configuration of cfg's certificate (nil: plain
// HTTP). The SDKs, given E2B_DOMAIN, reach the API at api.{domain} and a
// sandbox's servers at {port}-{sandboxID}.{domain}, over HTTPS: the
// certificate must cover the domain's wildcard, or every client would
// fail its check.
func serverTLS(cfg *config.Config) (*tls.Config, error) {
	t := cfg.TLS
	if t.Cert == "" && t.Key == "" {
		return nil, nil
	}
	if t.Cert == "" || t.Key == "" {
		return nil, errors.New("tls needs both cert and key")
	}
	if cfg.Node.Name != "" {
		// Routers reach nodes at their advertised http:// URL, and serve
		// clients themselves.
		return nil, errors.New("tls is the router's, not a cluster node's")
	}
	if cfg.Domain == "" {
		return nil, errors.New("tls needs a domain: clients reach the server at api.DOMAIN and sandboxes at PORT-ID.DOMAIN")
	}
	pair, err := tls.LoadX509KeyPair(t.Cert, t.Key)
	if err != nil {
		return nil, fmt.Errorf("tls: %v", err)
	}
	host := cfg.Domain
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if err := pair.Leaf.VerifyHostname("api." + host); err != nil {
		return nil, fmt.Errorf("tls: the certificate does not cover *.%s: %v", host, err)
	}
	// HTTP/1.1 only: the gateway's websockets and streams are upgrades
	// and long bodies of HTTP/1.1.
	return &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}, nil
}

// nssResolvesLocalhost reports whether the host's C library resolves
// names under localhost, which the default domain's hosts are: glibc
// does only through nss-myhostname or systemd-resolved (curl and
// browsers resolve them themselves). Read from nsswitch.conf, not by a
// lookup, which would ask the host's DNS server.
func nssResolvesLocalhost(nsswitch string) bool {
	f, err := os.Open(nsswitch)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "hosts:")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		return slices.Contains(fields, "myhostname") || slices.Contains(fields, "resolve")
	}
	return false
}
