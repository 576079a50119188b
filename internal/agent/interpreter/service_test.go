package interpreter

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agent/environ"
	"github.com/airlock-sandbox/airlock/internal/agent/identity"
	"github.com/airlock-sandbox/airlock/internal/agent/jupyter"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// These tests serve the interpreter in-process, as the test's user, with
// a temporary home; those that run code start the real Jupyter kernels
// installed here (make deps installs Python's), and are skipped where a
// language has none.

// newService serves a new interpreter: its port's handler at url, the
// envd port's private endpoints at envd.
func newService(t *testing.T) (s *Service, url, envd string) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	s = New(log, identity.Users{Home: t.TempDir()}, environ.New(os.Environ()))
	s.grace = 2 * time.Second
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	mux := http.NewServeMux()
	s.Register(mux)
	private := httptest.NewServer(mux)
	t.Cleanup(private.Close)
	t.Cleanup(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, c := range s.contexts {
			c.close()
		}
	})
	return s, srv.URL, private.URL
}

// needKernel skips t unless a kernel of language is installed.
func needKernel(t *testing.T, language string) {
	t.Helper()
	lang, err := languageOf(language)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jupyter.FindSpec(lang.kernels...); err != nil {
		t.Skipf("no %s kernel is installed (make deps installs Python's)", language)
	}
}

// execute posts req and returns the lines of the answer.
func execute(t *testing.T, url string, req agentproto.ExecuteRequest) []agentproto.ExecuteLine {
	t.Helper()
	status, lines := executeStatus(t, url, req)
	if status != http.StatusOK {
		t.Fatalf("execute %+v: %d %v", req, status, lines)
	}
	return lines
}

func executeStatus(t *testing.T, url string, req agentproto.ExecuteRequest) (int, []agentproto.ExecuteLine) {
	t.Helper()
	body, _ := json.Marshal(req)
	resp, err := http.Post(url+agentproto.ExecutePath, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, []agentproto.ExecuteLine{{Type: "http", Value: string(data)}}
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/x-ndjson" {
		t.Errorf("content type %q", ct)
	}
	var lines []agentproto.ExecuteLine
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l agentproto.ExecuteLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("line %q: %v", sc.Bytes(), err)
		}
		if l.Type != "keepalive" {
			lines = append(lines, l)
		}
	}
	return resp.StatusCode, lines
}

// kinds are the types of lines, in order.
func kinds(lines []agentproto.ExecuteLine) []string {
	var out []string
	for _, l := range lines {
		out = append(out, l.Type)
	}
	return out
}

// text is the stdout of lines, and their main result's text.
func text(lines []agentproto.ExecuteLine) (stdout, result string) {
	for _, l := range lines {
		switch {
		case l.Type == "stdout":
			stdout += l.Text
		case l.Type == "result" && l.IsMainResult:
			result = l.Text
		}
	}
	return stdout, result
}

// errorOf is the error line of lines, if any.
func errorOf(lines []agentproto.ExecuteLine) *agentproto.ExecuteLine {
	for i := range lines {
		if lines[i].Type == "error" {
			return &lines[i]
		}
	}
	return nil
}

// call makes a request and returns its status and body.
func call(t *testing.T, method, url string, body any) (int, []byte) {
	t.Helper()
	var r io.Reader
	if body != nil {
		data, _ := json.Marshal(body)
		r = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, url, r)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, data
}
