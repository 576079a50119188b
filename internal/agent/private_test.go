package agent_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// TestPrivateEndpoints: the daemon's typed calls reach the endpoints the
// agent registers, and get the answers it gives outside a sandbox.
func TestPrivateEndpoints(t *testing.T) {
	url, _ := newAgent(t)
	c := client(url)
	if d, err := c.Disk(t.Context()); err != nil || d.Used < 0 {
		t.Errorf("Disk: %+v, %v", d, err)
	}
	// No kernel was prestarted, none runs: both answer at once.
	if err := c.Settle(t.Context()); err != nil {
		t.Errorf("Settle: %v", err)
	}
	if err := c.Reseed(t.Context()); err != nil {
		t.Errorf("Reseed: %v", err)
	}
	// An agent served on a listener it was handed cannot let go of it.
	var e *agentproto.Error
	if err := c.Checkpoint(t.Context()); !errors.As(err, &e) || !strings.Contains(e.Message, "cannot let go") {
		t.Errorf("Checkpoint: %v, want the agent's refusal", err)
	}
	// Only an agent that is the sandbox's root lays out others' files.
	if err := c.Untar(t.Context(), "/tmp/x", false, strings.NewReader("")); !errors.As(err, &e) || !strings.Contains(e.Message, "only a sandbox's root") {
		t.Errorf("Untar: %v, want the agent's refusal", err)
	}
}
