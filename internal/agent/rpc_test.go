package agent_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agent"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// These tests run the agent's handler in-process, as the test's user, with
// a temporary home: its wire protocol without a sandbox around it.

// newAgent serves a new agent whose home is a temporary directory.
func newAgent(t *testing.T) (url, home string) {
	t.Helper()
	home = t.TempDir()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	srv := httptest.NewServer(agent.New(log, home).Handler())
	t.Cleanup(srv.Close)
	return srv.URL, home
}

// The Connect framing of a server stream, agentproto's codec; the last
// frame carries flagEndStream.

const flagEndStream = agentproto.FlagEndStream

func writeFrame(w io.Writer, flags byte, msg []byte) { agentproto.WriteEnvelope(w, flags, msg) }

func readFrame(r io.Reader) (flags byte, msg []byte, err error) {
	return agentproto.ReadEnvelope(r, agentproto.MaxResponse)
}

// rpcError is a Connect error body.
type rpcError struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// unary calls a unary method with req as JSON. On 200 it decodes the
// answer into out and returns nil; otherwise it returns the error.
func unary(t *testing.T, url, method string, req, out any) *rpcError {
	t.Helper()
	body, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(url+"/"+method, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		e := &rpcError{Status: resp.StatusCode}
		if err := json.Unmarshal(data, e); err != nil || e.Code == "" {
			t.Fatalf("%s: %d with body %q, want a Connect error", method, resp.StatusCode, data)
		}
		return e
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s answered %s: %v", method, data, err)
		}
	}
	return nil
}

// mustUnary is unary that fails t on an error.
func mustUnary(t *testing.T, url, method string, req, out any) {
	t.Helper()
	if e := unary(t, url, method, req, out); e != nil {
		t.Fatalf("%s %v: %d %s: %s", method, req, e.Status, e.Code, e.Message)
	}
}

// wantError calls method and checks that it fails with code and status.
func wantError(t *testing.T, url, method string, req any, code string, status int) *rpcError {
	t.Helper()
	e := unary(t, url, method, req, nil)
	if e == nil {
		t.Fatalf("%s %v succeeded, want %s", method, req, code)
	}
	if e.Code != code || e.Status != status {
		t.Errorf("%s %v: %d %s (%s), want %d %s", method, req, e.Status, e.Code, e.Message, status, code)
	}
	return e
}

// serverStream is the client side of a server-streaming call.
type serverStream struct {
	t    *testing.T
	body io.ReadCloser
}

// openStream calls a server-streaming method with req, as the user named
// (none if "").
func openStream(t *testing.T, url, method string, req any, user string) *serverStream {
	t.Helper()
	data, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	var body bytes.Buffer
	writeFrame(&body, 0, data)
	hreq, err := http.NewRequestWithContext(t.Context(), "POST", url+"/"+method, &body)
	if err != nil {
		t.Fatal(err)
	}
	hreq.Header.Set("Content-Type", "application/connect+json")
	if user != "" {
		hreq.SetBasicAuth(user, "")
	}
	resp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/connect+json" {
		t.Fatalf("%s: %d %s, want 200 application/connect+json", method, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return &serverStream{t: t, body: resp.Body}
}

// next decodes the next message into out; at the end of the stream it
// returns false and the end frame's error, if any.
func (s *serverStream) next(out any) (bool, *rpcError) {
	s.t.Helper()
	flags, msg, err := readFrame(s.body)
	if err != nil {
		s.t.Fatalf("stream ended without its end frame: %v", err)
	}
	if flags&flagEndStream != 0 {
		var end struct {
			Error *rpcError `json:"error"`
		}
		if err := json.Unmarshal(msg, &end); err != nil {
			s.t.Fatalf("end frame %q: %v", msg, err)
		}
		return false, end.Error
	}
	if err := json.Unmarshal(msg, out); err != nil {
		s.t.Fatalf("message %q: %v", msg, err)
	}
	return true, nil
}

func (e *rpcError) String() string { return fmt.Sprintf("%s: %s", e.Code, e.Message) }
