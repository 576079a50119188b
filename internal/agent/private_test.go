package agent_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agent"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// TestPrivateEndpoints: the daemon's typed calls reach the endpoints the
// agent registers, and get the answers it gives outside a sandbox.
func TestPrivateEndpoints(t *testing.T) {
	url, _ := newAgent(t)
	c := client(url)
	if d, err := c.Disk(t.Context()); err != nil || d.Used < 0 {
		t.Errorf("Disk: %+v, %v", d, err)
	}
	// No kernel was prestarted, none runs: both answer at once.
	if err := c.Settle(t.Context()); err != nil {
		t.Errorf("Settle: %v", err)
	}
	if err := c.Reseed(t.Context()); err != nil {
		t.Errorf("Reseed: %v", err)
	}
	// An agent served on a listener it was handed cannot let go of it.
	var e *agentproto.Error
	if err := c.Checkpoint(t.Context()); !errors.As(err, &e) || !strings.Contains(e.Message, "cannot let go") {
		t.Errorf("Checkpoint: %v, want the agent's refusal", err)
	}
	// Only an agent that is the sandbox's root lays out others' files.
	if err := c.Untar(t.Context(), "/tmp/x", false, strings.NewReader("")); !errors.As(err, &e) || !strings.Contains(e.Message, "only a sandbox's root") {
		t.Errorf("Untar: %v, want the agent's refusal", err)
	}
	if err := c.Setup(t.Context(), agentproto.Setup{}); err != nil {
		t.Errorf("Setup without envs: %v", err)
	}
	resp, err := http.Post(url+agentproto.SetupEnvPath, "application/json", strings.NewReader("{"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.HasPrefix(string(body), "bad setup") {
		t.Errorf("a bad setup: %d %q", resp.StatusCode, body)
	}
}

// TestEverythingIsRouted: each procedure and endpoint of both ports is
// some service's (the mux's own 404 is no service's answer).
func TestEverythingIsRouted(t *testing.T) {
	url, _ := newAgent(t)
	envd := []string{
		"GET /health", "GET " + agentproto.FilesPath + "?path=x", "POST " + agentproto.FilesPath,
		"POST " + agentproto.StartProcedure, "POST /process.Process/Connect", "POST /process.Process/List",
		"POST /process.Process/SendInput", "POST /process.Process/SendSignal", "POST /process.Process/CloseStdin",
		"POST /process.Process/Update", "POST /process.Process/StreamInput",
		"POST /filesystem.Filesystem/Stat", "POST /filesystem.Filesystem/MakeDir", "POST /filesystem.Filesystem/Move",
		"POST " + agentproto.ListDirProcedure, "POST /filesystem.Filesystem/Remove", "POST /filesystem.Filesystem/WatchDir",
		"POST /filesystem.Filesystem/CreateWatcher", "POST /filesystem.Filesystem/GetWatcherEvents", "POST /filesystem.Filesystem/RemoveWatcher",
		"POST " + agentproto.SetupEnvPath, "GET " + agentproto.DiskPath, "POST " + agentproto.CheckpointPath,
		"POST " + agentproto.SettlePath, "POST " + agentproto.ReseedPath, "POST " + agentproto.UntarPath,
		"GET " + agentproto.ForwardPath,
		// Not SavedFilesPath: outside a sandbox its "/" is the host's
		// (package filestate tests it in a directory of its own).
	}
	interp := []string{"GET /health", "POST " + agentproto.ExecutePath, "GET /contexts", "POST /contexts", "DELETE /contexts/x", "POST /contexts/x/restart"}
	check := func(port string, routes []string) {
		for _, route := range routes {
			method, path, _ := strings.Cut(route, " ")
			req, _ := http.NewRequestWithContext(t.Context(), method, url+path, strings.NewReader("{"))
			req.Header.Set("E2b-Sandbox-Port", port)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 64))
			resp.Body.Close()
			if string(body) == "404 page not found\n" {
				t.Errorf("port %s: %s is no service's", port, route)
			}
		}
	}
	check(agentproto.EnvdPort, envd)
	check(agentproto.InterpreterPort, interp)
	// And a path that is none, to know the check can fail.
	req, _ := http.NewRequest("GET", url+"/nothing", nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("an unknown path: %v, %v", resp, err)
	}
}

// TestHandlerRoutesByPort: the interpreter's port is the interpreter's.
func TestHandlerRoutesByPort(t *testing.T) {
	url, _ := newAgent(t)
	for port, want := range map[string]int{"": http.StatusNoContent, agentproto.EnvdPort: http.StatusNoContent, agentproto.InterpreterPort: http.StatusOK} {
		req, _ := http.NewRequest("GET", url+"/health", nil)
		if port != "" {
			req.Header.Set("E2b-Sandbox-Port", port)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("port %q: /health answered %d, want %d", port, resp.StatusCode, want)
		}
	}
}

// TestServe: the agent serves a listener it is handed until its context
// ends.
func TestServe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- agent.New(slog.New(slog.DiscardHandler), t.TempDir()).Serve(ctx, ln) }()
	resp, err := http.Get("http://" + ln.Addr().String() + "/health")
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("health: %v, %v", resp, err)
	}
	resp.Body.Close()
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}
}
