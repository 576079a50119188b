package mcp

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// TestFromAgent: what the agent reported reaches the model as it said
// it; the daemon's own errors stay as they are.
func TestFromAgent(t *testing.T) {
	dial := fmt.Errorf("dial unix /var/lib/airlock/run/x.sock: connect: refused")
	for _, c := range []struct {
		err  error
		want error
	}{
		{&agentproto.Error{Code: agentproto.CodeNotFound, Message: "path '/home/user/a' does not exist"}, agentError{"path '/home/user/a' does not exist"}},
		{&agentproto.Error{Code: agentproto.CodeDeadlineExceeded, Message: "context deadline exceeded"}, context.DeadlineExceeded},
		{fmt.Errorf("stream ended early: %w", agentproto.ErrTooLarge), errResponseTooLarge},
		{dial, dial},
		{nil, nil},
	} {
		if got := fromAgent(c.err); got != c.want {
			t.Errorf("fromAgent(%v) = %#v, want %#v", c.err, got, c.want)
		}
	}
}

func TestFailureHidesDaemonErrors(t *testing.T) {
	s := &Server{log: slog.New(slog.DiscardHandler)}
	text := func(r *sdk.CallToolResult) string { return r.Content[0].(*sdk.TextContent).Text }
	for _, c := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("dial unix /var/lib/airlock/run/x.sock: connect: refused"), "read_file: internal error (the server log has the details)"},
		{agentError{"no such file: /home/user/a"}, "read_file: no such file: /home/user/a"},
		{fmt.Errorf("%w %q", sandbox.ErrUnknownTemplate, "nope"), `read_file: unknown template "nope"`},
	} {
		r := s.failure("read_file", c.err)
		if !r.IsError || text(r) != c.want {
			t.Errorf("failure(%v) = %q, want %q", c.err, text(r), c.want)
		}
	}
}

func TestUTF8Prefix(t *testing.T) {
	euro := "\u20ac" // three bytes
	for _, c := range []struct {
		data string
		cut  bool
		want string
		ok   bool
	}{
		{"plain", false, "plain", true},
		{"a" + euro, false, "a" + euro, true},
		{"a" + euro[:2], true, "a", true},  // cut inside a character
		{"a" + euro[:2], false, "", false}, // a whole file that ends so is not text
		{"\x00\xff\xfe", false, "", false},
	} {
		got, ok := utf8Prefix([]byte(c.data), c.cut)
		if got != c.want || ok != c.ok {
			t.Errorf("utf8Prefix(%q, %v) = %q, %v; want %q, %v", c.data, c.cut, got, ok, c.want, c.ok)
		}
	}
}
