package interpreter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agent/jupyter"
	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// interruptGrace is how long a kernel has to come back after an interrupt
// before it is replaced.
const interruptGrace = 5 * time.Second

// keepaliveInterval is how often a long cell's stream gets a keepalive
// line, so that proxies keep it open.
const keepaliveInterval = 5 * time.Second

// execute runs a request's code in its context and streams the lines of
// what it produced, the end of the execution last.
func (s *Service) execute(w http.ResponseWriter, r *http.Request) {
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
		s.mu.Lock()
		c = s.contexts[req.ContextID]
		s.mu.Unlock()
		if c == nil {
			jsonError(w, http.StatusNotFound, "context %q not found", req.ContextID)
			return
		}
	} else {
		var err error
		if c, err = s.defaultContext(r.Context(), req.Language); err != nil {
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
	out := newLines(w)
	c.mu.Lock()
	defer c.mu.Unlock()
	s.run(r.Context(), c, &req, out)
}

// lines writes an execution's NDJSON lines, each flushed at once.
type lines struct {
	mu       sync.Mutex
	w        http.ResponseWriter
	fl       http.Flusher
	errored  bool
	interval time.Duration // of keepalives
	// replyErr is the reply's error when it named none: written at the
	// end, unless the kernel publishes the error itself meanwhile.
	replyErr map[string]any
}

// newLines answers 200 with the stream's headers, at once.
func newLines(w http.ResponseWriter) *lines {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	l := &lines{w: w, interval: keepaliveInterval}
	l.fl, _ = w.(http.Flusher)
	if l.fl != nil {
		l.fl.Flush()
	}
	return l
}

// write writes one line; only an execution's first error is written.
func (l *lines) write(v map[string]any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if v["type"] == "error" {
		if l.errored {
			return
		}
		l.errored = true
	}
	l.w.Write(append(asciiJSON(v), '\n'))
	if l.fl != nil {
		l.fl.Flush()
	}
}

// end writes the execution's end, after the reply's error if the kernel
// published none.
func (l *lines) end() {
	l.mu.Lock()
	v := l.replyErr
	l.mu.Unlock()
	if v != nil {
		l.write(v)
	}
	l.write(map[string]any{"type": "end_of_execution"})
}

// fail writes an error of name with value, and the execution's end.
func (l *lines) fail(name, value string) {
	l.write(map[string]any{"type": "error", "name": name, "value": value, "traceback": ""})
	l.write(map[string]any{"type": "end_of_execution"})
}

// keepalive writes a keepalive line every interval until stop is closed.
func (l *lines) keepalive(stop <-chan struct{}) {
	t := time.NewTicker(l.interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			l.write(map[string]any{"type": "keepalive"})
		case <-stop:
			return
		}
	}
}

// output writes what the kernel produced: its outputs, and the errors
// its reply reports that it did not publish (or an abort).
func (l *lines) output(o jupyter.Output) {
	if o.Type != "execute_reply" {
		if v := outputLine(o); v != nil {
			l.write(v)
		}
		return
	}
	var rep struct {
		Status    string   `json:"status"`
		Ename     string   `json:"ename"`
		Evalue    string   `json:"evalue"`
		Traceback []string `json:"traceback"`
	}
	json.Unmarshal(o.Content, &rep)
	switch rep.Status {
	case "error":
		v := map[string]any{"type": "error", "name": rep.Ename, "value": rep.Evalue, "traceback": joinTraceback(rep.Traceback)}
		if rep.Ename == "" && rep.Evalue == "" {
			// The reply (shell socket) and the error the kernel publishes
			// (iopub: its name, message and stack) may arrive in either
			// order; tslab's reply names nothing.
			l.mu.Lock()
			l.replyErr = v
			l.mu.Unlock()
			return
		}
		l.write(v)
	case "aborted", "abort":
		l.write(map[string]any{"type": "error", "name": "ExecutionAborted", "value": "the execution was aborted", "traceback": ""})
	}
}

// run runs req's code in c, with req's envs for its length, and writes
// its lines to out. Caller holds c.mu.
func (s *Service) run(ctx context.Context, c *codeContext, req *agentproto.ExecuteRequest, out *lines) {
	if c.lost != "" {
		out.write(map[string]any{"type": "stderr", "text": c.lost + "\n", "timestamp": now()})
		c.lost = ""
	}
	if c.kernel == nil {
		if err := s.startKernel(ctx, c); err != nil {
			out.fail("KernelError", err.Error())
			return
		}
	}
	stopKA := make(chan struct{})
	defer close(stopKA)
	go out.keepalive(stopKA)

	if len(req.EnvVars) > 0 {
		if err := c.kernel.ExecuteSilent(ctx, c.lang.setEnv(req.EnvVars)); err != nil {
			if ce := (*jupyter.CodeError)(nil); errors.As(err, &ce) {
				out.fail("EnvError", "the envs could not be set: "+ce.Error())
				return
			}
			s.recover(c, err)
			return
		}
		defer func() {
			rctx, cancel := context.WithTimeout(context.Background(), s.grace)
			defer cancel()
			if c.kernel != nil {
				c.kernel.ExecuteSilent(rctx, c.lang.restoreEnv)
			}
		}()
	}
	err := c.kernel.Execute(ctx, req.Code, out.output)
	switch {
	case err == nil:
		out.end()
	case errors.Is(err, jupyter.ErrKernelDied):
		c.kernel.Kill()
		c.kernel = nil
		out.fail("KernelDied", "the kernel died (did it run out of memory?); its state is lost, and the next execution starts a new kernel")
	default:
		// The client went away or timed out: stop the cell.
		s.recover(c, err)
	}
}

// recover stops what c's kernel is running: an interrupt, and if the
// kernel does not come back, a new kernel (its state is then lost, which
// the next execution reports). Caller holds c.mu.
func (s *Service) recover(c *codeContext, cause error) {
	if c.kernel == nil {
		return
	}
	c.kernel.Interrupt()
	if c.kernel.WaitIdle(s.grace) {
		return
	}
	c.kernel.Kill()
	c.kernel = nil
	c.lost = fmt.Sprintf("The previous execution was stopped (%v) and its kernel did not answer an interrupt: it was restarted, and its state is lost.", cause)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s.startKernel(ctx, c) // if this fails, the next execution retries
}
