package httpapi

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

func TestShuttingDown(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	c := a.create(nil)
	a.m.Shutdown()
	code, data := a.call("POST", "/v2/sandboxes", nil)
	if code != http.StatusServiceUnavailable {
		t.Fatalf("create after shutdown: %d %s, want 503", code, data)
	}
	apiError(t, code, data)
	if code, _ := a.call("GET", "/sandboxes/"+c.SandboxID, nil); code != http.StatusNotFound {
		t.Errorf("get of a sandbox killed at shutdown: %d, want 404", code)
	}
	if code, _ := a.gateway(c.SandboxID, agentproto.EnvdPort, "GET", "/health", envd(c), nil); code != http.StatusBadGateway {
		t.Errorf("gateway after shutdown: %d, want 502", code)
	}
}

func TestInternalErrorsHideDetails(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	a.b.SetStartError(errors.New("mkdir /var/lib/airlock/secret: permission denied"))
	code, data := a.call("POST", "/v2/sandboxes", nil)
	if code != http.StatusInternalServerError {
		t.Fatalf("create with a failing backend: %d %s, want 500", code, data)
	}
	if msg := apiError(t, code, data); strings.Contains(msg, "/var/lib") {
		t.Errorf("the message shows a host path: %q", msg)
	}
}

// A refusal is the client's doing and keeps its status, but a message
// that names a host directory of the server is not sent, whatever built
// it (the last guard), and a PublicError's cause is never sent.
func TestRefusalsHideHostPaths(t *testing.T) {
	state := t.TempDir()
	a := newAPI(t, sandbox.Config{StateDir: state})
	a.b.SetStartError(fmt.Errorf("%w: %s/runsc is missing", backend.ErrUnsupported, state))
	code, data := a.call("POST", "/v2/sandboxes", nil)
	if code != http.StatusBadRequest {
		t.Fatalf("create refused by the backend: %d %s, want 400", code, data)
	}
	if msg := apiError(t, code, data); strings.Contains(msg, state) {
		t.Errorf("the message shows the state directory: %q", msg)
	}

	s := &Server{log: slog.New(slog.DiscardHandler)}
	err := &sandbox.PublicError{Err: fmt.Errorf("%w: snapshot s cannot run here", sandbox.ErrInvalid), Cause: errors.New("runsc not found in /opt/secret")}
	if code, msg := s.errorOf(fmt.Errorf("create: %w", err)); code != http.StatusBadRequest || strings.Contains(msg, "/opt/secret") || !strings.Contains(msg, "cannot run here") {
		t.Errorf("a PublicError: %d %q, want 400 with its public words only", code, msg)
	}
}
