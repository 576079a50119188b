package mcp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// The daemon's side of the agent protocol, for the MCP tools: the same
// requests the E2B SDKs make, sent straight to the sandbox's agent.

const (
	envdPort   = "49983"
	interpPort = "49999"
	// maxResponse bounds what the daemon reads of one agent response.
	// The agent runs inside the sandbox and is as untrusted as the code:
	// a response must not be able to exhaust the daemon's memory.
	maxResponse = 32 << 20
)

// agentError is a failure the agent reported (a missing file, a bad
// request): its message describes the sandbox, not the host, and goes
// to the model. Every other error from these calls is the daemon's own
// (a socket path in a dial error) and does not.
type agentError struct{ msg string }

func (e agentError) Error() string { return e.msg }

var errResponseTooLarge = agentError{"the sandbox's response was too large"}

func agentRequest(ctx context.Context, sb *sandbox.Sandbox, method, path, port, contentType string, body io.Reader) (*http.Response, error) {
	return agentRequestHeader(ctx, sb, method, path, port, contentType, nil, body)
}

func agentRequestHeader(ctx context.Context, sb *sandbox.Sandbox, method, path, port, contentType string, hdr http.Header, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://agent"+path, body)
	if err != nil {
		return nil, err
	}
	maps.Copy(req.Header, hdr)
	req.Header.Set("E2b-Sandbox-Port", port)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := sb.Transport().RoundTrip(req)
	if err != nil {
		return nil, err
	}
	// Every call here, streams included, expects 200: anything else is
	// the agent's (or the gateway's) refusal, read as such.
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, agentFailure(resp)
	}
	resp.Body = &limitedBody{r: io.LimitReader(resp.Body, maxResponse+1), c: resp.Body}
	return resp, nil
}

// limitedBody fails a read past maxResponse instead of truncating
// silently, so a cut-off stream is never mistaken for a whole one.
type limitedBody struct {
	r io.Reader
	c io.Closer
	n int64
}

func (b *limitedBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if b.n += int64(n); b.n > maxResponse {
		return 0, errResponseTooLarge
	}
	return n, err
}

func (b *limitedBody) Close() error { return b.c.Close() }

// agentFailure reads the error an agent answered with.
func agentFailure(resp *http.Response) error {
	var e struct{ Message string }
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if json.Unmarshal(data, &e) != nil || e.Message == "" {
		e.Message = strings.TrimSpace(string(data))
	}
	if e.Message == "" {
		e.Message = resp.Status
	}
	return agentError{e.Message}
}

// codeOutput is what one execution produced.
type codeOutput struct {
	Stdout, Stderr strings.Builder
	Results        []map[string]any
	Error          *struct{ Name, Value, Traceback string }
}

