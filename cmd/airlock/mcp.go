package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/config"
	"github.com/airlock-sandbox/airlock/internal/mcp"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
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
	backends := newBackends(cfg.StateDir, cfg.Runsc, log)
	mcfg, err := config.Manager(&cfg, backends.get)
	if err != nil {
		return usageError{err.Error()}
	}
	// Its sandboxes are its own: none outlives it, saved or not, and the
	// records of a server sharing the state directory are not its.
	mcfg.StateDir = ""
	isolation, err := backends.get(cfg.Backend)
	if err != nil {
		return usageError{err.Error()}
	}
	if err := checkStateDir(cfg.StateDir); err != nil {
		return err
	}
	if err := openStateDir(ctx, cfg.StateDir, backends, log); err != nil {
		return err
	}
	m := sandbox.NewManager(mcfg, isolation, log)
	defer m.Shutdown()
	err = mcp.New(m, time.Duration(cfg.DefaultTimeout), log).Run(ctx, &sdk.StdioTransport{})
	if ctx.Err() != nil || errors.Is(err, io.EOF) {
		return nil // the client closed stdin or stopped us: a normal end
	}
	return err
}
