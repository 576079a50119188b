package ocilayer

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
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
	)
	var out bytes.Buffer
	if err := FromOverlayTar(&out, in, []string{"tmp"}); err != nil {
		t.Fatal(err)
	}
	want := []string{"etc/", "etc/.wh..wh..opq", "etc/app.conf", "etc/.wh.gone", "var/.wh.also-gone", "var/hard -> etc/app.conf", "bin/sh"}
	if got := names(t, &out); !slices.Equal(got, want) {
		t.Errorf("got %q\nwant %q", got, want)
	}
	bad := tarOf(t, &tar.Header{Name: "x", Typeflag: tar.TypeReg, Uid: 70000})
	if err := FromOverlayTar(io.Discard, bad, nil); err == nil || !strings.Contains(err.Error(), "outside the sandbox's ids") {
		t.Errorf("an owner past the sandbox's ids: %v", err)
	}
}
