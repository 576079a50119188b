package filesystem

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agent/filesystem/filesystemtest"
	"github.com/airlock-sandbox/airlock/internal/agent/identity"
)

// These tests serve the service in-process, as the test's user, with a
// temporary home: its wire protocol without a sandbox around it.

// newService serves a new service whose user's home is a temporary
// directory.
func newService(t *testing.T) (s *Service, url, home string) {
	t.Helper()
	home = t.TempDir()
	s = New(identity.Users{Home: home})
	mux := http.NewServeMux()
	s.Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return s, srv.URL, home
}

func paths(es []filesystemtest.Entry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Path)
	}
	slices.Sort(out)
	return out
}

// TestOtherUsers: every call acts for the request's user, and one this
// sandbox has not is refused before anything is touched.
func TestOtherUsers(t *testing.T) {
	_, url, _ := newService(t)
	for _, method := range []string{"Stat", "MakeDir", "Move", "ListDir", "Remove"} {
		req, _ := http.NewRequest("POST", url+"/filesystem.Filesystem/"+method, nil)
		req.Header.Set("Content-Type", "application/json")
		req.SetBasicAuth("root", "")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s as root in a sandbox without one: %d, want 403", method, resp.StatusCode)
		}
	}
}
