package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/config"
	"github.com/airlock-sandbox/airlock/internal/daemon"
)

// mcpCmd serves MCP over stdin and stdout for one agent, the way MCP
// clients start local servers. Sandboxes run in this process, on the
// namespaces backend or gVisor; they end with it.
func mcpCmd(args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	signal.Ignore(syscall.SIGPIPE)
	fs := flag.NewFlagSet("mcp", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	flags := config.MCPFlags(fs)
	if err := fs.Parse(args); err != nil {
		return usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	// No environment: its settings are the command line's.
	cfg, err := config.Resolve(nil, flags)
	if err != nil {
		return usageError{err.Error()}
	}
	// stdout carries the protocol: the log goes to stderr, which MCP
	// clients show as the server's log.
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	return daemon.ServeMCP(ctx, cfg, &sdk.StdioTransport{}, daemon.Options{Log: log})
}
