package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/airlock-sandbox/airlock/internal/audit"
	"github.com/airlock-sandbox/airlock/internal/config"
	"github.com/airlock-sandbox/airlock/internal/netpolicy"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/secret"
)

// egress is what the proxy needs of the state directory for request
// rules (E2B's network.rules): the host's egress CA, which sandboxes with
// a network trust, and the secrets the rules fill in.
type egress struct {
	ca      *netpolicy.CA
	secrets *secret.Store
	audit   *audit.Store
}

// openEgress opens the CA (<state>/egress), the secrets
// (<state>/secrets) and the audit trails (<state>/audit) of stateDir,
// making them on the first start.
func openEgress(stateDir string, trails config.Audit, log *slog.Logger) (*egress, error) {
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
	au, err := audit.Open(filepath.Join(stateDir, "audit"), int64(trails.MaxSize), time.Duration(trails.Retention), log)
	if err != nil {
		return nil, err
	}
	return &egress{ca: ca, secrets: secrets, audit: au}, nil
}

// value is a secret's value, for the proxy.
func (e *egress) value(name string) (string, error) { return e.secrets.Value(name) }

// sweep removes, now and every few minutes until ctx ends, the audit
// trails that outlived their sandbox by the retention time.
func (e *egress) sweep(ctx context.Context, m *sandbox.Manager) {
	alive := func(id string) bool { _, err := m.Get(id); return err == nil }
	every := min(e.audit.Retention()/4, 10*time.Minute)
	for {
		e.audit.Sweep(alive)
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}
