package daemon

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/airlock-sandbox/airlock/internal/netpolicy"
	"github.com/airlock-sandbox/airlock/internal/secret"
)

// egress is what the proxy needs of the state directory for request
// rules (E2B's network.rules): the host's egress CA, which sandboxes with
// a network trust, and the secrets the rules fill in.
type egress struct {
	ca      *netpolicy.CA
	secrets *secret.Store
}

// openEgress opens the CA (<state>/egress) and the secrets
// (<state>/secrets) of stateDir, making them on the first start.
func openEgress(stateDir string) (*egress, error) {
	// The state directory's own checks come later (openStateDir); what is
	// made here is made root-only.
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	ca, err := netpolicy.LoadCA(filepath.Join(stateDir, "egress"))
	if err != nil {
		return nil, fmt.Errorf("the egress CA: %w", err)
	}
	secrets, err := secret.Open(filepath.Join(stateDir, "secrets"))
	if err != nil {
		return nil, fmt.Errorf("the secret store: %w", err)
	}
	return &egress{ca: ca, secrets: secrets}, nil
}

// value is a secret's value, for the proxy.
func (e *egress) value(name string) (string, error) { return e.secrets.Value(name) }
