package agent_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agent"
	"github.com/airlock-sandbox/airlock/internal/agent/rpc/rpctest"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// These tests run the agent's handler in-process, as the test's user, with
// a temporary home: how its services are put together, without a sandbox
// around it. Each service has tests of its own.

// newAgent serves a new agent whose home is a temporary directory.
func newAgent(t *testing.T) (url, home string) {
	t.Helper()
	home = t.TempDir()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	srv := httptest.NewServer(agent.New(log, home).Handler())
	t.Cleanup(srv.Close)
	return srv.URL, home
}

// client is the daemon's client of the agent served at url.
func client(url string) *agentproto.Client {
	return &agentproto.Client{Transport: http.DefaultTransport, URL: url}
}

// TestSetupEnvReachesProcesses: the envs the daemon sets up are every
// process's, under the request's own.
func TestSetupEnvReachesProcesses(t *testing.T) {
	url, _ := newAgent(t)
	if err := client(url).Setup(t.Context(), agentproto.Setup{EnvVars: map[string]string{"FROM_SETUP": "1", "X": "setup"}}); err != nil {
		t.Fatalf("setup: %v", err)
	}
	req := map[string]any{"process": map[string]any{"cmd": "/bin/sh", "args": []string{"-c", `printf '%s %s' "$FROM_SETUP" "$X"`}, "envs": map[string]string{"X": "request"}}}
	s := rpctest.OpenStream(t, url, "process.Process/Start", req, "")
	var stdout string
	for {
		var ev agentproto.StartResponse
		more, err := s.Next(&ev)
		if !more {
			if err != nil {
				t.Fatal(err)
			}
			break
		}
		if ev.Event.Data != nil {
			stdout += string(ev.Event.Data.Stdout)
		}
	}
	if stdout != "1 request" {
		t.Errorf("stdout %q, want the setup's variable and the request's X", stdout)
	}
}
