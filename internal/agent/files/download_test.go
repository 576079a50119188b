package files

import (
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"testing"
)

func TestDownload(t *testing.T) {
	base, home := newService(t)
	os.MkdirAll(filepath.Join(home, "d"), 0o755)
	if err := os.WriteFile(filepath.Join(home, "d/raw.txt"), []byte("raw bytes"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, data, hdr := files(t, "GET", at(base, "d/raw.txt"), "", nil)
	_, params, _ := mime.ParseMediaType(hdr.Get("Content-Disposition"))
	if code != http.StatusOK || string(data) != "raw bytes" || hdr.Get("Content-Length") != "9" ||
		hdr.Get("Content-Type") != "application/octet-stream" || params["filename"] != "raw.txt" {
		t.Errorf("download: %d %q %v", code, data, hdr)
	}
	// Not a regular file: streamed without a length.
	if code, data, hdr := files(t, "GET", at(base, "/dev/null"), "", nil); code != http.StatusOK || len(data) != 0 || hdr.Get("Content-Length") == "9" {
		t.Errorf("download of /dev/null: %d %q %v", code, data, hdr)
	}
	for _, tc := range []struct {
		name, url string
		want      int
	}{
		{"of nothing", at(base, "nope"), http.StatusNotFound},
		{"of a directory", at(base, "d"), http.StatusBadRequest},
		{"without a path", base + "/files", http.StatusBadRequest},
		{"as root", at(base, "d/raw.txt", "username", "root"), http.StatusForbidden},
		{"below a file", at(base, "d/raw.txt/x"), http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) { wantRefusal(t, "GET", tc.url, "", "", tc.want) })
	}
}
