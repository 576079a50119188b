package daemon

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/config"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// managerConfig returns the sandbox manager's configuration for cfg.
// backendFor returns the backend of a name ("" is the server's); it is
// asked only for the backends cfg names.
func managerConfig(cfg *config.Config, backendFor func(name string) (sandbox.Backend, error)) (sandbox.Config, error) {
	mc := sandbox.Config{
		PoolMemoryBudget: int64(cfg.PoolMemoryBudget),
		DefaultTTL:       time.Duration(cfg.DefaultTimeout),
		MaxTTL:           time.Duration(cfg.MaxTimeout),
		MaxSandboxes:     cfg.MaxSandboxes,
		MetricsInterval:  time.Duration(cfg.MetricsInterval),
		StateDir:         cfg.StateDir,
		BackendByName:    backendFor,
		PauseInMemory:    cfg.PauseInMemory,
		LiveRestore:      cfg.LiveRestore,
	}
	if mc.DefaultTTL <= 0 || mc.MaxTTL < mc.DefaultTTL {
		return mc, errors.New("defaultTimeout must be positive and at most maxTimeout")
	}
	if cfg.MaxConnections < 0 || cfg.IdleTimeout < 0 {
		return mc, errors.New("maxConnections and idleTimeout must not be negative")
	}
	for name := range cfg.Templates {
		if !slices.Contains(config.Builtin, name) {
			return mc, fmt.Errorf("unknown template %q in config (have %s)", name, strings.Join(config.Builtin, ", "))
		}
	}
	for _, name := range config.Builtin {
		t := sandbox.Template{Name: name, Policy: policy.Default(), PoolSize: 2}
		p := &t.Policy
		if tc, ok := cfg.Templates[name]; ok {
			if tc.Memory != nil {
				p.MemoryBytes = int64(*tc.Memory)
			}
			if tc.Pids != nil {
				p.Pids = *tc.Pids
			}
			if tc.CPUs != nil {
				p.CPUs = *tc.CPUs
			}
			if tc.Disk != nil {
				p.DiskBytes = int64(*tc.Disk)
			}
			if tc.PoolSize != nil {
				t.PoolSize = *tc.PoolSize
			}
			if tc.Backend != "" {
				b, err := backendFor(tc.Backend)
				if err != nil {
					return mc, fmt.Errorf("template %s: %w", name, err)
				}
				t.Backend = b
			}
		}
		if name == config.Jail && cfg.Stock.Root != config.StockDebian {
			// base is the same sandbox, pooled: a second pool of it would
			// only hold memory (a create of jail starts one cold).
			t.PoolSize = 0
		}
		if name == config.CodeInterpreter {
			// Its agent starts a Python kernel while the sandbox waits in
			// the pool (importing ipykernel alone costs ~0.4 s).
			p.Env = append(p.Env, agentproto.PrestartEnv+"=python")
			// Where the backend can, its pool is of clones of one whose
			// kernel had started, rather than each starting its own.
			t.WarmSnapshot = true
		}
		if err := p.Validate(); err != nil {
			return mc, fmt.Errorf("template %s: %w", name, err)
		}
		if t.PoolSize < 0 || t.PoolSize > 1000 {
			return mc, fmt.Errorf("template %s: pool size %d is out of range", name, t.PoolSize)
		}
		mc.Templates = append(mc.Templates, t)
	}
	return mc, nil
}
