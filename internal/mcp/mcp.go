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
	"math"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
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
	sb, err := s.create(ctx, cmp.Or(ss.template, codeTemplate), cmp.Or(ss.ttl, s.ttl), ss.limits)
	if err != nil {
		return nil, err
	}
	ss.sandboxID = sb.ID
	return sb, nil
}

func (s *Server) create(ctx context.Context, template string, ttl time.Duration, limits sandbox.Limits) (*sandbox.Sandbox, error) {
	return s.m.Create(ctx, sandbox.CreateRequest{TemplateID: template, TTL: ttl, ClientID: "mcp",
		Metadata: map[string]string{"mcp-session": "true"}, Limits: limits})
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

type runCodeIn struct {
	Code      string `json:"code" jsonschema:"the code to run"`
	Language  string `json:"language,omitempty" jsonschema:"the kernel's language: python (the default), javascript (js), typescript (ts), r or bash"`
	ContextID string `json:"context_id,omitempty" jsonschema:"an interpreter context id, to keep separate state"`
	// TimeoutSeconds bounds the cell; the kernel is interrupted at the
	// end and keeps its state, as with E2B's runCode timeout.
	TimeoutSeconds int `json:"timeout_seconds,omitempty" jsonschema:"interrupt the cell after this many seconds (its variables are kept); default 300"`
}

func (s *Server) runCode(ctx context.Context, req *sdk.CallToolRequest, in runCodeIn) (*sdk.CallToolResult, any, error) {
	timeout := 300 * time.Second
	if in.TimeoutSeconds < 0 || in.TimeoutSeconds > maxSeconds {
		return toolError("timeout_seconds must be between 1 and %d", maxSeconds), nil, nil
	} else if in.TimeoutSeconds > 0 {
		timeout = time.Duration(in.TimeoutSeconds) * time.Second
	}
	sb, err := s.sandboxFor(ctx, req)
	if err != nil {
		return s.failure("no sandbox", err), nil, nil
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, err := executeCode(cctx, sb, in.Code, in.Language, in.ContextID, progress(cctx, req))
	// At the timeout the agent interrupts the kernel when the request
	// goes away; what the cell printed until then is still worth showing.
	timedOut := err != nil && ctx.Err() == nil && errors.Is(cctx.Err(), context.DeadlineExceeded)
	if err != nil && !timedOut {
		return s.sandboxFailure("run_code", sb, err), nil, nil
	}
	if out == nil {
		out = &codeOutput{}
	}
	res := &sdk.CallToolResult{}
	text := func(t string) { res.Content = append(res.Content, &sdk.TextContent{Text: capText(t)}) }
	if out.Stdout.Len() > 0 {
		text("stdout:\n" + out.Stdout.String())
	}
	if out.Stderr.Len() > 0 {
		text("stderr:\n" + out.Stderr.String())
	}
	for _, r := range out.Results {
		shown := false
		for _, img := range []struct{ mime, b64 string }{{"image/png", r.PNG}, {"image/jpeg", r.JPEG}} {
			if img.b64 == "" {
				continue
			}
			if data, err := decodeBase64(img.b64); err == nil {
				res.Content = append(res.Content, &sdk.ImageContent{Data: data, MIMEType: img.mime})
				shown = true
			}
		}
		for _, v := range []string{r.Markdown, r.HTML} {
			if v != "" && !shown {
				text(v)
				shown = true
			}
		}
		if !shown {
			text(r.Text)
		}
	}
	if out.Error != nil {
		res.IsError = true
		text(fmt.Sprintf("%s: %s\n%s", out.Error.Name, out.Error.Value, stripANSI(out.Error.Traceback)))
	}
	if timedOut {
		res.IsError = true
		text(fmt.Sprintf("the cell did not finish within %s and was interrupted; variables defined before are kept", timeout))
	}
	if len(res.Content) == 0 {
		text("(no output)")
	}
	return res, nil, nil
}

type runCommandIn struct {
	Command        string `json:"command" jsonschema:"the shell command to run (bash)"`
	TimeoutSeconds int    `json:"timeout_seconds,omitempty" jsonschema:"kill the command after this many seconds; default 60"`
	Background     bool   `json:"background,omitempty" jsonschema:"start it and return its pid without waiting"`
}

func (s *Server) runCommand(ctx context.Context, req *sdk.CallToolRequest, in runCommandIn) (*sdk.CallToolResult, any, error) {
	if in.Command == "" {
		return toolError("command is empty"), nil, nil
	}
	sb, err := s.sandboxFor(ctx, req)
	if err != nil {
		return s.failure("no sandbox", err), nil, nil
	}
	timeout := 60 * time.Second
	if in.TimeoutSeconds < 0 || in.TimeoutSeconds > maxSeconds {
		return toolError("timeout_seconds must be between 1 and %d", maxSeconds), nil, nil
	} else if in.TimeoutSeconds > 0 {
		timeout = time.Duration(in.TimeoutSeconds) * time.Second
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, err := runCommand(cctx, sb, in.Command, in.Background)
	if in.Background && err == nil {
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: fmt.Sprintf("started in the background, pid %d", out.Pid)}}}, nil, nil
	}
	if err != nil && ctx.Err() == nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(cctx.Err(), context.DeadlineExceeded)) {
		return toolError("the command did not finish within %s", timeout), nil, nil
	}
	if err != nil {
		return s.sandboxFailure("run_command", sb, err), nil, nil
	}
	res := &sdk.CallToolResult{IsError: out.ExitCode != 0}
	ended := fmt.Sprintf("exit code %d", out.ExitCode)
	if strings.HasPrefix(out.Status, "signal: ") {
		// Killed: say by what, and the likeliest cause of a SIGKILL.
		ended += " (" + out.Status
		if out.Status == "signal: killed" {
			ended += "; the sandbox's memory limit is the usual cause"
		}
		ended += ")"
	}
	res.Content = append(res.Content, &sdk.TextContent{Text: capText(fmt.Sprintf("%s\nstdout:\n%s\nstderr:\n%s", ended, out.Stdout.String(), out.Stderr.String()))})
	return res, nil, nil
}

