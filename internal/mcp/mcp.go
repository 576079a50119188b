// Package mcp serves Airlock's sandboxes as Model Context Protocol tools:
// stateful code execution with charts returned as images, commands and
// files, each MCP session with a sandbox of its own.
package mcp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// Limits of what a tool returns to the model.
const (
	maxText     = 64 << 10     // per text block
	maxFile     = 1 << 20      // text read_file returns
	maxImage    = 8 << 20      // an image read_file returns
	maxSeconds  = 24 * 60 * 60 // the longest timeout a tool accepts
	maxProgress = 2 << 10      // output in one progress notification

	progressEvery = 200 * time.Millisecond
	codeTemplate  = "code-interpreter-v1"
)

// Server binds MCP sessions to sandboxes of a Manager.
type Server struct {
	m   *sandbox.Manager
	log *slog.Logger
	ttl time.Duration

	mu       sync.Mutex
	sessions map[string]*session // by MCP session id; stdio's is ""
}

// session is one MCP session's hold on its sandbox. mu is held across
// lookup and creation, so concurrent calls of a session share one
// sandbox, and a session that ended cannot gain one afterwards.
type session struct {
	mu        sync.Mutex
	sandboxID string
	// What create_sandbox asked for, kept for a sandbox that replaces one
	// that died: its template ("": the code interpreter), limits and idle
	// timeout (0: the server's).
	template string
	limits   sandbox.Limits
	volumes  []sandbox.VolumeMount
	ttl      time.Duration
	ended    bool
}

// New returns the MCP server over m. ttl is how long a session's sandbox
// lives without a tool call.
func New(m *sandbox.Manager, ttl time.Duration, log *slog.Logger) *sdk.Server {
	s := &Server{m: m, log: log, ttl: ttl, sessions: map[string]*session{}}
	srv := sdk.NewServer(&sdk.Implementation{Name: "airlock", Version: "0.1"}, &sdk.ServerOptions{
		Instructions: "Airlock runs code in isolated, ephemeral sandboxes. run_code keeps state between calls " +
			"(a Jupyter kernel) and returns charts as images. Each session gets its own sandbox on first use.",
	})
	sdk.AddTool(srv, &sdk.Tool{Name: "run_code", Description: "Run code in the session's sandbox, in a stateful Jupyter kernel: " +
		"variables persist between calls. Returns printed output, the value of the last expression, charts (matplotlib) as " +
		"images, tables as HTML, and errors with their traceback."}, s.runCode)
	sdk.AddTool(srv, &sdk.Tool{Name: "run_command", Description: "Run a shell command (bash) in the session's sandbox as an " +
		"unprivileged user in /home/user. Returns stdout, stderr and the exit code; with background, returns the pid at once."}, s.runCommand)
	sdk.AddTool(srv, &sdk.Tool{Name: "read_file", Description: "Read a file from the session's sandbox: text as text, images (PNG, JPEG, GIF, WebP) as images you can see; other binary files are only described."}, s.readFile)
	sdk.AddTool(srv, &sdk.Tool{Name: "write_file", Description: "Write a text file in the session's sandbox, creating directories as needed."}, s.writeFile)
	sdk.AddTool(srv, &sdk.Tool{Name: "list_files", Description: "List a directory of the session's sandbox."}, s.listFiles)
	sdk.AddTool(srv, &sdk.Tool{Name: "create_sandbox", Description: "Start a fresh sandbox for this session (the old one is " +
		"killed). Only needed to change the template, the timeout or the limits (memory, CPUs, processes, disk: " +
		"each at most the template's); tools create one on first use."}, s.createSandbox)
	sdk.AddTool(srv, &sdk.Tool{Name: "kill_sandbox", Description: "Kill the session's sandbox; everything in it is lost."}, s.killSandbox)
	sdk.AddTool(srv, &sdk.Tool{Name: "list_sandboxes", Description: "Show the session's sandbox: its id, template, " +
		"when it ends and its limits. A session sees and controls only its own."}, s.listSandboxes)
	return srv
}

