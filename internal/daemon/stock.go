package daemon

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/config"
	"github.com/airlock-sandbox/airlock/internal/image"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/stock"
)

// checkStock refuses a stock root the daemon does not know.
func checkStock(s config.Stock) error {
	switch s.Root {
	case "", config.StockJail, config.StockDebian:
	default:
		return configErrorf("stock.root %q: want %q or %q", s.Root, config.StockJail, config.StockDebian)
	}
	if s.Cache != "" && !filepath.IsAbs(s.Cache) {
		return configErrorf("stock.cache %q is not an absolute path", s.Cache)
	}
	return nil
}

// stockTemplates puts base and code-interpreter-v1 of mc on the stock
// root cfg names, and returns the store of its images (nil for the jail;
// a Config made by hand, with no root named, has the jail). The Debian
// root is made at the first start that finds none, not at install: a
// single binary has no make step, and the root is made from the apt
// sources of the host it runs on. It is made once per package list and
// kept in the cache, which a host's daemons (and make test's) share.
func stockTemplates(ctx context.Context, cfg *config.Config, mc *sandbox.Config, log *slog.Logger) (*image.Store, error) {
	if cfg.Stock.Root != config.StockDebian {
		return nil, nil
	}
	cache := cmp.Or(cfg.Stock.Cache, config.DefaultStockCache)
	store, err := stock.Open(ctx, cache, log)
	if err != nil {
		// Said with the way out: a host that cannot make the root (not
		// Debian, no debootstrap, no mirror) still serves the jail.
		return nil, fmt.Errorf("%w (stock.root %q serves base and code-interpreter-v1 on the host's /usr instead)", err, config.StockJail)
	}
	for i := range mc.Templates {
		t := &mc.Templates[i]
		name := map[string]string{"base": stock.Base, config.CodeInterpreter: stock.Interpreter}[t.Name]
		if name == "" {
			continue // the jail
		}
		img, err := store.Get(name)
		if err != nil {
			return nil, err
		}
		if err := store.Apply(img, &t.Policy, false); err != nil {
			return nil, err
		}
		// Its agent runs as the sandbox's root, as an image's does: user
		// by default, root and sudo when asked, as on E2B.
		t.Policy.Root = true
		if t.Name == config.CodeInterpreter {
			// E2B's code interpreter starts a JavaScript context beside
			// Python's; tslab's kernel takes seconds to start, so a
			// pooled sandbox has it running before it is claimed.
			t.Policy.Env = append(t.Policy.Env, agentproto.PrestartLateEnv+"=javascript")
		}
		if err := t.Policy.Validate(); err != nil {
			return nil, err
		}
	}
	return store, nil
}
