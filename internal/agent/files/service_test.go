package files

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agent/filesystem"
	"github.com/airlock-sandbox/airlock/internal/agent/identity"
	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// These tests serve the service in-process, as the test's user, with a
// temporary home, beside the filesystem service that reports what the
// uploads wrote.

// newService serves a new service whose user's home is a temporary
// directory.
func newService(t *testing.T) (url, home string) {
	t.Helper()
	home = t.TempDir()
	users := identity.Users{Home: home}
	mux := http.NewServeMux()
	New(users).Register(mux)
	filesystem.New(users).Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL, home
}

// files sends a request to /files and returns the status and body.
func files(t *testing.T, method, u, contentType string, body io.Reader, hdr ...string) (int, []byte, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, data, resp.Header
}

type written struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// TestHTTPError: envd's body, with the status the SDKs map each code to.
func TestHTTPError(t *testing.T) {
	for code, want := range map[agentproto.Code]int{
		agentproto.CodeInvalidArgument: 400, agentproto.CodeNotFound: 404, agentproto.CodePermissionDenied: 403,
		agentproto.CodeResourceExhausted: 507, agentproto.CodeAlreadyExists: 409, agentproto.CodeFailedPrecondition: 400,
		agentproto.CodeInternal: 500, agentproto.CodeUnknown: 500,
	} {
		w := httptest.NewRecorder()
		httpError(w, rpc.Errorf(code, "why"))
		var body struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if w.Code != want || w.Header().Get("Content-Type") != "application/json" || json.Unmarshal(w.Body.Bytes(), &body) != nil || body.Code != want || body.Message != "why" {
			t.Errorf("%s: %d %s, want %d with {code, message}", code, w.Code, w.Body, want)
		}
	}
}

// at is the URL of /files at base for path, with more query pairs.
func at(base, path string, more ...string) string {
	q := url.Values{"path": {path}}
	for i := 0; i+1 < len(more); i += 2 {
		q.Set(more[i], more[i+1])
	}
	return base + "/files?" + q.Encode()
}

// wantRefusal checks that a request to /files is refused with status,
// in envd's {code, message} body.
func wantRefusal(t *testing.T, method, u, contentType, body string, status int, hdr ...string) {
	t.Helper()
	code, data, _ := files(t, method, u, contentType, strings.NewReader(body), hdr...)
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if code != status || json.Unmarshal(data, &e) != nil || e.Code != status || e.Message == "" {
		t.Errorf("%s %s: got %d %s, want %d with {code, message}", method, u, code, data, status)
	}
}