// executeCode runs a cell. onOutput, if not nil, sees each piece of
// stdout and stderr as the cell prints it.
func executeCode(ctx context.Context, sb *sandbox.Sandbox, code, language, contextID string, onOutput func(string)) (*codeOutput, error) {
	body, _ := json.Marshal(map[string]any{"code": code, "language": language, "context_id": contextID})
	resp, err := agentRequest(ctx, sb, "POST", "/execute", interpPort, "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := &codeOutput{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) != nil {
			continue
		}
		switch line["type"] {
		case "stdout", "stderr":
			text := fmt.Sprint(line["text"])
			if line["type"] == "stdout" {
				out.Stdout.WriteString(text)
			} else {
				out.Stderr.WriteString(text)
			}
			if onOutput != nil {
				onOutput(text)
			}
		case "result":
			out.Results = append(out.Results, line)
		case "error":
			out.Error = &struct{ Name, Value, Traceback string }{fmt.Sprint(line["name"]), fmt.Sprint(line["value"]), fmt.Sprint(line["traceback"])}
		}
	}
	return out, sc.Err()
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
	msg, _ := json.Marshal(map[string]any{"process": map[string]any{"cmd": "/bin/bash", "args": []string{"-l", "-c", command}}, "stdin": false})
	frame := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(frame[1:], uint32(len(msg)))
	frame = append(frame, msg...)
	// A process outlives the request that started it (E2B's semantics);
	// a foreground command's deadline goes to the agent, which kills the
	// process then. A background one has none.
	hdr := http.Header{}
	if d, ok := ctx.Deadline(); ok && !background {
		hdr.Set("Connect-Timeout-Ms", strconv.FormatInt(max(time.Until(d).Milliseconds(), 1), 10))
	}
	resp, err := agentRequestHeader(ctx, sb, "POST", "/process.Process/Start", envdPort, "application/connect+json", hdr, bytes.NewReader(frame))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := &commandOutput{}
	for {
		var hdr [5]byte
		if _, err := io.ReadFull(resp.Body, hdr[:]); err != nil {
			return out, fmt.Errorf("command stream ended early: %w", err)
		}
		n := binary.BigEndian.Uint32(hdr[1:])
		if n > maxResponse { // checked before allocating: the agent chose n
			return out, errResponseTooLarge
		}
		data := make([]byte, n)
		if _, err := io.ReadFull(resp.Body, data); err != nil {
			return out, err
		}
		if hdr[0]&2 != 0 { // end of stream
			var end struct {
				Error *struct{ Code, Message string } `json:"error"`
			}
			json.Unmarshal(data, &end)
			switch {
			case end.Error == nil:
			case end.Error.Code == "deadline_exceeded":
				// The agent ended the command at its deadline, which may
				// come a moment before this side's own.
				return out, context.DeadlineExceeded
			default:
				return out, agentError{end.Error.Message}
			}
			return out, nil
		}
		var ev struct {
			Event struct {
				Start *struct{ Pid uint32 } `json:"start"`
				Data  *struct {
					Stdout, Stderr []byte
				} `json:"data"`
				End *struct {
					ExitCode int    `json:"exitCode"`
					Status   string `json:"status"`
				} `json:"end"`
			} `json:"event"`
		}
		json.Unmarshal(data, &ev)
		switch {
		case ev.Event.Start != nil:
			out.Pid = ev.Event.Start.Pid
			if background {
				return out, nil
			}
		case ev.Event.Data != nil:
			out.Stdout.Write(ev.Event.Data.Stdout)
			out.Stderr.Write(ev.Event.Data.Stderr)
		case ev.Event.End != nil:
			out.ExitCode, out.Status, out.Ended = ev.Event.End.ExitCode, ev.Event.End.Status, true
		}
	}
}

func readFile(ctx context.Context, sb *sandbox.Sandbox, path string, limit int64) ([]byte, bool, error) {
	resp, err := agentRequest(ctx, sb, "GET", "/files?path="+url.QueryEscape(path), envdPort, "", nil)
	if err != nil {
		return nil, false, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, false, err
	}
	truncated := int64(len(data)) > limit
	if truncated {
		data = data[:limit]
	}
	return data, truncated, nil
}

func writeFile(ctx context.Context, sb *sandbox.Sandbox, path string, content []byte) error {
	resp, err := agentRequest(ctx, sb, "POST", "/files?path="+url.QueryEscape(path), envdPort, "application/octet-stream", bytes.NewReader(content))
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

type listedEntry struct {
	Path string `json:"path"`
	Type string `json:"type"`
	Size string `json:"size"`
}

func listFiles(ctx context.Context, sb *sandbox.Sandbox, path string, depth int) ([]listedEntry, error) {
	body, _ := json.Marshal(map[string]any{"path": path, "depth": depth})
	resp, err := agentRequest(ctx, sb, "POST", "/filesystem.Filesystem/ListDir", envdPort, "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r struct{ Entries []listedEntry }
	err = json.NewDecoder(resp.Body).Decode(&r)
	return r.Entries, err
}

func decodeBase64(s string) ([]byte, error) {
	return base64.StdEncoding.DecodeString(strings.TrimSpace(s))
}
