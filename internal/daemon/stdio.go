package daemon

import (
	"context"
	"errors"
	"io"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/config"
	"github.com/airlock-sandbox/airlock/internal/mcp"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// ServeMCP is airlock mcp: MCP over t (stdin and stdout) for one
// client, the way MCP clients start local servers. Its sandboxes run in
// this process and end with it, when the client closes t or ctx ends.
func ServeMCP(ctx context.Context, cfg config.Config, t sdk.Transport, opts Options) error {
	log := opts.log()
	backends := newBackends(cfg.StateDir, cfg.Runsc, opts.Backends, log)
	mcfg, err := managerConfig(&cfg, backends.get)
	if err != nil {
		return configError(err)
	}
	// Its sandboxes are its own: none outlives it, saved or not, and the
	// records of a server sharing the state directory are not its.
	mcfg.StateDir = ""
	isolation, err := backends.get(cfg.Backend)
	if err != nil {
		return configError(err)
	}
	if err := backends.checkStateDir(cfg.StateDir); err != nil {
		return err
	}
	if err := checkStock(cfg.Stock); err != nil {
		return err
	}
	if err := openStateDir(ctx, cfg.StateDir, backends, log); err != nil {
		return err
	}
	if _, err := stockTemplates(ctx, &cfg, &mcfg, log); err != nil {
		return err
	}
	m := sandbox.NewManager(mcfg, isolation, log)
	defer m.Shutdown()
	err = mcp.New(m, time.Duration(cfg.DefaultTimeout), log).Run(ctx, t)
	if ctx.Err() != nil || errors.Is(err, io.EOF) {
		return nil // the client closed stdin or stopped us: a normal end
	}
	return err
}
