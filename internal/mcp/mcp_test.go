package mcp

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

func TestLimitedBodyFailsPastTheLimit(t *testing.T) {
	big := bytes.Repeat([]byte("x"), maxResponse+10)
	b := &limitedBody{r: io.LimitReader(bytes.NewReader(big), maxResponse+1), c: io.NopCloser(nil)}
	n, err := io.Copy(io.Discard, b)
	if !errors.Is(err, errResponseTooLarge) || n > maxResponse {
		t.Fatalf("read %d bytes, err %v; want at most %d and errResponseTooLarge", n, err, maxResponse)
	}
	ok := &limitedBody{r: strings.NewReader("small"), c: io.NopCloser(nil)}
	if data, err := io.ReadAll(ok); err != nil || string(data) != "small" {
		t.Fatalf("small body: %q, %v", data, err)
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
