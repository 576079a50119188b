package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agent/jupyter"
	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// The code interpreter: E2B's port 49999 (agentproto.InterpreterPort).
// Each context is one Jupyter kernel; an execution streams what the
// kernel produced as NDJSON lines (agentproto.ExecuteLine).

// kernelEnv is added to every kernel's environment: figures are sent as
// images (Jupyter's inline backend), not written by the Agg backend the
// sandbox's plain commands get.
var kernelEnv = map[string]string{"MPLBACKEND": "module://matplotlib_inline.backend_inline"}

type interpreter struct {
	a        *Agent
	mu       sync.Mutex
	contexts map[string]*codeContext
	defaults map[string]string // language → its default context
	// starting serializes the creation of default contexts: the first
	// cell of a sandbox claimed while its kernel is being prestarted waits
	// for that kernel instead of starting a second one beside it.
	starting sync.Mutex
	// settled is closed once the kernel the agent prestarts is ready
	// (clone.go); set before the agent serves.
	settled chan struct{}
}

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

func newInterpreter(a *Agent) *interpreter {
	settled := make(chan struct{})
	close(settled) // no kernel is prestarted unless Main says so
	return &interpreter{a: a, contexts: map[string]*codeContext{}, defaults: map[string]string{}, settled: settled}
}

func (in *interpreter) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("OK")) })
	mux.HandleFunc("POST "+agentproto.ExecutePath, in.execute)
	mux.HandleFunc("POST /contexts", in.createContext)
	mux.HandleFunc("GET /contexts", in.listContexts)
	mux.HandleFunc("DELETE /contexts/{id}", in.deleteContext)
	mux.HandleFunc("POST /contexts/{id}/restart", in.restartContext)
	return mux
}

func jsonError(w http.ResponseWriter, status int, format string, args ...any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"code": status, "message": fmt.Sprintf(format, args...)})
}

// startKernel starts c's kernel. Caller holds c.mu.
func (in *interpreter) startKernel(ctx context.Context, c *codeContext) error {
	spec, err := jupyter.FindSpec(c.lang.kernels...)
	if err != nil {
		return fmt.Errorf("no Jupyter kernel for %s is installed", c.lang.name)
	}
	k, err := jupyter.Start(ctx, spec, jupyter.Options{
		Cwd: c.Cwd, Env: in.a.env.For(kernelEnv),
		// Kernels run as the sandbox user, whoever the agent is.
		Cred: in.a.users.Credential(in.a.users.User()),
		Args: c.lang.args, Files: c.lang.files, LateOutput: c.lang.late,
	})
	if err != nil {
		return err
	}
	c.kernel = k
	return nil
}

// newContext creates a context and starts its kernel.
func (in *interpreter) newContext(ctx context.Context, language, cwd string) (*codeContext, error) {
	lang, err := languageOf(language)
	if err != nil {
		return nil, err
	}
	if cwd == "" {
		cwd = in.a.users.Home
	}
	c := &codeContext{ID: newID(), Language: lang.name, lang: lang, Cwd: in.a.users.User().Resolve(cwd), created: time.Now()}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := in.startKernel(ctx, c); err != nil {
		return nil, err
	}
	in.mu.Lock()
	in.contexts[c.ID] = c
	in.mu.Unlock()
	return c, nil
}

// defaultContext returns the language's default context, creating it.
func (in *interpreter) defaultContext(ctx context.Context, name string) (*codeContext, error) {
	lang, err := languageOf(name)
	if err != nil {
		return nil, err
	}
	language := lang.name
	lookup := func() *codeContext {
		in.mu.Lock()
		defer in.mu.Unlock()
		if id, ok := in.defaults[language]; ok {
			return in.contexts[id]
		}
		return nil
	}
	if c := lookup(); c != nil {
		return c, nil
	}
	in.starting.Lock()
	defer in.starting.Unlock()
	if c := lookup(); c != nil { // started while this one waited
		return c, nil
	}
	c, err := in.newContext(ctx, language, "")
	if err != nil && ctx.Err() == nil {
		// One more try: a start can fail for passing reasons, such as a
		// port picked free being taken before the kernel bound it.
		c, err = in.newContext(ctx, language, "")
	}
	if err != nil {
		return nil, err
	}
	in.mu.Lock()
	in.defaults[language] = c.ID
	in.mu.Unlock()
	return c, nil
}

