package files

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"maps"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agent/filesystem/filesystemtest"
)

func TestUpload(t *testing.T) {
	base, home := newService(t)
	code, data, _ := files(t, "POST", at(base, "d/raw.txt"), "application/octet-stream", bytes.NewReader([]byte("raw bytes")))
	var w []written
	if code != http.StatusOK || json.Unmarshal(data, &w) != nil || len(w) != 1 ||
		w[0] != (written{Name: "raw.txt", Type: "file", Path: filepath.Join(home, "d/raw.txt")}) {
		t.Fatalf("octet-stream upload: %d %s", code, data)
	}
	if got, _ := os.ReadFile(filepath.Join(home, "d/raw.txt")); string(got) != "raw bytes" {
		t.Errorf("the file after an upload: %q", got)
	}
	// An upload replaces what was there.
	files(t, "POST", at(base, "d/raw.txt"), "application/octet-stream", strings.NewReader("new"))
	if got, _ := os.ReadFile(filepath.Join(home, "d/raw.txt")); string(got) != "new" {
		t.Errorf("the file after a second upload: %q", got)
	}

	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte("unzipped"))
	zw.Close()
	code, data, _ = files(t, "POST", at(base, "gz.txt"), "application/octet-stream", &gz, "Content-Encoding", "gzip")
	if got, _ := os.ReadFile(filepath.Join(home, "gz.txt")); code != http.StatusOK || string(got) != "unzipped" {
		t.Errorf("gzip upload: %d %s, file %q", code, data, got)
	}

	for _, tc := range []struct {
		name, url, contentType, body string
		hdr                          []string
		want                         int
	}{
		{"as root", at(base, "x", "username", "root"), "application/octet-stream", "x", nil, http.StatusForbidden},
		{"of text/plain", at(base, "x"), "text/plain", "x", nil, http.StatusBadRequest},
		{"without a path", base + "/files", "application/octet-stream", "x", nil, http.StatusBadRequest},
		{"of bad gzip", at(base, "x"), "application/octet-stream", "not gzip", []string{"Content-Encoding", "gzip"}, http.StatusBadRequest},
		{"below a file", at(base, "d/raw.txt/x"), "application/octet-stream", "x", nil, http.StatusBadRequest},
		{"onto a directory", at(base, "d"), "application/octet-stream", "x", nil, http.StatusInternalServerError},
		{"of a broken multipart", at(base, "x"), "multipart/form-data; boundary=b", "--b\r\nbroken", nil, http.StatusBadRequest},
		{"of a multipart without a boundary", at(base, "x"), "multipart/form-data", "", nil, http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) { wantRefusal(t, "POST", tc.url, tc.contentType, tc.body, tc.want, tc.hdr...) })
	}
	if _, err := os.Stat(filepath.Join(home, "x")); !os.IsNotExist(err) {
		t.Errorf("a refused upload wrote its file: %v", err)
	}
}

// TestUploadMultipart: one file per "file" part, named by its file name
// when the query names none (a path, not only a base name); other parts
// are skipped, and a form without a file is refused.
func TestUploadMultipart(t *testing.T) {
	base, home := newService(t)
	form := func(parts map[string]string, field string) (*bytes.Buffer, string) {
		var mp bytes.Buffer
		mw := multipart.NewWriter(&mp)
		mw.WriteField("other", "ignored")
		for name, content := range parts {
			part, _ := mw.CreateFormFile(field, name)
			part.Write([]byte(content))
		}
		mw.Close()
		return &mp, mw.FormDataContentType()
	}
	body, ct := form(map[string]string{"m/one.txt": "1", "two.txt": "2"}, "file")
	code, data, _ := files(t, "POST", base+"/files", ct, body)
	var w []written
	if code != http.StatusOK || json.Unmarshal(data, &w) != nil || len(w) != 2 {
		t.Fatalf("multipart upload: %d %s", code, data)
	}
	for name, content := range map[string]string{"m/one.txt": "1", "two.txt": "2"} {
		if got, err := os.ReadFile(filepath.Join(home, name)); err != nil || string(got) != content {
			t.Errorf("%s after multipart upload: %q %v", name, got, err)
		}
	}
	// The query's path wins over the part's name.
	body, ct = form(map[string]string{"ignored.txt": "q"}, "file")
	files(t, "POST", at(base, "q.txt"), ct, body)
	if got, _ := os.ReadFile(filepath.Join(home, "q.txt")); string(got) != "q" {
		t.Errorf("q.txt after an upload to it: %q", got)
	}
	body, ct = form(map[string]string{"f.txt": "x"}, "notfile")
	wantRefusal(t, "POST", base+"/files", ct, body.String(), http.StatusBadRequest)
}

// File metadata as envd 0.6.2 keeps it: set by an upload's X-Metadata-*
// headers, replaced whole by the next upload, reported by Stat and
// ListDir, refused (and nothing written) when a key or value is not
// printable ASCII or the set is too large.
func TestFileMetadata(t *testing.T) {
	base, home := newService(t)
	upload := func(path, body string, hdr ...string) (int, []byte) {
		t.Helper()
		code, data, _ := files(t, "POST", at(base, path), "application/octet-stream", strings.NewReader(body), hdr...)
		return code, data
	}

	code, data := upload("m.txt", "v1", "X-Metadata-Author", "ada", "x-metadata-Build-ID", "42")
	var w []struct {
		Path     string            `json:"path"`
		Metadata map[string]string `json:"metadata"`
	}
	want := map[string]string{"author": "ada", "build-id": "42"}
	if code != http.StatusOK || json.Unmarshal(data, &w) != nil || len(w) != 1 || !maps.Equal(w[0].Metadata, want) {
		t.Fatalf("upload with metadata: %d %s, want the metadata %v back", code, data, want)
	}
	if e := filesystemtest.Stat(t, base, "m.txt"); !maps.Equal(e.Metadata, want) {
		t.Errorf("Stat: metadata %v, want %v", e.Metadata, want)
	}
	if es := filesystemtest.ListDir(t, base, "~", 1); len(es) != 1 || !maps.Equal(es[0].Metadata, want) {
		t.Errorf("ListDir: %+v, want one entry with %v", es, want)
	}

	// The next upload replaces the set: a key it does not name is gone.
	if code, data := upload("m.txt", "v2", "X-Metadata-Author", "grace"); code != http.StatusOK {
		t.Fatalf("second upload: %d %s", code, data)
	}
	if e := filesystemtest.Stat(t, base, "m.txt"); !maps.Equal(e.Metadata, map[string]string{"author": "grace"}) {
		t.Errorf("after a second upload: %v, want only author=grace", e.Metadata)
	}

	for name, hdr := range map[string][]string{
		"a value that is not ASCII": {"X-Metadata-Author", "Ada Lovelace \u00e9"},
		"a key too long":            {"X-Metadata-" + strings.Repeat("k", 247), "v"},
		"a set too large":           {"X-Metadata-Big", strings.Repeat("v", 4096)},
	} {
		if code, data := upload("m.txt", "v3", hdr...); code != http.StatusBadRequest || !strings.Contains(string(data), "metadata") {
			t.Errorf("%s: %d %s, want 400 naming the metadata", name, code, data)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(home, "m.txt")); string(got) != "v2" {
		t.Errorf("a refused upload changed the file: %q", got)
	}

	// An upload without any header clears the set.
	upload("m.txt", "v4")
	if e := filesystemtest.Stat(t, base, "m.txt"); e.Metadata != nil {
		t.Errorf("after an upload without metadata: %v, want none", e.Metadata)
	}
}