type pathIn struct {
	Path string `json:"path" jsonschema:"a path in the sandbox; relative paths start at /home/user"`
}

// progress returns a function that passes a cell's output on to the
// client as progress notifications while the cell runs, if the client
// asked for progress: a long cell shows signs of life before its result.
// At most one notification goes out per progressEvery; output printed
// in between is sent together, its tail if it is long.
func progress(ctx context.Context, req *sdk.CallToolRequest) func(string) {
	token := req.Params.GetProgressToken()
	if token == nil || req.Session == nil {
		return nil
	}
	var (
		pending strings.Builder
		last    time.Time
		n       float64
	)
	return func(text string) {
		pending.WriteString(text)
		if time.Since(last) < progressEvery {
			return
		}
		msg := pending.String()
		if i := len(msg) - maxProgress; i > 0 {
			for i < len(msg) && !utf8.RuneStart(msg[i]) {
				i++
			}
			msg = "…" + msg[i:]
		}
		pending.Reset()
		last, n = time.Now(), n+1
		// A client that cannot take it does not stop the cell.
		_ = req.Session.NotifyProgress(ctx, &sdk.ProgressNotificationParams{ProgressToken: token, Progress: n, Message: msg})
	}
}

// readFile returns text as text and images as images the model can see;
// other binary files are described, not dumped.
func (s *Server) readFile(ctx context.Context, req *sdk.CallToolRequest, in pathIn) (*sdk.CallToolResult, any, error) {
	sb, err := s.sandboxFor(ctx, req)
	if err != nil {
		return s.failure("no sandbox", err), nil, nil
	}
	data, truncated, err := readFile(ctx, sb, in.Path, maxImage)
	if err != nil {
		return s.sandboxFailure("read_file", sb, err), nil, nil
	}
	result := func(c sdk.Content) (*sdk.CallToolResult, any, error) {
		return &sdk.CallToolResult{Content: []sdk.Content{c}}, nil, nil
	}
	switch kind := http.DetectContentType(data); kind {
	case "image/png", "image/jpeg", "image/gif", "image/webp":
		if truncated {
			return toolError("read_file: the image is larger than %d MiB", maxImage>>20), nil, nil
		}
		return result(&sdk.ImageContent{Data: data, MIMEType: kind})
	}
	if len(data) > maxFile {
		data, truncated = data[:maxFile], true
	}
	text, ok := utf8Prefix(data, truncated)
	if !ok {
		return result(&sdk.TextContent{Text: fmt.Sprintf("%s is a binary file (%s): not shown. Inspect it with run_code or run_command.",
			in.Path, http.DetectContentType(data))})
	}
	if truncated {
		text += fmt.Sprintf("\n[file truncated at %d bytes]", maxFile)
	}
	return result(&sdk.TextContent{Text: text})
}