// Prestart starts the default kernel of language and has it import what
// the first chart needs (matplotlib builds its font cache then), so that a
// sandbox claimed from the pool answers its first cell at once.
func (in *interpreter) Prestart(language string) error {
	c, err := in.defaultContext(context.Background(), language)
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

// exportEnv gives every running kernel vars, the sandbox's envVars:
// kernels started from now on find them in the agent's environment, but
// one started before them (a pool's prestarted kernel) must be told.
func (in *interpreter) exportEnv(ctx context.Context, vars map[string]string) {
	// A default kernel still starting (the pool's, claimed early) was
	// given the environment of before: wait for it to be a context.
	in.starting.Lock()
	defer in.starting.Unlock()
	in.mu.Lock()
	list := slices.Collect(maps.Values(in.contexts))
	in.mu.Unlock()
	for _, c := range list {
		c.mu.Lock()
		if c.kernel != nil && c.lang.exportEnv != nil {
			if err := c.kernel.ExecuteSilent(ctx, c.lang.exportEnv(vars)); err != nil {
				in.a.log.Warn("sandbox envs for a running kernel", "language", c.Language, "err", err)
			}
		}
		c.mu.Unlock()
	}
}

func (c *codeContext) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kernel != nil {
		c.kernel.Kill()
		c.kernel = nil
	}
}

// interruptGrace is how long a kernel has to come back after an interrupt
// before it is replaced.
const interruptGrace = 5 * time.Second

func (in *interpreter) execute(w http.ResponseWriter, r *http.Request) {
	var req agentproto.ExecuteRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, rpc.MaxMessage)).Decode(&req); err != nil {
		jsonError(w, http.StatusBadRequest, "invalid request: %v", err)
		return
	}
	if req.ContextID != "" && req.Language != "" {
		jsonError(w, http.StatusBadRequest, "give context_id or language, not both")
		return
	}
	var c *codeContext
	if req.ContextID != "" {
		in.mu.Lock()
		c = in.contexts[req.ContextID]
		in.mu.Unlock()
		if c == nil {
			jsonError(w, http.StatusNotFound, "context %q not found", req.ContextID)
			return
		}
	} else {
		var err error
		if c, err = in.defaultContext(r.Context(), req.Language); err != nil {
			// In the stream, as the execution's error: the SDKs show an
			// HTTP error's status but not its message.
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.Write(append(asciiJSON(map[string]any{"type": "error", "name": "KernelError", "value": err.Error(), "traceback": ""}), '\n'))
			w.Write(append(asciiJSON(map[string]any{"type": "end_of_execution"}), '\n'))
			return
		}
	}
	if len(req.EnvVars) > 0 && c.lang.setEnv == nil {
		jsonError(w, http.StatusBadRequest, "env_vars are not supported for %s contexts", c.Language)
		return
	}
	// Headers first: the SDK's request timer runs until they arrive, and
	// this request may now wait for an earlier execution of the context.
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	if fl != nil {
		fl.Flush()
	}
	var wmu sync.Mutex
	errored := false
	line := func(v map[string]any) {
		wmu.Lock()
		defer wmu.Unlock()
		if v["type"] == "error" { // only an execution's first error counts
			if errored {
				return
			}
			errored = true
		}
		w.Write(append(asciiJSON(v), '\n'))
		if fl != nil {
			fl.Flush()
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lost != "" {
		line(map[string]any{"type": "stderr", "text": c.lost + "\n", "timestamp": now()})
		c.lost = ""
	}
	if c.kernel == nil {
		if err := in.startKernel(r.Context(), c); err != nil {
			line(map[string]any{"type": "error", "name": "KernelError", "value": err.Error(), "traceback": ""})
			line(map[string]any{"type": "end_of_execution"})
			return
		}
	}
	// Long cells get keepalive lines, so that proxies keep the stream open.
	stopKA := make(chan struct{})
	defer close(stopKA)
	go func() {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				line(map[string]any{"type": "keepalive"})
			case <-stopKA:
				return
			}
		}
	}()

	ctx := r.Context()
	if len(req.EnvVars) > 0 {
		if err := c.kernel.ExecuteSilent(ctx, c.lang.setEnv(req.EnvVars)); err != nil {
			if ce := (*jupyter.CodeError)(nil); errors.As(err, &ce) {
				line(map[string]any{"type": "error", "name": "EnvError", "value": "the envs could not be set: " + ce.Error(), "traceback": ""})
				line(map[string]any{"type": "end_of_execution"})
				return
			}
			in.recover(c, err)
			return
		}
		defer func() {
			rctx, cancel := context.WithTimeout(context.Background(), interruptGrace)
			defer cancel()
			if c.kernel != nil {
				c.kernel.ExecuteSilent(rctx, c.lang.restoreEnv)
			}
		}()
	}
	err := c.kernel.Execute(ctx, req.Code, func(o jupyter.Output) {
		if o.Type == "execute_reply" {
			// An error the kernel did not publish on iopub, or an abort.
			var rep struct {
				Status    string   `json:"status"`
				Ename     string   `json:"ename"`
				Evalue    string   `json:"evalue"`
				Traceback []string `json:"traceback"`
			}
			json.Unmarshal(o.Content, &rep)
			switch rep.Status {
			case "error":
				line(map[string]any{"type": "error", "name": rep.Ename, "value": rep.Evalue, "traceback": joinTraceback(rep.Traceback)})
			case "aborted", "abort":
				line(map[string]any{"type": "error", "name": "ExecutionAborted", "value": "the execution was aborted", "traceback": ""})
			}
			return
		}
		if v := outputLine(o); v != nil {
			line(v)
		}
	})
	switch {
	case err == nil:
		line(map[string]any{"type": "end_of_execution"})
	case errors.Is(err, jupyter.ErrKernelDied):
		c.kernel.Kill()
		c.kernel = nil
		line(map[string]any{"type": "error", "name": "KernelDied",
			"value":     "the kernel died (did it run out of memory?); its state is lost, and the next execution starts a new kernel",
			"traceback": ""})
		line(map[string]any{"type": "end_of_execution"})
	default:
		// The client went away or timed out: stop the cell.
		in.recover(c, err)
	}
}

