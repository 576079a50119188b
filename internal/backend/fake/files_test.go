package fake

import (
	"archive/tar"
	"bytes"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// The file state of one box, written back into another, gives it the
// same files: its home's and its /tmp's, links kept.
func TestFileStateRoundTrip(t *testing.T) {
	b := New(t.TempDir(), nil)
	src := start(t, b)
	writeFile(t, filepath.Join(src.Home(), "a", "b.txt"), "deep")
	writeFile(t, filepath.Join(src.tmp, "scratch"), "tmp")
	if err := os.Symlink("a/b.txt", filepath.Join(src.Home(), "link")); err != nil {
		t.Fatal(err)
	}
	code, stream, trailer := call(t, src, http.MethodGet, agentproto.SetupPath+"files", nil)
	if code != http.StatusOK || trailer.Get(agentproto.FilesCompleteTrailer) != "1" {
		t.Fatalf("GET files: %d, trailer %q", code, trailer.Get(agentproto.FilesCompleteTrailer))
	}
	var names []string
	tr := tar.NewReader(bytes.NewReader(stream))
	for {
		hdr, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, hdr.Name)
	}
	for _, want := range []string{"home/user", "home/user/a/b.txt", "home/user/link", "tmp/scratch"} {
		if !slices.Contains(names, want) {
			t.Errorf("the stream lacks %s: %v", want, names)
		}
	}
	dst := start(t, b)
	if code, msg, _ := call(t, dst, http.MethodPost, agentproto.SetupPath+"files", bytes.NewReader(stream)); code != http.StatusNoContent {
		t.Fatalf("POST files: %d %s", code, msg)
	}
	if got := readFile(t, filepath.Join(dst.Home(), "a", "b.txt")); got != "deep" {
		t.Errorf("written back: %q", got)
	}
	if got := readFile(t, filepath.Join(dst.tmp, "scratch")); got != "tmp" {
		t.Errorf("written back to /tmp: %q", got)
	}
	if l, err := os.Readlink(filepath.Join(dst.Home(), "link")); err != nil || l != "a/b.txt" {
		t.Errorf("link written back: %q %v", l, err)
	}
}

// An entry outside the saved directories is refused, and nothing of it
// is written; a stream the agent could not finish lacks its trailer.
func TestFileStateRefusals(t *testing.T) {
	b := New(t.TempDir(), nil)
	inst := start(t, b)
	for _, name := range []string{"etc/passwd", "home/other/x", "home/user/../../escape", "../x"} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o600, Size: 1})
		tw.Write([]byte("x"))
		tw.Close()
		code, msg, _ := call(t, inst, http.MethodPost, agentproto.SetupPath+"files", &buf)
		if code != http.StatusBadRequest || !strings.Contains(string(msg), "outside") {
			t.Errorf("entry %q: %d %s, want 400 outside", name, code, msg)
		}
	}
	if _, err := os.Stat(filepath.Join(b.dir, "escape")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an escaping entry was written: %v", err)
	}
	if code, _, _ := call(t, inst, http.MethodPost, agentproto.SetupPath+"files", strings.NewReader("not a tar")); code != http.StatusBadRequest {
		t.Errorf("a stream that is no tar: %d, want 400", code)
	}
	b.SetError(OpFiles, errors.New("unreadable"))
	if _, _, trailer := call(t, inst, http.MethodGet, agentproto.SetupPath+"files", nil); trailer.Get(agentproto.FilesCompleteTrailer) != "" {
		t.Error("an unfinished stream carries the trailer that says it is complete")
	}
}

// The environment the daemon sets up reaches the agent and is noted.
func TestSetupIsNotedAndPassedOn(t *testing.T) {
	inst := start(t, New(t.TempDir(), nil))
	setupEnv(t, inst, map[string]string{"A": "1"})
	setupEnv(t, inst, map[string]string{"B": "2"})
	if got := inst.Env(); len(got) != 2 || got["A"] != "1" || got["B"] != "2" {
		t.Errorf("Env() = %v", got)
	}
	if code, _, _ := call(t, inst, http.MethodPost, agentproto.SetupPath+"setup", strings.NewReader("{")); code != http.StatusBadRequest {
		t.Errorf("a bad setup: %d, want the agent's 400", code)
	}
}