// utf8Prefix reports whether data is UTF-8 text. A cut-off file may end
// in the middle of a character: that tail is dropped, not held against it.
func utf8Prefix(data []byte, cut bool) (string, bool) {
	for trim := 0; trim <= 3 && trim <= len(data); trim++ {
		if utf8.Valid(data[:len(data)-trim]) {
			return string(data[:len(data)-trim]), true
		}
		if !cut {
			break
		}
	}
	return "", false
}

type writeIn struct {
	Path    string `json:"path" jsonschema:"where to write, in the sandbox"`
	Content string `json:"content" jsonschema:"the text to write"`
}

func (s *Server) writeFile(ctx context.Context, req *sdk.CallToolRequest, in writeIn) (*sdk.CallToolResult, any, error) {
	sb, err := s.sandboxFor(ctx, req)
	if err != nil {
		return s.failure("no sandbox", err), nil, nil
	}
	if err := writeFile(ctx, sb, in.Path, []byte(in.Content)); err != nil {
		return s.sandboxFailure("write_file", sb, err), nil, nil
	}
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: fmt.Sprintf("wrote %d bytes to %s", len(in.Content), in.Path)}}}, nil, nil
}

type listIn struct {
	Path  string `json:"path" jsonschema:"the directory to list"`
	Depth int    `json:"depth,omitempty" jsonschema:"how deep to list; default 1"`
}

func (s *Server) listFiles(ctx context.Context, req *sdk.CallToolRequest, in listIn) (*sdk.CallToolResult, any, error) {
	sb, err := s.sandboxFor(ctx, req)
	if err != nil {
		return s.failure("no sandbox", err), nil, nil
	}
	depth := max(in.Depth, 1)
	entries, err := listFiles(ctx, sb, in.Path, depth)
	if err != nil {
		return s.sandboxFailure("list_files", sb, err), nil, nil
	}
	var b strings.Builder
	for _, e := range entries {
		kind := "file"
		if e.Type == agentproto.FileTypeDirectory {
			kind = "dir"
		}
		fmt.Fprintf(&b, "%s\t%d\t%s\n", kind, e.Size, e.Path)
	}
	if b.Len() == 0 {
		b.WriteString("(empty)")
	}
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: capText(b.String())}}}, nil, nil
}

type createIn struct {
	Template       string  `json:"template,omitempty" jsonschema:"base or code-interpreter-v1 (default)"`
	TimeoutSeconds int     `json:"timeout_seconds,omitempty" jsonschema:"the sandbox's time to live, within the server's bounds"`
	MemoryMB       int64   `json:"memory_mb,omitempty" jsonschema:"memory limit in MiB; at most the template's (list_sandboxes shows it)"`
	CPUs           float64 `json:"cpus,omitempty" jsonschema:"CPU limit in cores, e.g. 0.5; at most the template's"`
	Pids           int64   `json:"pids,omitempty" jsonschema:"limit on processes and threads; at most the template's"`
	DiskMB         int64   `json:"disk_mb,omitempty" jsonschema:"size limit of /tmp and /home/user in MiB; at most the template's"`
}

