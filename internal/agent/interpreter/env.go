package interpreter

import (
	"context"
	"maps"
	"slices"
)

// ExportEnv gives every running kernel vars, the sandbox's envVars:
// kernels started from now on find them in the agent's environment, but
// one started before them (a pool's prestarted one) must be told. A
// kernel still starting is told by newContext once it runs (exportMissed):
// a claim never waits for a kernel's start.
func (s *Service) ExportEnv(ctx context.Context, vars map[string]string) {
	s.mu.Lock()
	s.exported, s.exports = vars, s.exports+1
	list := slices.Collect(maps.Values(s.contexts))
	s.mu.Unlock()
	for _, c := range list {
		c.mu.Lock()
		s.export(ctx, c, vars)
		c.mu.Unlock()
	}
}

// exportMissed tells c, a kernel just started and registered, the
// sandbox's envVars if an ExportEnv came after exports, the count when
// its start began (its process may have the environment of before). c.mu
// is held, so no cell runs in c before.
func (s *Service) exportMissed(ctx context.Context, c *codeContext, exports int) {
	s.mu.Lock()
	vars, missed := s.exported, s.exports != exports
	s.mu.Unlock()
	if missed {
		s.export(ctx, c, vars)
	}
}

// export runs the code that sets vars in c's kernel for good; c.mu is held.
func (s *Service) export(ctx context.Context, c *codeContext, vars map[string]string) {
	if c.kernel == nil || c.lang.exportEnv == nil {
		return
	}
	if err := c.kernel.ExecuteSilent(ctx, c.lang.exportEnv(vars)); err != nil {
		s.log.Warn("sandbox envs for a running kernel", "language", c.Language, "err", err)
	}
}
