package filestate

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// newService serves a new service whose "/" is a temporary directory
// holding the saved directories, and returns the daemon's client of it.
func newService(t *testing.T, root bool) (*agentproto.Client, string) {
	t.Helper()
	base := t.TempDir()
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s := New(slog.New(slog.NewTextHandler(t.Output(), nil)), root)
	s.base = base
	mux := http.NewServeMux()
	s.Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &agentproto.Client{Transport: srv.Client().Transport, URL: srv.URL}, base
}

// write makes the files of tree (a name ending in "/" is a directory,
// "->" starts a link's target) under dir.
func write(t *testing.T, dir string, tree map[string]string) {
	t.Helper()
	for name, content := range tree {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		var err error
		switch {
		case name[len(name)-1] == '/':
			err = os.MkdirAll(p, 0o750)
		case len(content) > 2 && content[:2] == "->":
			err = os.Symlink(content[2:], p)
		default:
			err = os.WriteFile(p, []byte(content), 0o640)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}