func (s *Server) createSandbox(ctx context.Context, req *sdk.CallToolRequest, in createIn) (*sdk.CallToolResult, any, error) {
	tmpl := in.Template
	if tmpl == "" {
		tmpl = codeTemplate
	}
	ttl := s.ttl
	if in.TimeoutSeconds < 0 || in.TimeoutSeconds > maxSeconds {
		return toolError("create_sandbox: timeout_seconds must be between 1 and %d", maxSeconds), nil, nil
	} else if in.TimeoutSeconds > 0 {
		ttl = time.Duration(in.TimeoutSeconds) * time.Second
	}
	if in.MemoryMB < 0 || in.CPUs < 0 || in.Pids < 0 || in.DiskMB < 0 {
		return toolError("create_sandbox: memory_mb, cpus, pids and disk_mb must not be negative"), nil, nil
	}
	ss := s.session(req)
	ss.mu.Lock()
	if ss.ended {
		ss.mu.Unlock()
		return toolError("create_sandbox: the session has ended"), nil, nil
	}
	limits := sandbox.Limits{MemoryBytes: mib(in.MemoryMB), CPUs: in.CPUs, Pids: in.Pids, DiskBytes: mib(in.DiskMB)}
	sb, err := s.create(ctx, tmpl, ttl, limits)
	old := ss.sandboxID
	if err == nil {
		ss.sandboxID, ss.template, ss.limits, ss.ttl = sb.ID, tmpl, limits, ttl
	}
	ss.mu.Unlock()
	if err != nil {
		return s.failure("create_sandbox", err), nil, nil
	}
	if old != "" {
		s.m.Kill(old)
	}
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: fmt.Sprintf("sandbox %s (%s) ready; it ends after %s without a tool call", sb.ID, tmpl, ttl)}}}, nil, nil
}

// mib converts MiB (not negative) to bytes, saturating: a huge request
// stays huge (and is refused as such) instead of wrapping around.
func mib(v int64) int64 {
	if v > math.MaxInt64>>20 {
		return math.MaxInt64
	}
	return v << 20
}

// ownSandbox is the session's sandbox id, "" if it has none.
func (s *Server) ownSandbox(req *sdk.CallToolRequest) string {
	ss := s.session(req)
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.sandboxID
}

// killSandbox ends the session's own sandbox. A session can touch no
// other: the model behind it may be following injected instructions.
func (s *Server) killSandbox(ctx context.Context, req *sdk.CallToolRequest, _ struct{}) (*sdk.CallToolResult, any, error) {
	id := s.ownSandbox(req)
	if id == "" || s.m.Kill(id) != nil {
		return toolError("this session has no sandbox"), nil, nil
	}
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "killed " + id + "; the next tool call starts a fresh sandbox"}}}, nil, nil
}

// listSandboxes shows the session's sandbox, the only one it can use.
func (s *Server) listSandboxes(ctx context.Context, req *sdk.CallToolRequest, _ struct{}) (*sdk.CallToolResult, any, error) {
	sb, err := s.m.Get(s.ownSandbox(req))
	if err != nil {
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "(none: the next tool call starts one)"}}}, nil, nil
	}
	text := fmt.Sprintf("%s\t%s\tuntil %s\tmemory %d MiB, %g CPUs, disk %d MiB",
		sb.ID, sb.TemplateID, sb.EndAt().UTC().Format(time.RFC3339), sb.MemoryMB, sb.CPUs, sb.DiskMB)
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: text}}}, nil, nil
}

func stripANSI(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == 0x1b && i+1 < len(s) && s[i+1] == '[' {
			j := i + 2
			for j < len(s) && (s[j] < 0x40 || s[j] > 0x7e) {
				j++
			}
			i = j
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
