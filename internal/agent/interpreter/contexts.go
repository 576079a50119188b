package interpreter

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agent/jupyter"
)

type codeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
	lang     *language
	created  time.Time

	mu     sync.Mutex // one execution at a time
	kernel *jupyter.Kernel
	// lost is set when the kernel had to be replaced; the next execution
	// reports it, so the caller learns its variables are gone.
	lost string
}

// startKernel starts c's kernel. Caller holds c.mu.
func (s *Service) startKernel(ctx context.Context, c *codeContext) error {
	spec, err := jupyter.FindSpec(c.lang.kernels...)
	if err != nil {
		return fmt.Errorf("no Jupyter kernel for %s is installed", c.lang.name)
	}
	if nodeKernel(spec.Argv) {
		c.lang = onNode(c.lang)
	}
	k, err := jupyter.Start(ctx, spec, jupyter.Options{
		Cwd: c.Cwd, Env: s.env.For(kernelEnv),
		// Kernels run as the sandbox user, whoever the agent is.
		Cred: s.users.Credential(s.users.User()),
		Args: c.lang.args, Files: c.lang.files, LateOutput: c.lang.late,
	})
	if err != nil {
		return err
	}
	c.kernel = k
	return nil
}

// newContext creates a context and starts its kernel.
func (s *Service) newContext(ctx context.Context, language, cwd string) (*codeContext, error) {
	lang, err := languageOf(language)
	if err != nil {
		return nil, err
	}
	if cwd == "" {
		cwd = s.users.Home
	}
	c := &codeContext{ID: newID(), Language: lang.name, lang: lang, Cwd: s.users.User().Resolve(cwd), created: time.Now()}
	c.mu.Lock()
	defer c.mu.Unlock()
	s.mu.Lock()
	exports := s.exports // before the kernel takes the agent's environment
	s.mu.Unlock()
	if err := s.startKernel(ctx, c); err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.contexts[c.ID] = c
	s.mu.Unlock()
	s.exportMissed(ctx, c, exports)
	return c, nil
}

// defaultContext returns the language's default context, creating it.
func (s *Service) defaultContext(ctx context.Context, name string) (*codeContext, error) {
	lang, err := languageOf(name)
	if err != nil {
		return nil, err
	}
	language := lang.name
	lookup := func() *codeContext {
		s.mu.Lock()
		defer s.mu.Unlock()
		if id, ok := s.defaults[language]; ok {
			return s.contexts[id]
		}
		return nil
	}
	if c := lookup(); c != nil {
		return c, nil
	}
	s.starting.Lock()
	defer s.starting.Unlock()
	if c := lookup(); c != nil { // started while this one waited
		return c, nil
	}
	c, err := s.newContext(ctx, language, "")
	if err != nil && ctx.Err() == nil {
		// One more try: a start can fail for passing reasons, such as a
		// port picked free being taken before the kernel bound it.
		c, err = s.newContext(ctx, language, "")
	}
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.defaults[language] = c.ID
	s.mu.Unlock()
	return c, nil
}

func (c *codeContext) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kernel != nil {
		c.kernel.Kill()
		c.kernel = nil
	}
}

func (s *Service) createContext(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Language string `json:"language"`
		Cwd      string `json:"cwd"`
	}
	if r.ContentLength != 0 {
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
			jsonError(w, http.StatusBadRequest, "invalid request: %v", err)
			return
		}
	}
	c, err := s.newContext(r.Context(), req.Language, req.Cwd)
	if err != nil {
		jsonError(w, http.StatusBadRequest, "%v", err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(c)
}

func (s *Service) listContexts(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	list := make([]*codeContext, 0, len(s.contexts))
	for _, c := range s.contexts {
		list = append(list, c)
	}
	s.mu.Unlock()
	sort.Slice(list, func(i, j int) bool { return list[i].created.Before(list[j].created) })
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(list)
}

func (s *Service) take(id string, remove bool) *codeContext {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.contexts[id]
	if c != nil && remove {
		delete(s.contexts, id)
		for lang, d := range s.defaults {
			if d == id {
				delete(s.defaults, lang)
			}
		}
	}
	return c
}

func (s *Service) deleteContext(w http.ResponseWriter, r *http.Request) {
	c := s.take(r.PathValue("id"), true)
	if c == nil {
		jsonError(w, http.StatusNotFound, "context %q not found", r.PathValue("id"))
		return
	}
	c.close()
	w.WriteHeader(http.StatusNoContent)
}

func (s *Service) restartContext(w http.ResponseWriter, r *http.Request) {
	c := s.take(r.PathValue("id"), false)
	if c == nil {
		jsonError(w, http.StatusNotFound, "context %q not found", r.PathValue("id"))
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kernel != nil {
		c.kernel.Kill()
		c.kernel = nil
	}
	if err := s.startKernel(r.Context(), c); err != nil {
		jsonError(w, http.StatusInternalServerError, "restart: %v", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