// recover stops what c's kernel is running: an interrupt, and if the
// kernel does not come back, a new kernel (its state is then lost, which
// the next execution reports). Caller holds c.mu.
func (in *interpreter) recover(c *codeContext, cause error) {
	if c.kernel == nil {
		return
	}
	c.kernel.Interrupt()
	if c.kernel.WaitIdle(interruptGrace) {
		return
	}
	c.kernel.Kill()
	c.kernel = nil
	c.lost = fmt.Sprintf("The previous execution was stopped (%v) and its kernel did not answer an interrupt: it was restarted, and its state is lost.", cause)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	in.startKernel(ctx, c) // if this fails, the next execution retries
}

func now() string { return time.Now().UTC().Format(time.RFC3339Nano) }

// asciiJSON encodes v with every non-ASCII character escaped: the SDKs
// decode each network chunk on its own, so a multi-byte character split
// between two chunks would be corrupted.
func asciiJSON(v any) []byte {
	data, _ := json.Marshal(v)
	out := make([]byte, 0, len(data))
	for _, r := range string(data) {
		switch {
		case r < 0x80:
			out = append(out, byte(r))
		case r > 0xffff:
			r -= 0x10000
			out = fmt.Appendf(out, "\\u%04x\\u%04x", 0xd800+(r>>10), 0xdc00+(r&0x3ff))
		default:
			out = fmt.Appendf(out, "\\u%04x", r)
		}
	}
	return out
}

