package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/backend/fake"
	"github.com/airlock-sandbox/airlock/internal/config"
)

// resolveMCP is the configuration of airlock mcp with args.
func resolveMCP(t *testing.T, args ...string) config.Config {
	t.Helper()
	fs := flag.NewFlagSet("mcp", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	flags := config.MCPFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Resolve(nil, flags)
	if err != nil {
		t.Fatal(err)
	}
	return onTheJail(cfg)
}

// TestServeMCP: airlock mcp's daemon runs one client's commands in a
// sandbox of its own, and ends it, and itself, when the client goes.
func TestServeMCP(t *testing.T) {
	backends := fakes(t, "fake")
	cfg := resolveMCP(t, "--state-dir", filepath.Join(t.TempDir(), "state"), "--backend", "fake", "--pool-size", "0")
	serverT, clientT := sdk.NewInMemoryTransports()
	served := make(chan error, 1)
	// A server that ends before it answers ends the client's wait too,
	// saying why: the in-memory transport would otherwise wait for ever.
	ctx, cancel := context.WithCancelCause(t.Context())
	go func() {
		err := ServeMCP(ctx, cfg, serverT, Options{Log: testLog(t), Backends: backends})
		cancel(fmt.Errorf("ServeMCP returned %v", err))
		served <- err
	}()

	client := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil)
	session, err := client.Connect(ctx, clientT, nil)
	if err != nil {
		t.Fatalf("connect: %v (%v)", err, context.Cause(ctx))
	}
	res, err := session.CallTool(t.Context(), &sdk.CallToolParams{Name: "run_command", Arguments: map[string]any{"command": "echo from-the-sandbox"}})
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			text.WriteString(tc.Text)
		}
	}
	if res.IsError || !strings.Contains(text.String(), "from-the-sandbox") {
		t.Errorf("run_command: error %v, %q; want the command's output", res.IsError, text.String())
	}
	b := backends["fake"].(*fake.Backend)
	if b.Live() != 1 {
		t.Errorf("%d fake instances live, want the session's sandbox", b.Live())
	}
	session.Close()
	if err := <-served; err != nil {
		t.Errorf("ServeMCP after the client closed: %v, want nil", err)
	}
	if b.Live() != 0 {
		t.Errorf("%d fake instances live after ServeMCP returned, want none", b.Live())
	}
}

// TestServeMCPRefusesBadConfigs: what airlock mcp cannot run with is a
// *ConfigError, before any sandbox starts.
func TestServeMCPRefusesBadConfigs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--backend", "vm"}, `unknown backend "vm" (fake)`},
		{[]string{"--pool-size", "5000"}, "pool size 5000 is out of range"},
		{[]string{"--state-dir", "relative"}, `state directory "relative" is not an absolute path`},
	} {
		cfg := resolveMCP(t, append([]string{"--state-dir", t.TempDir(), "--backend", "fake"}, tc.args...)...)
		serverT, _ := sdk.NewInMemoryTransports()
		err := ServeMCP(t.Context(), cfg, serverT, Options{Log: testLog(t), Backends: fakes(t, "fake")})
		if ce := (*ConfigError)(nil); !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("mcp %v: %T %v, want a *ConfigError naming %q", tc.args, err, err, tc.want)
		}
	}
}
