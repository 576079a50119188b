package interpreter

import (
	"context"
	"maps"
	"slices"
)

// ExportEnv gives every running kernel vars, the sandbox's envVars:
// kernels started from now on find them in the agent's environment, but
// one started before them (a pool's prestarted kernel) must be told.
func (s *Service) ExportEnv(ctx context.Context, vars map[string]string) {
	// A default kernel still starting (the pool's, claimed early) was
	// given the environment of before: wait for it to be a context.
	s.starting.Lock()
	defer s.starting.Unlock()
	s.mu.Lock()
	list := slices.Collect(maps.Values(s.contexts))
	s.mu.Unlock()
	for _, c := range list {
		c.mu.Lock()
		if c.kernel != nil && c.lang.exportEnv != nil {
			if err := c.kernel.ExecuteSilent(ctx, c.lang.exportEnv(vars)); err != nil {
				s.log.Warn("sandbox envs for a running kernel", "language", c.Language, "err", err)
			}
		}
		c.mu.Unlock()
	}
}
