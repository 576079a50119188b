package fake

import (
	"testing"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/backend/backendtest"
)

// The contract of every backend, on the fake, which the manager's tests
// stand on: what it does not claim it says why.
func TestConformance(t *testing.T) {
	backendtest.Conformance(t, backendtest.Target{
		New: func(stateDir string) backend.Backend { return New(stateDir, nil) },
		// Each instance's directory, removed by Wait.
		Leftovers: backendtest.Entries,
		Capabilities: backendtest.Capabilities{
			Run:          "it has no isolation to run a one-shot command in",
			Limits:       "its agent runs in the test's own process, which nothing limits",
			Containment:  "what its agent starts runs on the host and outlives a Kill",
			Usage:        "it reports the usage its test sets",
			CrashCleanup: "its instances live in the test's process and die with it; their directories are the test's",
		},
	})
}
