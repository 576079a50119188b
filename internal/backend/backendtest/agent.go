package backendtest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/backend"
)

// The suite talks to a box's agent as the daemon does: over connections
// its Instance dials, in the agent's protocol.

// client is an agent client whose every connection inst dials.
func client(inst backend.Instance) (*agentproto.Client, func()) {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return inst.Dial(ctx) }}
	return &agentproto.Client{Transport: tr}, tr.CloseIdleConnections
}

// health asks inst's agent, on a new connection, whether it serves.
func health(ctx context.Context, inst backend.Instance) error {
	c, done := client(inst)
	defer done()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent/health", nil)
	if err != nil {
		return err
	}
	resp, err := c.Transport.RoundTrip(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("health: %s", resp.Status)
	}
	return nil
}

// ended is how a command the agent ran ended.
type ended struct {
	stdout, stderr string
	code           int
	exited         bool
	status         string // "exit status 3", "signal: terminated"
}

// command runs a shell script through inst's agent, as a client's
// commands.run does, and returns how it ended.
func command(t *testing.T, inst backend.Instance, script string) ended {
	t.Helper()
	c, done := client(inst)
	defer done()
	stdin := false
	req := agentproto.StartRequest{Process: &agentproto.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", script}}, Stdin: &stdin}
	var out ended
	var stdout, stderr strings.Builder
	got := false
	for ev, err := range agentproto.Stream[agentproto.StartResponse](t.Context(), c, agentproto.StartProcedure, req, 0) {
		if err != nil {
			t.Fatalf("%q through the agent: %v", script, err)
		}
		switch e := ev.Event; {
		case e == nil:
		case e.Data != nil:
			stdout.Write(e.Data.Stdout)
			stderr.Write(e.Data.Stderr)
		case e.End != nil:
			out.code, out.exited, out.status, got = int(e.End.ExitCode), e.End.Exited, e.End.Status, true
		}
	}
	if !got {
		t.Fatalf("%q through the agent: no end", script)
	}
	out.stdout, out.stderr = stdout.String(), stderr.String()
	return out
}

// writeFile writes data to path through inst's agent; a relative path is
// in the user's home.
func writeFile(ctx context.Context, inst backend.Instance, path string, data io.Reader) error {
	c, done := client(inst)
	defer done()
	resp, err := c.Do(ctx, agentproto.EnvdPort, http.MethodPost, agentproto.FilesPath+"?path="+url.QueryEscape(path), "application/octet-stream", data)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// readFile reads path through inst's agent.
func readFile(ctx context.Context, inst backend.Instance, path string) ([]byte, error) {
	c, done := client(inst)
	defer done()
	resp, err := c.Do(ctx, agentproto.EnvdPort, http.MethodGet, agentproto.FilesPath+"?path="+url.QueryEscape(path), "", nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, err = b.ReadFrom(resp.Body)
	return b.Bytes(), err
}

// listDir lists path through inst's agent.
func listDir(ctx context.Context, inst backend.Instance, path string) ([]*agentproto.EntryInfo, error) {
	c, done := client(inst)
	defer done()
	var resp agentproto.ListDirResponse
	err := c.Call(ctx, agentproto.ListDirProcedure, agentproto.ListDirRequest{Path: path, Depth: 1}, &resp)
	return resp.Entries, err
}
