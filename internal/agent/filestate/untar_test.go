package filestate

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// TestUntar: a build's COPY writes the stream's directories, files and
// links with their modes (setuid and sticky bits too), times and owners.
func TestUntar(t *testing.T) {
	c, base := newService(t, true)
	dst := filepath.Join(base, "app", "new")
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Unix(1e9, 0)
	for _, h := range []*tar.Header{
		{Name: ".", Typeflag: tar.TypeDir, Mode: 0o750},
		{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "bin/tool", Typeflag: tar.TypeReg, Mode: 0o4755, Size: 4},
		{Name: "shared/", Typeflag: tar.TypeDir, Mode: 0o1777},
		{Name: "link", Typeflag: tar.TypeSymlink, Linkname: "bin/tool"},
		{Name: "fifo", Typeflag: tar.TypeFifo, Mode: 0o644},
	} {
		h.Uid, h.Gid, h.ModTime = os.Getuid(), os.Getgid(), mtime
		tw.WriteHeader(h)
		if h.Size > 0 {
			tw.Write([]byte("tool"))
		}
	}
	tw.Close()
	if err := c.Untar(t.Context(), dst, false, &buf); err != nil {
		t.Fatal(err)
	}
	for name, mode := range map[string]os.FileMode{
		".": os.ModeDir | 0o750, "bin/tool": os.ModeSetuid | 0o755, "shared": os.ModeDir | os.ModeSticky | 0o777,
	} {
		fi, err := os.Lstat(filepath.Join(dst, name))
		if err != nil || fi.Mode() != mode || (name == "bin/tool" && !fi.ModTime().Equal(mtime)) {
			t.Errorf("%s: %v %v, %v; want %v", name, fi.Mode(), fi.ModTime(), err, mode)
		}
	}
	if target, err := os.Readlink(filepath.Join(dst, "link")); err != nil || target != "bin/tool" {
		t.Errorf("link: %q, %v", target, err)
	}
	if _, err := os.Lstat(filepath.Join(dst, "fifo")); !os.IsNotExist(err) {
		t.Errorf("a fifo was written: %v", err)
	}
}

// TestUntarOnlyNew: with onlyNew, a directory there already keeps its
// own mode; the files land in it all the same.
func TestUntarOnlyNew(t *testing.T) {
	c, base := newService(t, true)
	dst := filepath.Join(base, "existing")
	os.Mkdir(dst, 0o700)
	stream := func() *bytes.Reader {
		return bytes.NewReader(tarOf(fuzzEntry{name: ".", typ: tar.TypeDir}, fuzzEntry{name: "f", body: "x", typ: tar.TypeReg}))
	}
	if err := c.Untar(t.Context(), dst, true, stream()); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(dst); fi.Mode().Perm() != 0o700 {
		t.Errorf("onlyNew: the directory's mode became %v", fi.Mode())
	}
	if got, _ := os.ReadFile(filepath.Join(dst, "f")); string(got) != "x" {
		t.Errorf("the file: %q", got)
	}
	if err := c.Untar(t.Context(), dst, false, stream()); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(dst); fi.Mode().Perm() != 0o755 {
		t.Errorf("without onlyNew: the directory's mode %v, want the stream's 0755", fi.Mode())
	}
}

func TestUntarRefused(t *testing.T) {
	user, _ := newService(t, false)
	var e *agentproto.Error
	if err := user.Untar(t.Context(), "/tmp/x", false, strings.NewReader("")); !errors.As(err, &e) || !strings.Contains(e.Message, "only a sandbox's root") {
		t.Errorf("an agent that is not root: %v", err)
	}
	root, base := newService(t, true)
	for name, tc := range map[string]struct {
		dir    string
		stream []byte
	}{
		"a relative directory":     {"app", tarOf()},
		"a directory below a file": {filepath.Join(base, "file", "x"), tarOf()},
		"an entry climbing out":    {filepath.Join(base, "app"), tarOf(fuzzEntry{name: "../x", body: "x", typ: tar.TypeReg})},
		"not a tar stream":         {filepath.Join(base, "app"), []byte(strings.Repeat("y", 1024))},
	} {
		os.WriteFile(filepath.Join(base, "file"), nil, 0o644)
		if err := root.Untar(t.Context(), tc.dir, false, bytes.NewReader(tc.stream)); !errors.As(err, &e) || e.Message == "" {
			t.Errorf("%s: %v, want the agent's refusal", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(base, "x")); !os.IsNotExist(err) {
		t.Errorf("an entry landed outside: %v", err)
	}
}

func TestUnixBits(t *testing.T) {
	for m, want := range map[int64]os.FileMode{
		0o4755: os.ModeSetuid, 0o2755: os.ModeSetgid, 0o1777: os.ModeSticky, 0o7000: os.ModeSetuid | os.ModeSetgid | os.ModeSticky, 0o777: 0,
	} {
		if got := unixBits(m); got != want {
			t.Errorf("%o: %v, want %v", m, got, want)
		}
	}
}
