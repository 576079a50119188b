package namespaces

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/airlock-sandbox/airlock/internal/layout"
)

// trust is a CA that sandboxes with a network trust beside the system's
// roots: the egress proxy's (package netpolicy), which issues the
// certificates of the HTTPS it intercepts for request rules.
type trust struct {
	pem []byte
	// bundle is the host's store with pem added, the file a sandbox on
	// the host's root sees at layout.CABundle. A sandbox of an image has
	// pem added to its image's own store (nsinit's imageEtc).
	bundle string
}

// trustOf is the trust of a sandbox in netns: none without a network.
func (b *Backend) trustOf(netns *os.File) trust {
	if netns == nil {
		return trust{}
	}
	return b.trust
}

// TrustCA has every sandbox with a network trust the CA of pem from now
// on. The host's store is read once, here: a sandbox sees it as it was.
func (b *Backend) TrustCA(pem []byte) error {
	host, err := os.ReadFile(layout.CABundle)
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("the host's certificates: %w", err)
	}
	if len(host) == 0 {
		// No store on the host: a root of the host's entries has none to
		// add the CA to (an image's may).
		b.log.Warn("the host has no store of certificates: sandboxes on its /usr do not trust the egress CA", "store", layout.CABundle)
		b.trust = trust{pem: pem}
		return nil
	}
	if !bytes.HasSuffix(host, []byte("\n")) {
		host = append(host, '\n')
	}
	dir := filepath.Join(b.stateDir, "trust")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// Written aside and renamed: a sandbox starting now mounts either.
	bundle := filepath.Join(dir, "ca-certificates.crt")
	tmp := bundle + ".new"
	if err := os.WriteFile(tmp, append(host, pem...), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, bundle); err != nil {
		return err
	}
	b.trust = trust{pem: pem, bundle: bundle}
	return nil
}
