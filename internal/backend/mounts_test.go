package backend

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/airlocktest"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// A mount's source is opened once, without following a symbolic link
// anywhere in its path: a link an earlier sandbox left in a directory it
// could write would otherwise give a later one what it names.
func TestOpenMountSource(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(data, "f"), []byte("x"), 0o600)
	os.Symlink(data, filepath.Join(dir, "link"))
	os.Symlink("/", filepath.Join(data, "escape"))

	f, err := OpenMountSource(data)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		t.Errorf("the source opened is no directory: %v", err)
	}
	// O_PATH: a handle, not a readable file.
	if _, err := f.Read(make([]byte, 1)); err == nil {
		t.Error("the source was opened for reading, want O_PATH")
	}
	if _, err := OpenMountSource(filepath.Join(data, "f")); err != nil {
		t.Errorf("a file as a source: %v", err)
	}
	for _, tc := range []struct{ path, want string }{
		{filepath.Join(dir, "link"), "symbolic link"},
		{filepath.Join(dir, "link", "f"), "symbolic link"},
		{filepath.Join(data, "escape"), "symbolic link"},
		{filepath.Join(data, "escape", "etc"), "symbolic link"},
		{filepath.Join(dir, "nope"), "does not exist"},
	} {
		_, err := OpenMountSource(tc.path)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Count(err.Error(), "\n") > 0 {
			t.Errorf("%s: %v, want a one-line error with %q", tc.path, err, tc.want)
		}
	}
}

// A cloned mount is private, nosuid and nodev, and read-only unless
// writable: its flags, read from the detached tree itself.
func TestCloneMount(t *testing.T) {
	airlocktest.RequiresRoot(t)
	dir := t.TempDir()
	for _, tc := range []struct {
		ro     bool
		follow bool
	}{{true, false}, {false, false}, {true, true}} {
		tree, err := CloneMount(policy.Mount{Source: dir, Target: "/mnt", ReadOnly: tc.ro}, tc.follow)
		if err != nil {
			t.Fatalf("CloneMount(ro %v, follow %v): %v", tc.ro, tc.follow, err)
		}
		var fs unix.Statfs_t
		err = unix.Fstatfs(int(tree.Fd()), &fs)
		tree.Close()
		if err != nil {
			t.Fatal(err)
		}
		if fs.Flags&unix.ST_NOSUID == 0 || fs.Flags&unix.ST_NODEV == 0 {
			t.Errorf("ro %v: flags %#x, want nosuid and nodev", tc.ro, fs.Flags)
		}
		if got := fs.Flags&unix.ST_RDONLY != 0; got != tc.ro {
			t.Errorf("read-only %v, want %v", got, tc.ro)
		}
	}
	link := filepath.Join(t.TempDir(), "link")
	os.Symlink(dir, link)
	if _, err := CloneMount(policy.Mount{Source: link, Target: "/mnt"}, false); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("a source through a link: %v", err)
	}
}
