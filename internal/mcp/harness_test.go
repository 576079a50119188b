package mcp

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/backend/fake"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// harness is the real MCP server over a real sandbox.Manager whose
// sandboxes are the fake backend's (the real agent, in this process, as
// the test's user), reached by the SDK's own client through its
// in-memory transports.
type harness struct {
	t   *testing.T
	srv *sdk.Server
	m   *sandbox.Manager
	b   *fake.Backend
}

// newHarness serves the templates base and code-interpreter-v1; a zero
// DefaultTTL in cfg is a minute, a zero MaxTTL an hour.
func newHarness(t *testing.T, cfg sandbox.Config) *harness {
	t.Helper()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	b := fake.New(t.TempDir(), log)
	if cfg.DefaultTTL == 0 {
		cfg.DefaultTTL = time.Minute
	}
	if cfg.MaxTTL == 0 {
		cfg.MaxTTL = time.Hour
	}
	cfg.Templates = append(cfg.Templates,
		sandbox.Template{Name: "base", Policy: policy.Default()},
		sandbox.Template{Name: codeTemplate, Policy: policy.Default()})
	m := sandbox.NewManager(cfg, b, log)
	t.Cleanup(func() {
		m.Shutdown()
		if n := b.Live(); n != 0 {
			t.Errorf("%d sandboxes still live after Shutdown", n)
		}
	})
	return &harness{t: t, srv: New(m, time.Minute, log), m: m, b: b}
}

// idTransport gives an in-memory connection a session id, as the
// streamable HTTP transport's have: without one, every session would be
// stdio's "".
type idTransport struct {
	sdk.Transport
	id string
}

func (t idTransport) Connect(ctx context.Context) (sdk.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	return idConn{c, t.id}, err
}

type idConn struct {
	sdk.Connection
	id string
}

func (c idConn) SessionID() string { return c.id }

// connect opens the MCP session id, closed when the test ends.
func (h *harness) connect(id string, opts *sdk.ClientOptions) *sdk.ClientSession {
	h.t.Helper()
	st, ct := sdk.NewInMemoryTransports()
	ss, err := h.srv.Connect(h.t.Context(), idTransport{st, id}, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, opts).Connect(h.t.Context(), ct, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() {
		cs.Close()
		ss.Wait()
	})
	return cs
}

// call calls tool with args and returns its text, the blocks joined by
// newlines, and whether it is an error result.
func call(t *testing.T, cs *sdk.ClientSession, tool string, args map[string]any) (string, bool) {
	t.Helper()
	res := callResult(t, cs, tool, args)
	var texts []string
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			texts = append(texts, tc.Text)
		}
	}
	return strings.Join(texts, "\n"), res.IsError
}

func callResult(t *testing.T, cs *sdk.ClientSession, tool string, args map[string]any) *sdk.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(t.Context(), &sdk.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return res
}

// mustCall calls tool and fails t unless it succeeded.
func mustCall(t *testing.T, cs *sdk.ClientSession, tool string, args map[string]any) string {
	t.Helper()
	text, isErr := call(t, cs, tool, args)
	if isErr {
		t.Fatalf("%s(%v): error result %q", tool, args, text)
	}
	return text
}

// only is the one sandbox the manager runs.
func (h *harness) only() *sandbox.Sandbox {
	h.t.Helper()
	list := h.m.List(nil)
	if len(list) != 1 {
		h.t.Fatalf("%d sandboxes running, want 1", len(list))
	}
	return list[0]
}

// ended waits until sb has ended; the test's own deadline bounds it.
func ended(t *testing.T, sb *sandbox.Sandbox) {
	t.Helper()
	select {
	case <-sb.Done():
	case <-t.Context().Done():
		t.Fatalf("sandbox %s did not end", sb.ID)
	}
}