// joinTraceback makes one text of a kernel's traceback lines: IPython's
// and Deno's end without a newline, which E2B's server joins end to end
// ("Traceback (most recent call last)Cell In [3]"); here each ends its
// line.
func joinTraceback(lines []string) string {
	var b strings.Builder
	for i, l := range lines {
		b.WriteString(l)
		if i < len(lines)-1 && !strings.HasSuffix(l, "\n") {
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// mimeFields maps Jupyter MIME types to the result fields of E2B's SDKs.
var mimeFields = map[string]string{
	"text/plain": "text", "text/html": "html", "text/markdown": "markdown", "image/svg+xml": "svg",
	"image/png": "png", "image/jpeg": "jpeg", "application/pdf": "pdf", "text/latex": "latex",
	"application/json": "json", "application/javascript": "javascript",
	"e2b/data": "data", "e2b/chart": "chart",
}

// outputLine turns one kernel output into an NDJSON line (nil: none).
func outputLine(o jupyter.Output) map[string]any {
	switch o.Type {
	case "stream":
		var c struct{ Name, Text string }
		json.Unmarshal(o.Content, &c)
		typ := "stdout"
		if c.Name == "stderr" {
			typ = "stderr"
		}
		return map[string]any{"type": typ, "text": c.Text, "timestamp": now()}
	case "execute_result", "display_data":
		var c struct {
			Data map[string]json.RawMessage `json:"data"`
		}
		json.Unmarshal(o.Content, &c)
		v := map[string]any{"type": "result", "is_main_result": o.Type == "execute_result"}
		extra := map[string]any{}
		for mime, raw := range c.Data {
			var val any
			json.Unmarshal(raw, &val)
			// Text-like values may arrive as lists of lines.
			if parts, ok := val.([]any); ok && mime != "application/json" {
				var sb strings.Builder
				for _, p := range parts {
					fmt.Fprint(&sb, p)
				}
				val = sb.String()
			}
			switch mime {
			case "text/plain":
				// As E2B's server does: 'bar' reads as bar.
				if t, ok := val.(string); ok && len(t) >= 2 && (t[0] == '\'' || t[0] == '"') && t[len(t)-1] == t[0] {
					val = t[1 : len(t)-1]
				}
			case "image/png", "image/jpeg", "application/pdf":
				// Some encoders end base64 with a newline.
				if t, ok := val.(string); ok {
					val = strings.TrimSpace(t)
				}
			}
			if f, ok := mimeFields[mime]; ok {
				v[f] = val
			} else {
				extra[mime] = val
			}
		}
		v["extra"] = extra
		return v
	case "error":
		var c struct {
			Ename     string   `json:"ename"`
			Evalue    string   `json:"evalue"`
			Traceback []string `json:"traceback"`
		}
		json.Unmarshal(o.Content, &c)
		return map[string]any{"type": "error", "name": c.Ename, "value": c.Evalue, "traceback": joinTraceback(c.Traceback)}
	case "execute_input":
		var c struct {
			Count int `json:"execution_count"`
		}
		json.Unmarshal(o.Content, &c)
		return map[string]any{"type": "number_of_executions", "execution_count": c.Count}
	}
	return nil
}

func (in *interpreter) createContext(w http.ResponseWriter, r *http.Request) {
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
	c, err := in.newContext(r.Context(), req.Language, req.Cwd)
	if err != nil {
		jsonError(w, http.StatusBadRequest, "%v", err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(c)
}

func (in *interpreter) listContexts(w http.ResponseWriter, r *http.Request) {
	in.mu.Lock()
	list := make([]*codeContext, 0, len(in.contexts))
	for _, c := range in.contexts {
		list = append(list, c)
	}
	in.mu.Unlock()
	sort.Slice(list, func(i, j int) bool { return list[i].created.Before(list[j].created) })
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(list)
}

func (in *interpreter) take(id string, remove bool) *codeContext {
	in.mu.Lock()
	defer in.mu.Unlock()
	c := in.contexts[id]
	if c != nil && remove {
		delete(in.contexts, id)
		for lang, d := range in.defaults {
			if d == id {
				delete(in.defaults, lang)
			}
		}
	}
	return c
}

func (in *interpreter) deleteContext(w http.ResponseWriter, r *http.Request) {
	c := in.take(r.PathValue("id"), true)
	if c == nil {
		jsonError(w, http.StatusNotFound, "context %q not found", r.PathValue("id"))
		return
	}
	c.close()
	w.WriteHeader(http.StatusNoContent)
}

func (in *interpreter) restartContext(w http.ResponseWriter, r *http.Request) {
	c := in.take(r.PathValue("id"), false)
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
	if err := in.startKernel(r.Context(), c); err != nil {
		jsonError(w, http.StatusInternalServerError, "restart: %v", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// newID is a random id for a context.
func newID() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
