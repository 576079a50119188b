package interpreter

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

type contextInfo struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func TestContextsRefused(t *testing.T) {
	_, url, _ := newService(t)
	for _, tc := range []struct {
		method, path string
		body         any
		want         int
	}{
		{"POST", "/contexts", map[string]string{"language": "cobol"}, http.StatusBadRequest},
		{"POST", "/contexts", "not an object", http.StatusBadRequest},
		{"DELETE", "/contexts/nope", nil, http.StatusNotFound},
		{"POST", "/contexts/nope/restart", nil, http.StatusNotFound},
	} {
		code, data := call(t, tc.method, url+tc.path, tc.body)
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if code != tc.want || json.Unmarshal(data, &e) != nil || e.Code != tc.want || e.Message == "" {
			t.Errorf("%s %s: %d %s, want %d with {code, message}", tc.method, tc.path, code, data, tc.want)
		}
	}
	if code, data := call(t, "GET", url+"/contexts", nil); code != 200 || string(data) != "[]\n" {
		t.Errorf("no contexts: %d %s", code, data)
	}
	if code, data := call(t, "GET", url+"/health", nil); code != 200 || string(data) != "OK" {
		t.Errorf("health: %d %s", code, data)
	}
}

// TestContexts: a context is a kernel of its own, in its directory,
// listed in the order made, restarted with its state lost, deleted.
func TestContexts(t *testing.T) {
	needKernel(t, "python")
	s, url, _ := newService(t)
	dir := filepath.Join(s.users.Home, "work")
	os.Mkdir(dir, 0o755)
	var a, b contextInfo
	for _, c := range []struct {
		body any
		into *contextInfo
	}{{map[string]string{"language": "Python3", "cwd": "work"}, &a}, {nil, &b}} {
		code, data := call(t, "POST", url+"/contexts", c.body)
		if code != 200 || json.Unmarshal(data, c.into) != nil || c.into.ID == "" || c.into.Language != "python" {
			t.Fatalf("create: %d %s", code, data)
		}
	}
	if a.Cwd != dir || b.Cwd != s.users.Home {
		t.Errorf("directories %q and %q, want %q and the home", a.Cwd, b.Cwd, dir)
	}
	execute(t, url, agentproto.ExecuteRequest{Code: "v = 'a'", ContextID: a.ID})
	if _, res := text(execute(t, url, agentproto.ExecuteRequest{Code: "import os\n(os.getcwd(), 'v' in globals())", ContextID: b.ID})); res != "('"+s.users.Home+"', False)" {
		t.Errorf("b: %s, want its own directory and state", res)
	}
	var list []contextInfo
	code, data := call(t, "GET", url+"/contexts", nil)
	if code != 200 || json.Unmarshal(data, &list) != nil || len(list) != 2 || list[0].ID != a.ID || list[1].ID != b.ID {
		t.Errorf("list: %d %s, want a then b", code, data)
	}
	if code, data := call(t, "POST", url+"/contexts/"+a.ID+"/restart", nil); code != http.StatusNoContent {
		t.Fatalf("restart: %d %s", code, data)
	}
	if _, res := text(execute(t, url, agentproto.ExecuteRequest{Code: "'v' in globals()", ContextID: a.ID})); res != "False" {
		t.Errorf("after a restart: %s, want the state gone", res)
	}
	if code, _ := call(t, "DELETE", url+"/contexts/"+a.ID, nil); code != http.StatusNoContent {
		t.Fatalf("delete: %d", code)
	}
	if code, _ := executeStatus(t, url, agentproto.ExecuteRequest{Code: "1", ContextID: a.ID}); code != http.StatusNotFound {
		t.Errorf("an execution in a deleted context: %d, want 404", code)
	}
}

// TestDefaultContext: the language's default context is made once, and
// deleting it makes the next execution make another.
func TestDefaultContext(t *testing.T) {
	needKernel(t, "python")
	s, url, _ := newService(t)
	execute(t, url, agentproto.ExecuteRequest{Code: "d = 1", Language: "python"})
	first, err := s.defaultContext(t.Context(), "PYTHON")
	if err != nil {
		t.Fatal(err)
	}
	if _, res := text(execute(t, url, agentproto.ExecuteRequest{Code: "d"})); res != "1" {
		t.Errorf("no language: %q, want python's default context", res)
	}
	call(t, "DELETE", url+"/contexts/"+first.ID, nil)
	if _, res := text(execute(t, url, agentproto.ExecuteRequest{Code: "'d' in globals()"})); res != "False" {
		t.Errorf("after deleting the default context: %q, want a new one", res)
	}
}
