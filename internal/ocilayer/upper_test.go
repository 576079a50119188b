package ocilayer

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func tarOf(t *testing.T, hdrs ...*tar.Header) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hdrs {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
		}
	}
	tw.Close()
	return &buf
}

func names(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		desc := h.Name
		if h.Typeflag == tar.TypeLink {
			desc += " -> " + h.Linkname
		}
		out = append(out, desc)
	}
}

// runsc's archive of gVisor's upper layer becomes an OCI layer: whiteouts
// (0:0 devices, and hard links to one) as .wh. entries, opaque
// directories with their marker, devices and skipped mount points gone.
func TestFromOverlayTar(t *testing.T) {
	in := tarOf(t,
		&tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755},
		&tar.Header{Name: "./etc/", Typeflag: tar.TypeDir, Mode: 0o755, PAXRecords: map[string]string{"SCHILY.xattr.trusted.overlay.opaque": "y"}},
		&tar.Header{Name: "./etc/app.conf", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3, Uid: 1000, Gid: 1000},
		&tar.Header{Name: "./etc/gone", Typeflag: tar.TypeChar},
		&tar.Header{Name: "./var/also-gone", Typeflag: tar.TypeLink, Linkname: "./etc/gone"},
		&tar.Header{Name: "./var/hard", Typeflag: tar.TypeLink, Linkname: "./etc/app.conf"},
		&tar.Header{Name: "./dev/null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3},
		&tar.Header{Name: "./tmp/scratch", Typeflag: tar.TypeReg, Size: 1},
		&tar.Header{Name: "./bin/sh", Typeflag: tar.TypeSymlink, Linkname: "/bin/busybox"},
		&tar.Header{Name: "./usr/local/bin/sudo", Typeflag: tar.TypeReg},
		&tar.Header{Name: "./usr/local/bin/sudoku", Typeflag: tar.TypeReg},
	)
	var out bytes.Buffer
	if err := FromOverlayTar(&out, in, []string{"tmp", "usr/local/bin/sudo"}); err != nil {
		t.Fatal(err)
	}
	want := []string{"etc/", "etc/.wh..wh..opq", "etc/app.conf", "etc/.wh.gone", "var/.wh.also-gone", "var/hard -> etc/app.conf", "bin/sh", "usr/local/bin/sudoku"}
	if got := names(t, &out); !slices.Equal(got, want) {
		t.Errorf("got %q\nwant %q", got, want)
	}
	bad := tarOf(t, &tar.Header{Name: "x", Typeflag: tar.TypeReg, Uid: 70000})
	if err := FromOverlayTar(io.Discard, bad, nil); err == nil || !strings.Contains(err.Error(), "outside the sandbox's ids") {
		t.Errorf("an owner past the sandbox's ids: %v", err)
	}
}

// The export of a writable layer stops at its limits and with its
// context: what a sandbox made must not cost the host without bound.
func TestWriteUpperLayerLimits(t *testing.T) {
	dir := t.TempDir()
	deep := dir
	for range MaxDepth + 2 {
		deep = filepath.Join(deep, "d")
	}
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		os.WriteFile(filepath.Join(dir, fmt.Sprint("f", i)), []byte("x"), 0o644)
	}
	export := func(ctx context.Context, entries int) error {
		f, err := os.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		return WriteUpperLayer(ctx, io.Discard, f, os.Getuid(), entries, nil)
	}
	if err := export(context.Background(), 1<<20); err == nil || !strings.Contains(err.Error(), "directories deep") {
		t.Errorf("a tree deeper than %d: %v", MaxDepth, err)
	}
	os.RemoveAll(filepath.Join(dir, "d"))
	if err := export(context.Background(), 5); err == nil || !strings.Contains(err.Error(), "too many entries") {
		t.Errorf("more entries than allowed: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := export(ctx, 1<<20); !errors.Is(err, context.Canceled) {
		t.Errorf("a canceled export: %v", err)
	}
	if err := export(context.Background(), 1<<20); err != nil {
		t.Errorf("within the limits: %v", err)
	}
}
