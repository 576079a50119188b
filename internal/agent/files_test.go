package agent_test

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"maps"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agent/rpc/rpctest"
)

type entry struct {
	Name          string            `json:"name"`
	Type          string            `json:"type"`
	Path          string            `json:"path"`
	Size          string            `json:"size"` // int64, a string in proto3 JSON
	Mode          uint32            `json:"mode"`
	Permissions   string            `json:"permissions"`
	Owner         string            `json:"owner"`
	Group         string            `json:"group"`
	ModifiedTime  string            `json:"modifiedTime"`
	SymlinkTarget *string           `json:"symlinkTarget"`
	Metadata      map[string]string `json:"metadata"`
}

type entryResponse struct {
	Entry entry `json:"entry"`
}

func stat(t *testing.T, url, path string) entry {
	t.Helper()
	var r entryResponse
	rpctest.MustUnary(t, url, "filesystem.Filesystem/Stat", map[string]any{"path": path}, &r)
	return r.Entry
}

func listDir(t *testing.T, url, path string, depth int) []entry {
	t.Helper()
	var r struct {
		Entries []entry `json:"entries"`
	}
	rpctest.MustUnary(t, url, "filesystem.Filesystem/ListDir", map[string]any{"path": path, "depth": depth}, &r)
	return r.Entries
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

func TestFiles(t *testing.T) {
	base, home := newAgent(t)
	at := func(path string, more ...string) string {
		q := url.Values{"path": {path}}
		for i := 0; i+1 < len(more); i += 2 {
			q.Set(more[i], more[i+1])
		}
		return base + "/files?" + q.Encode()
	}

	code, data, _ := files(t, "POST", at("d/raw.txt"), "application/octet-stream", bytes.NewReader([]byte("raw bytes")))
	var w []written
	if code != http.StatusOK || json.Unmarshal(data, &w) != nil || len(w) != 1 ||
		w[0] != (written{Name: "raw.txt", Type: "file", Path: filepath.Join(home, "d/raw.txt")}) {
		t.Fatalf("octet-stream upload: %d %s", code, data)
	}
	code, data, hdr := files(t, "GET", at("d/raw.txt"), "", nil)
	if code != http.StatusOK || string(data) != "raw bytes" || hdr.Get("Content-Length") != "9" {
		t.Errorf("download: %d %q %v", code, data, hdr)
	}

	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte("unzipped"))
	zw.Close()
	code, data, _ = files(t, "POST", at("gz.txt"), "application/octet-stream", &gz, "Content-Encoding", "gzip")
	if got, _ := os.ReadFile(filepath.Join(home, "gz.txt")); code != http.StatusOK || string(got) != "unzipped" {
		t.Errorf("gzip upload: %d %s, file %q", code, data, got)
	}

	// Multipart: one file per part, named by its file name when the query
	// names none (a path, not only a base name).
	var mp bytes.Buffer
	mw := multipart.NewWriter(&mp)
	for name, content := range map[string]string{"m/one.txt": "1", "two.txt": "2"} {
		part, _ := mw.CreateFormFile("file", name)
		part.Write([]byte(content))
	}
	mw.Close()
	code, data, _ = files(t, "POST", base+"/files", mw.FormDataContentType(), &mp)
	w = nil
	if code != http.StatusOK || json.Unmarshal(data, &w) != nil || len(w) != 2 {
		t.Fatalf("multipart upload: %d %s", code, data)
	}
	for name, content := range map[string]string{"m/one.txt": "1", "two.txt": "2"} {
		if got, err := os.ReadFile(filepath.Join(home, name)); err != nil || string(got) != content {
			t.Errorf("%s after multipart upload: %q %v", name, got, err)
		}
	}

	for _, tc := range []struct {
		name, method, url, contentType string
		body                           string
		want                           int
	}{
		{"download of nothing", "GET", at("nope"), "", "", http.StatusNotFound},
		{"download of a directory", "GET", at("d"), "", "", http.StatusBadRequest},
		{"download without a path", "GET", base + "/files", "", "", http.StatusBadRequest},
		{"download as root", "GET", at("d/raw.txt", "username", "root"), "", "", http.StatusForbidden},
		{"upload as root", "POST", at("x", "username", "root"), "application/octet-stream", "x", http.StatusForbidden},
		{"upload of text/plain", "POST", at("x"), "text/plain", "x", http.StatusBadRequest},
		{"upload without a path", "POST", base + "/files", "application/octet-stream", "x", http.StatusBadRequest},
		{"upload of bad gzip", "POST", at("x"), "application/octet-stream", "not gzip", http.StatusBadRequest},
		{"upload below a file", "POST", at("d/raw.txt/x"), "application/octet-stream", "x", http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hdr []string
			if tc.name == "upload of bad gzip" {
				hdr = []string{"Content-Encoding", "gzip"}
			}
			code, data, _ := files(t, tc.method, tc.url, tc.contentType, bytes.NewReader([]byte(tc.body)), hdr...)
			var e struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if code != tc.want || json.Unmarshal(data, &e) != nil || e.Code != tc.want || e.Message == "" {
				t.Errorf("got %d %s, want %d with {code, message}", code, data, tc.want)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(home, "x")); !os.IsNotExist(err) {
		t.Errorf("a refused upload wrote its file: %v", err)
	}
}

// File metadata as envd 0.6.2 keeps it: set by an upload's X-Metadata-*
// headers, replaced whole by the next upload, reported by Stat and
// ListDir, refused (and nothing written) when a key or value is not
// printable ASCII or the set is too large.
func TestFileMetadata(t *testing.T) {
	base, home := newAgent(t)
	at := func(path string) string { return base + "/files?" + url.Values{"path": {path}}.Encode() }
	upload := func(path, body string, hdr ...string) (int, []byte) {
		t.Helper()
		code, data, _ := files(t, "POST", at(path), "application/octet-stream", strings.NewReader(body), hdr...)
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
	if e := stat(t, base, "m.txt"); !maps.Equal(e.Metadata, want) {
		t.Errorf("Stat: metadata %v, want %v", e.Metadata, want)
	}
	if es := listDir(t, base, "~", 1); len(es) != 1 || !maps.Equal(es[0].Metadata, want) {
		t.Errorf("ListDir: %+v, want one entry with %v", es, want)
	}

	// The next upload replaces the set: a key it does not name is gone.
	if code, data := upload("m.txt", "v2", "X-Metadata-Author", "grace"); code != http.StatusOK {
		t.Fatalf("second upload: %d %s", code, data)
	}
	if e := stat(t, base, "m.txt"); !maps.Equal(e.Metadata, map[string]string{"author": "grace"}) {
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
	if e := stat(t, base, "m.txt"); e.Metadata != nil {
		t.Errorf("after an upload without metadata: %v, want none", e.Metadata)
	}
}
