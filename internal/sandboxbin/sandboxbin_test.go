package sandboxbin

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/airlocktest"
)

// hash is a sandbox binary's hash file as make writes it.
const hash = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n"

// withBinary makes Install read data and sum instead of what make
// embedded, for the test.
func withBinary(t *testing.T, data []byte, sum string) {
	t.Helper()
	files := fstest.MapFS{}
	if data != nil {
		files[binPath] = &fstest.MapFile{Data: data, Mode: 0o755}
	}
	if sum != "" {
		files[hashPath] = &fstest.MapFile{Data: []byte(sum)}
	}
	old := source
	source = files
	t.Cleanup(func() { source = old })
}

// trueBinary is a program that exits 0: /bin/true's bytes.
func trueBinary(t *testing.T) []byte {
	t.Helper()
	path, err := exec.LookPath("true")
	if err != nil {
		t.Skip("no true(1) here")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestInstallWithoutBinary(t *testing.T) {
	for _, tc := range []struct {
		data []byte
		sum  string
		want string
	}{
		{nil, "", "this airlock was built without its sandbox binary: build it with make build"},
		{nil, hash, "this airlock was built without its sandbox binary: build it with make build"},
		{[]byte("x"), "", "this airlock was built without its sandbox binary: build it with make build"},
		{[]byte("x"), "abc\n", `the sandbox binary's hash "abc" is malformed`},
	} {
		withBinary(t, tc.data, tc.sum)
		dir := filepath.Join(t.TempDir(), "state")
		if _, err := Install(dir); err == nil || err.Error() != tc.want {
			t.Errorf("Install with binary %q, hash %q: %v, want %q", tc.data, tc.sum, err, tc.want)
		}
	}
}

// TestInstall: the binary goes to the directory under its hash's name,
// root's, mode 0555, whole; it runs from its path and from its
// descriptor; other versions and stale temporary files go, a fresh one
// (another install under way) stays.
func TestInstall(t *testing.T) {
	airlocktest.RequiresRoot(t)
	data := trueBinary(t)
	withBinary(t, data, hash)
	dir := t.TempDir()
	for name, age := range map[string]time.Duration{"airlock-sandbox-0000000000000000": 0, ".airlock-sandbox-old": 2 * time.Minute, ".airlock-sandbox-new": 0, "unrelated": time.Hour} {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte("x"), 0o600)
		os.Chtimes(p, time.Now().Add(-age), time.Now().Add(-age))
	}
	b, err := Install(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "airlock-sandbox-0123456789abcdef"); b.Path != want {
		t.Errorf("installed at %s, want %s", b.Path, want)
	}
	var st unix.Stat_t
	if err := unix.Stat(b.Path, &st); err != nil || st.Uid != 0 || st.Mode&0o7777 != 0o555 {
		t.Errorf("the file: uid %d, mode %o (%v)", st.Uid, st.Mode&0o7777, err)
	}
	if got, err := os.ReadFile(b.Path); err != nil || !bytes.Equal(got, data) {
		t.Errorf("the file's content differs (%v)", err)
	}
	var fst unix.Stat_t
	if err := unix.Fstat(int(b.File.Fd()), &fst); err != nil || fst.Ino != st.Ino {
		t.Errorf("the descriptor is not the file: %v", err)
	}
	for _, path := range []string{b.Path, "/proc/self/fd/3"} {
		cmd := exec.Command(path)
		if path != b.Path {
			cmd.ExtraFiles = []*os.File{b.File}
		}
		if err := cmd.Run(); err != nil {
			t.Errorf("running %s: %v", path, err)
		}
	}
	left, _ := os.ReadDir(dir)
	var names []string
	for _, e := range left {
		names = append(names, e.Name())
	}
	if got := strings.Join(names, " "); got != ".airlock-sandbox-new airlock-sandbox-0123456789abcdef unrelated" {
		t.Errorf("left in the directory: %s", got)
	}
	if again, err := Install(dir); err != nil || again != b {
		t.Errorf("a second Install: %v %v, want the first's result", again, err)
	}
}

// TestInstallRefusesWhatIsThere: a file at the binary's path that is not
// the binary as Install leaves it is an error, never replaced or run:
// only root writes the directory, so something else put it there.
func TestInstallRefusesWhatIsThere(t *testing.T) {
	data := []byte("#!/bin/sh\nexit 0\n")
	withBinary(t, data, hash)
	for _, tc := range []struct {
		what string
		make func(path string) error
	}{
		{"a file of the wrong size", func(p string) error { return os.WriteFile(p, []byte("short"), 0o555) }},
		{"a file of another mode", func(p string) error { return os.WriteFile(p, data, 0o755) }},
		{"a symbolic link", func(p string) error { return os.Symlink("/bin/true", p) }},
		{"a directory", func(p string) error { return os.Mkdir(p, 0o555) }},
		{"a file of another owner", func(p string) error {
			if err := os.WriteFile(p, data, 0o555); err != nil {
				return err
			}
			if os.Geteuid() == 0 { // as anyone else, the file is that user's already
				return os.Chown(p, 65534, 65534)
			}
			return nil
		}},
	} {
		dir := t.TempDir()
		path := filepath.Join(dir, "airlock-sandbox-0123456789abcdef")
		if err := tc.make(path); err != nil {
			t.Fatal(err)
		}
		before, _ := os.Lstat(path)
		_, err := Install(dir)
		if err == nil || !strings.Contains(err.Error(), "is not the sandbox binary airlock installs (owner, mode or size differ): remove it") {
			t.Errorf("%s: %v", tc.what, err)
		}
		if after, _ := os.Lstat(path); !os.SameFile(before, after) {
			t.Errorf("%s was replaced", tc.what)
		}
	}
}
