package ocilayer

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"path"
	"strings"
	"testing"
)

// overlaySeeds are runsc archives of an upper layer, as the sandbox can
// make its contents be: whiteouts, opaque directories, devices, links
// out of the layer, names with "..", owners past the sandbox's.
func overlaySeeds() [][]byte {
	archive := func(hdrs ...*tar.Header) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range hdrs {
			tw.WriteHeader(h)
			tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
		}
		tw.Close()
		return buf.Bytes()
	}
	// claim is the header alone of an entry whose contents never come.
	claim := func(h *tar.Header) []byte {
		var buf bytes.Buffer
		tar.NewWriter(&buf).WriteHeader(h)
		return buf.Bytes()
	}
	return [][]byte{
		archive(
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
		),
		archive(&tar.Header{Name: "../../../etc/passwd", Typeflag: tar.TypeReg, Size: 1}),
		archive(&tar.Header{Name: "/abs/../..//x/./", Typeflag: tar.TypeDir}),
		archive(&tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "../../../../etc/shadow"}),
		archive(&tar.Header{Name: "tmp/../tmp/x", Typeflag: tar.TypeReg}, &tar.Header{Name: "tmpx", Typeflag: tar.TypeReg}),
		archive(&tar.Header{Name: "d", Typeflag: tar.TypeBlock, Devmajor: 8}, &tar.Header{Name: "f", Typeflag: tar.TypeFifo, Mode: 0o7777 | 0o170000}),
		archive(&tar.Header{Name: "x", Typeflag: tar.TypeReg, Uid: 70000}),
		archive(&tar.Header{Name: "x", Typeflag: tar.TypeReg, Gid: -1}),
		archive(&tar.Header{Name: ".wh..wh..opq", Typeflag: tar.TypeReg}, &tar.Header{Name: "a/.wh.b", Typeflag: tar.TypeReg}),
		archive(&tar.Header{Name: "ключ/値😀", Typeflag: tar.TypeReg, Size: 2}),
		archive(&tar.Header{Name: strings.Repeat("d/", 300) + "f", Typeflag: tar.TypeReg}),
		claim(&tar.Header{Name: "big", Typeflag: tar.TypeReg, Size: 1 << 40}),
		[]byte("not a tar stream"),
		{},
	}
}

// FuzzFromOverlayTar: the sandbox's upper layer (any bytes) never
// panics, and what it becomes is an OCI layer of local names only,
// none under the skipped paths, of directories, files, symbolic links,
// hardlinks within the layer and FIFOs alone, owned by the sandbox's
// ids.
func FuzzFromOverlayTar(f *testing.F) {
	for _, s := range overlaySeeds() {
		f.Add(s)
	}
	skip := []string{"tmp", "usr/local/bin/sudo", "proc"}
	local := func(p string) bool {
		return p != "" && !path.IsAbs(p) && p == path.Clean(p) && p != ".." && !strings.HasPrefix(p, "../")
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var out bytes.Buffer
		if err := FromOverlayTar(&out, bytes.NewReader(data), skip); err != nil {
			return
		}
		tr := tar.NewReader(&out)
		for n := 0; ; n++ {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("the layer made of %q is not a tar stream: %v", data, err)
			}
			if n > 2*len(data)/512 {
				t.Fatalf("%d entries from %d bytes", n, len(data))
			}
			name := strings.TrimSuffix(h.Name, "/")
			switch {
			case !local(name):
				t.Errorf("entry %q is not a local name", h.Name)
			case h.Typeflag == tar.TypeDir != strings.HasSuffix(h.Name, "/"):
				t.Errorf("entry %q of type %q", h.Name, h.Typeflag)
			case h.Typeflag == tar.TypeLink && !local(h.Linkname):
				t.Errorf("entry %q links to %q, outside the layer", h.Name, h.Linkname)
			case h.Uid < 0 || h.Uid > MaxID || h.Gid < 0 || h.Gid > MaxID:
				t.Errorf("entry %q is owned by %d:%d", h.Name, h.Uid, h.Gid)
			case h.Mode&^0o7777 != 0:
				t.Errorf("entry %q has mode %o", h.Name, h.Mode)
			}
			switch h.Typeflag {
			case tar.TypeDir, tar.TypeReg, tar.TypeSymlink, tar.TypeLink, tar.TypeFifo:
			default:
				t.Errorf("entry %q is of type %q", h.Name, h.Typeflag)
			}
			for _, s := range skip {
				if name == s || strings.HasPrefix(name, s+"/") {
					t.Errorf("entry %q is under the skipped %q", h.Name, s)
				}
			}
		}
	})
}
