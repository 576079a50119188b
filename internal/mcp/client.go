package mcp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/url"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// The daemon's side of the agent protocol, for the MCP tools: the same
// requests the E2B SDKs make, sent straight to the sandbox's agent.

// agentError is a failure the agent reported (a missing file, a bad
// request): its message describes the sandbox, not the host, and goes
// to the model. Every other error from these calls is the daemon's own
// (a socket path in a dial error) and does not.
type agentError struct{ msg string }

func (e agentError) Error() string { return e.msg }

var errResponseTooLarge = agentError{"the sandbox's response was too large"}

func agent(sb *sandbox.Sandbox) *agentproto.Client {
	return &agentproto.Client{Transport: sb.Transport()}
}

// fromAgent sorts an agentproto.Client's error: what the agent reported
// becomes an agentError, and a deadline the agent applied is this call's
// own (the agent's can come a moment before this side's).
func fromAgent(err error) error {
	var e *agentproto.Error
	switch {
	case errors.Is(err, agentproto.ErrTooLarge):
		return errResponseTooLarge
	case !errors.As(err, &e):
		return err
	case e.Code == agentproto.CodeDeadlineExceeded:
		return context.DeadlineExceeded
	}
	return agentError{e.Message}
}

// codeOutput is what one execution produced.
type codeOutput struct {
	Stdout, Stderr strings.Builder
	Results        []*agentproto.ExecuteLine
	Error          *agentproto.ExecuteLine
}

// executeCode runs a cell. onOutput, if not nil, sees each piece of
// stdout and stderr as the cell prints it.
func executeCode(ctx context.Context, sb *sandbox.Sandbox, code, language, contextID string, onOutput func(string)) (*codeOutput, error) {
	body, _ := json.Marshal(agentproto.ExecuteRequest{Code: code, Language: language, ContextID: contextID})
	resp, err := agent(sb).Do(ctx, agentproto.InterpreterPort, "POST", agentproto.ExecutePath, "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, fromAgent(err)
	}
	defer resp.Body.Close()
	out := &codeOutput{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := &agentproto.ExecuteLine{}
		if json.Unmarshal(sc.Bytes(), line) != nil {
			continue
		}
		switch line.Type {
		case "stdout", "stderr":
			if line.Type == "stdout" {
				out.Stdout.WriteString(line.Text)
			} else {
				out.Stderr.WriteString(line.Text)
			}
			if onOutput != nil {
				onOutput(line.Text)
			}
		case "result":
			out.Results = append(out.Results, line)
		case "error":
			out.Error = line
		}
	}
	return out, fromAgent(sc.Err())
}

// commandOutput is what a command produced.
type commandOutput struct {
	Pid            uint32
	Stdout, Stderr strings.Builder
	ExitCode       int
	// Status is how it ended, as the agent says ("exit status 1",
	// "signal: killed").
	Status string
	Ended  bool
}

// runCommand runs bash -l -c command in the sandbox, as commands.run does,
// and returns once it ended (or, in background, once it started).
func runCommand(ctx context.Context, sb *sandbox.Sandbox, command string, background bool) (*commandOutput, error) {
	stdin := false
	req := agentproto.StartRequest{Process: &agentproto.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", command}}, Stdin: &stdin}
	// A process outlives the request that started it (E2B's semantics);
	// a foreground command's deadline goes to the agent, which kills the
	// process then. A background one has none.
	var timeout time.Duration
	if d, ok := ctx.Deadline(); ok && !background {
		timeout = time.Until(d)
	}
	out := &commandOutput{}
	for ev, err := range agentproto.Stream[agentproto.StartResponse](ctx, agent(sb), agentproto.StartProcedure, req, timeout) {
		if err != nil {
			return out, fromAgent(err)
		}
		if ev.Event == nil {
			continue
		}
		switch e := ev.Event; {
		case e.Start != nil:
			out.Pid = e.Start.Pid
			if background {
				return out, nil
			}
		case e.Data != nil:
			out.Stdout.Write(e.Data.Stdout)
			out.Stderr.Write(e.Data.Stderr)
		case e.End != nil:
			out.ExitCode, out.Status, out.Ended = int(e.End.ExitCode), e.End.Status, true
		}
	}
	return out, nil
}

func readFile(ctx context.Context, sb *sandbox.Sandbox, path string, limit int64) ([]byte, bool, error) {
	resp, err := agent(sb).Do(ctx, agentproto.EnvdPort, "GET", agentproto.FilesPath+"?path="+url.QueryEscape(path), "", nil)
	if err != nil {
		return nil, false, fromAgent(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, false, fromAgent(err)
	}
	truncated := int64(len(data)) > limit
	if truncated {
		data = data[:limit]
	}
	return data, truncated, nil
}

func writeFile(ctx context.Context, sb *sandbox.Sandbox, path string, content []byte) error {
	resp, err := agent(sb).Do(ctx, agentproto.EnvdPort, "POST", agentproto.FilesPath+"?path="+url.QueryEscape(path), "application/octet-stream", bytes.NewReader(content))
	if err != nil {
		return fromAgent(err)
	}
	resp.Body.Close()
	return nil
}

func listFiles(ctx context.Context, sb *sandbox.Sandbox, path string, depth int) ([]*agentproto.EntryInfo, error) {
	var resp agentproto.ListDirResponse
	err := agent(sb).Call(ctx, agentproto.ListDirProcedure, agentproto.ListDirRequest{Path: path, Depth: uint32(min(depth, math.MaxUint32))}, &resp)
	return resp.Entries, fromAgent(err)
}

func decodeBase64(s string) ([]byte, error) {
	return base64.StdEncoding.DecodeString(strings.TrimSpace(s))
}
