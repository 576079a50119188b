package agent

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

// settle answers once the prestarted kernel, if any, is ready.
func (a *Agent) settle(w http.ResponseWriter, r *http.Request) {
	select {
	case <-a.interp.settled:
		w.WriteHeader(http.StatusNoContent)
	case <-r.Context().Done():
	}
}

// reseed seeds every Python kernel's generators afresh.
func (a *Agent) reseed(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	a.interp.mu.Lock()
	var contexts []*codeContext
	for _, c := range a.interp.contexts {
		if c.Language == "python" {
			contexts = append(contexts, c)
		}
	}
	a.interp.mu.Unlock()
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