// session returns the state of req's session. The first call of a
// session also arranges for its sandbox to end with it: here, not in an
// "initialized" handler, since a client may call tools without sending
// that notification.
func (s *Server) session(req *sdk.CallToolRequest) *session {
	id := ""
	if req.Session != nil {
		id = req.Session.ID()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, ok := s.sessions[id]
	if !ok {
		ss = &session{}
		s.sessions[id] = ss
		if req.Session != nil {
			go func() {
				req.Session.Wait()
				s.endSession(id, ss)
			}()
		}
	}
	return ss
}

// sandboxFor returns the session's sandbox, creating it on first use.
// Each use restarts its time to live: it ends when the agent has been
// idle that long, not in the middle of its work.
func (s *Server) sandboxFor(ctx context.Context, req *sdk.CallToolRequest) (*sandbox.Sandbox, error) {
	ss := s.session(req)
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.ended {
		return nil, agentError{"the session has ended"}
	}
	if sb, err := s.m.Get(ss.sandboxID); err == nil {
		// Paused through the E2B API by the key's holder: a call resumes it.
		if sb.Paused() {
			if err := s.m.Resume(ctx, sb.ID, cmp.Or(ss.ttl, s.ttl)); err != nil {
				return nil, err
			}
		} else {
			s.m.SetTTL(sb.ID, cmp.Or(ss.ttl, s.ttl))
		}
		return sb, nil
	}
	sb, err := s.create(ctx, cmp.Or(ss.template, codeTemplate), cmp.Or(ss.ttl, s.ttl), ss.limits, ss.volumes)
	if err != nil {
		return nil, err
	}
	ss.sandboxID = sb.ID
	return sb, nil
}

func (s *Server) create(ctx context.Context, template string, ttl time.Duration, limits sandbox.Limits, volumes []sandbox.VolumeMount) (*sandbox.Sandbox, error) {
	return s.m.Create(ctx, sandbox.CreateRequest{TemplateID: template, TTL: ttl, ClientID: "mcp",
		Metadata: map[string]string{"mcp-session": "true"}, Limits: limits, Volumes: volumes})
}

func (s *Server) endSession(id string, ss *session) {
	s.mu.Lock()
	delete(s.sessions, id)
	s.mu.Unlock()
	ss.mu.Lock() // waits for a creation under way: its sandbox goes too
	ss.ended = true
	sandboxID := ss.sandboxID
	ss.mu.Unlock()
	if sandboxID != "" && s.m.Kill(sandboxID) == nil {
		s.log.Info("mcp session ended", "sandbox", sandboxID)
	}
}

// failure is the tool result for err. Messages that describe the
// sandbox or the request go to the model; the daemon's own errors can
// name host paths, so they are logged and summarized.
// sandboxFailure is failure for a call into sb, unless sb died under it:
// then that is what the model needs to know.
func (s *Server) sandboxFailure(what string, sb *sandbox.Sandbox, err error) *sdk.CallToolResult {
	var ae agentError
	if !errors.As(err, &ae) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		// The call can fail a moment before the sandbox is seen to end.
		select {
		case <-sb.Done():
			return toolError("%s: the sandbox ended under it (it was killed: going over its memory limit is the usual cause) "+
				"and everything in it is lost; the next call starts a new one", what)
		case <-time.After(time.Second):
		}
	}
	return s.failure(what, err)
}

func (s *Server) failure(what string, err error) *sdk.CallToolResult {
	var ae agentError
	switch {
	case errors.As(err, &ae), errors.Is(err, sandbox.ErrUnknownTemplate),
		errors.Is(err, sandbox.ErrInvalid), errors.Is(err, sandbox.ErrTooMany):
		return toolError("%s: %v", what, err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return toolError("%s: cancelled", what)
	}
	s.log.Error("mcp tool", "tool", what, "err", err)
	return toolError("%s: internal error (the server log has the details)", what)
}

// toolError is a tool result that reports a failure to the model (not a
// protocol error).
func toolError(format string, args ...any) *sdk.CallToolResult {
	return &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: fmt.Sprintf(format, args...)}}}
}

func capText(s string) string {
	if len(s) <= maxText {
		return s
	}
	return s[:maxText] + fmt.Sprintf("\n[output truncated: %d of %d bytes shown]", maxText, len(s))
}
