package gvisor

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestAppendMissing(t *testing.T) {
	const line = "user:x:1000:1000::/home/user:/bin/sh\n"
	for _, tc := range []struct{ in, want string }{
		{"", line},
		{"root:x:0:0::/root:/bin/sh\n", "root:x:0:0::/root:/bin/sh\n" + line},
		{"root:x:0:0::/root:/bin/sh", "root:x:0:0::/root:/bin/sh\n" + line},
		{"user:x:1001:1001::/u:/bin/sh\n", "user:x:1001:1001::/u:/bin/sh\n"}, // the image's own user stays
		{"username:x:5:5::/x:/bin/sh\n", "username:x:5:5::/x:/bin/sh\n" + line},
	} {
		if got := appendMissing([]byte(tc.in), "user:", line); string(got) != tc.want {
			t.Errorf("appendMissing(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// An image is untrusted: its /etc/passwd is read inside its root only, and
// only as a small regular file.
func TestReadImageFile(t *testing.T) {
	root := t.TempDir()
	outside := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(outside, []byte("host"), 0o644)
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0::/root:/bin/sh\n"), 0o644)
	os.Symlink("passwd", filepath.Join(root, "etc/inside"))
	os.Symlink(outside, filepath.Join(root, "etc/absolute"))
	os.Symlink("../../"+filepath.Base(filepath.Dir(outside))+"/secret", filepath.Join(root, "etc/relative"))
	os.Mkdir(filepath.Join(root, "etc/dir"), 0o755)
	syscall.Mkfifo(filepath.Join(root, "etc/fifo"), 0o644)
	os.WriteFile(filepath.Join(root, "etc/big"), bytes.Repeat([]byte("x"), 1<<20+1), 0o644)
	if got, err := readImageFile(root, "etc/passwd"); err != nil || string(got) != "root:x:0:0::/root:/bin/sh\n" {
		t.Errorf("passwd: %q %v", got, err)
	}
	if got, err := readImageFile(root, "etc/inside"); err != nil || !strings.HasPrefix(string(got), "root:") {
		t.Errorf("a link inside the root: %q %v", got, err)
	}
	if got, err := readImageFile(root, "etc/group"); err != nil || got != nil {
		t.Errorf("a missing file: %q %v, want nothing", got, err)
	}
	for _, rel := range []string{"etc/absolute", "etc/relative", "etc/dir", "etc/fifo", "etc/big"} {
		got, err := readImageFile(root, rel)
		if err == nil {
			t.Errorf("%s: read %q", rel, got)
		} else if strings.Contains(err.Error(), outside) || strings.Contains(err.Error(), root) {
			t.Errorf("%s: the error names a host path: %v", rel, err)
		}
	}
}

// What overlayfs cannot take is refused before anything is mounted.
func TestMountOverlayRefuses(t *testing.T) {
	dir := t.TempDir()
	for _, lowers := range [][]string{{"/a", "/b:c"}, {"/a,b", "/c"}, {`/a\b`, "/c"}} {
		if err := mountOverlay(dir, lowers); err == nil || !strings.Contains(err.Error(), "cannot be given to overlayfs") {
			t.Errorf("%q: %v", lowers, err)
		}
	}
	var many []string
	for range 200 {
		many = append(many, "/var/lib/airlock/images/layers/0123456789abcdef0123456789abcdef")
	}
	if err := mountOverlay(dir, many); err == nil || !strings.Contains(err.Error(), "too many layers") {
		t.Errorf("200 layers: %v", err)
	}
}

func TestFirstLine(t *testing.T) {
	for in, want := range map[string]string{"": "", "one": "one", "\n  two\nthree\n": "two", "a\r\nb": "a\r"} {
		if got := firstLine([]byte(in)); got != want {
			t.Errorf("firstLine(%q) = %q, want %q", in, got, want)
		}
	}
}
