package interpreter

import (
	"context"
	"net/http"
	"time"
)

// Warm snapshots (the daemon's sandbox/warm.go): the daemon saves one
// sandbox of a template once it is ready, and starts the template's
// others as copies of it. Before the save it asks the agent to settle
// (agentproto.SettlePath: answered once the kernel it prestarts has
// imported what it imports); in each copy it asks it to reseed
// (agentproto.ReseedPath). A copy has the memory of the saved sandbox, so
// the random generators its kernels seeded from the host's randomness at
// their start would give every copy the same numbers: Python's random and
// numpy's global generator are seeded afresh. What asks the host each
// time (os.urandom, secrets, uuid4) needs nothing.

// reseedCode reseeds the generators a kernel has imported, and defines
// no name of its own in the user's namespace.
const reseedCode = `(lambda m: [m[g].seed() for g in ("random", "numpy.random") if g in m])(__import__("sys").modules)`

// Prestart starts the default kernel of language in the background, for a
// template that serves code: a sandbox claimed from the pool then answers
// its first cell at once. SettlePath answers once it is ready. It is
// called before the agent serves.
func (s *Service) Prestart(language string) {
	settled := make(chan struct{})
	s.settled = settled
	go func() {
		defer close(settled)
		if err := s.prestart(language); err != nil {
			s.log.Warn("prestart kernel", "language", language, "err", err)
		}
	}()
}

// prestart starts the default kernel of language and has it import what
// the first chart needs (matplotlib builds its font cache then).
func (s *Service) prestart(language string) error {
	c, err := s.defaultContext(context.Background(), language)
	if err != nil {
		return err
	}
	if language != "python" {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return c.kernel.ExecuteSilent(ctx, "try:\n import matplotlib.pyplot, pandas\nexcept ImportError:\n pass\n")
}

// PrestartLate names the languages whose kernels start when the daemon
// puts the sandbox in a pool (WarmLatePath), after any warm snapshot of
// it was saved: see agentproto.PrestartLateEnv. It is called before the
// agent serves.
func (s *Service) PrestartLate(languages []string) { s.late = languages }

// warmLate starts the late kernels in the background, one after the
// other and once (a sandbox enters a pool once), and answers at once. A
// cell of one of them that comes first waits for its start rather than
// start a second kernel (defaultContext); a claim does not (ExportEnv).
func (s *Service) warmLate(w http.ResponseWriter, r *http.Request) {
	s.lateOnce.Do(func() {
		go func() {
			for _, language := range s.late {
				if err := s.prestart(language); err != nil {
					s.log.Warn("prestart kernel", "language", language, "err", err)
				}
			}
		}()
	})
	w.WriteHeader(http.StatusNoContent)
}

// settle answers once the prestarted kernel, if any, is ready.
func (s *Service) settle(w http.ResponseWriter, r *http.Request) {
	select {
	case <-s.settled:
		w.WriteHeader(http.StatusNoContent)
	case <-r.Context().Done():
	}
}

// reseed seeds every Python kernel's generators afresh.
func (s *Service) reseed(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	s.mu.Lock()
	var contexts []*codeContext
	for _, c := range s.contexts {
		if c.Language == "python" {
			contexts = append(contexts, c)
		}
	}
	s.mu.Unlock()
	for _, c := range contexts {
		c.mu.Lock()
		var err error
		if c.kernel != nil {
			err = c.kernel.ExecuteSilent(ctx, reseedCode)
		}
		c.mu.Unlock()
		if err != nil {
			http.Error(w, "reseed kernel: "+err.Error(), http.StatusInternalServerError)
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}
