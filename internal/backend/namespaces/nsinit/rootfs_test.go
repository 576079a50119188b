package nsinit

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/layout"
)

// What rootBuilder does without mounting anything, on a plain directory:
// the files and modes of the sandbox's root.

func mode(t *testing.T, p string) uint32 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Mode & 0o7777
}

func TestRootBuilderFiles(t *testing.T) {
	r := &rootBuilder{dir: t.TempDir()}
	r.mkdir("tmp", 0o1777) // sticky: the raw bits, not os.FileMode's
	r.mkdir("home/user", 0o700)
	r.mkdir(layout.CodeDir[1:], 0o755)
	r.write(layout.CodeDir[1:]+"/main.py", []byte("print(1)"), 0o444)
	r.symlink("/proc/self/fd", "dev/fd") // its parent is missing: the first error
	r.mkdir("after", 0o755)              // skipped after an error
	if r.err == nil || !strings.Contains(r.err.Error(), "symlink dev/fd") {
		t.Fatalf("err %v, want the symlink's", r.err)
	}
	if m := mode(t, r.path("tmp")); m != 0o1777 {
		t.Errorf("tmp mode %o, want 1777", m)
	}
	if m := mode(t, r.path("home/user")); m != 0o700 {
		t.Errorf("home mode %o", m)
	}
	if m := mode(t, r.path(".airlock/main.py")); m != 0o444 {
		t.Errorf("code file mode %o", m)
	}
	if _, err := os.Stat(r.path("after")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a step after an error ran: %v", err)
	}
}

// An image may have anything where the sandbox puts its own: a symlink
// is replaced, never followed.
func TestRootBuilderReplacesNeverFollows(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "host-file")
	os.WriteFile(outside, []byte("host"), 0o644)
	r := &rootBuilder{dir: t.TempDir()}
	r.mkdir("etc", 0o755)
	os.Symlink(outside, r.path("etc/hosts"))
	os.Symlink(outside, r.path("etc/hostname"))
	r.replace("etc/hosts", []byte("127.0.0.1 localhost\n"), 0o644)
	r.symlink("/elsewhere", "etc/hostname")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if got, _ := os.ReadFile(outside); string(got) != "host" {
		t.Errorf("the symlink's target was written: %q", got)
	}
	if fi, _ := os.Lstat(r.path("etc/hosts")); !fi.Mode().IsRegular() {
		t.Errorf("etc/hosts is %v", fi.Mode())
	}
	if target, _ := os.Readlink(r.path("etc/hostname")); target != "/elsewhere" {
		t.Errorf("etc/hostname -> %q", target)
	}
	// A directory in the way of a file is an error, not a write into it.
	r.mkdir("etc/resolv.conf", 0o755)
	os.WriteFile(r.path("etc/resolv.conf/x"), nil, 0o644)
	r.replace("etc/resolv.conf", []byte("x"), 0o644)
	if r.err == nil {
		t.Error("replaced a directory")
	}
}

// An image's /etc gets the sandbox's network files and its user, where
// the image has none; the image's own lines stay.
func TestImageEtc(t *testing.T) {
	r := &rootBuilder{dir: t.TempDir()}
	r.mkdir("etc", 0o755)
	os.WriteFile(r.path("etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh\napp:x:10:10::/app:/bin/sh"), 0o644)
	os.WriteFile(r.path("etc/hosts"), []byte("10.0.0.1 image\n"), 0o644)
	r.imageEtc(true)
	if r.err != nil {
		t.Fatal(r.err)
	}
	passwd, _ := os.ReadFile(r.path("etc/passwd"))
	want := "root:x:0:0:root:/root:/bin/sh\napp:x:10:10::/app:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n"
	if string(passwd) != want {
		t.Errorf("passwd %q, want %q", passwd, want)
	}
	group, _ := os.ReadFile(r.path("etc/group"))
	if string(group) != "user:x:1000:\n" {
		t.Errorf("group %q", group)
	}
	gen := layout.GeneratedEtc(true)
	for _, name := range []string{"hosts", "hostname", "resolv.conf"} {
		if got, _ := os.ReadFile(r.path("etc/" + name)); string(got) != string(gen[name]) {
			t.Errorf("%s %q, want %q", name, got, gen[name])
		}
	}
	// Again: the user is there, and is not added twice.
	r.imageEtc(false)
	if again, _ := os.ReadFile(r.path("etc/passwd")); string(again) != want {
		t.Errorf("passwd after a second pass %q", again)
	}
	if got, _ := os.ReadFile(r.path("etc/resolv.conf")); strings.Contains(string(got), "nameserver") {
		t.Errorf("resolv.conf of a sandbox without a network: %q", got)
	}
}

// An image whose /etc/passwd is not a regular file is refused: the
// sandbox's user would be appended wherever it points.
func TestImageEtcRefusesLinks(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "passwd")
	os.WriteFile(outside, []byte("host\n"), 0o644)
	r := &rootBuilder{dir: t.TempDir()}
	r.mkdir("etc", 0o755)
	os.Symlink(outside, r.path("etc/passwd"))
	r.imageEtc(false)
	if r.err == nil || !strings.Contains(r.err.Error(), "not a regular file") {
		t.Errorf("err %v", r.err)
	}
	if got, _ := os.ReadFile(outside); string(got) != "host\n" {
		t.Errorf("the link's target was written: %q", got)
	}
}

// mirror reproduces a merged-/usr host's top-level symlinks as they are
// and skips what the host lacks; bindEntry recreates /etc's symlinks.
func TestMirrorAndBindEntryLinks(t *testing.T) {
	host := t.TempDir()
	os.Symlink("usr/bin", filepath.Join(host, "bin"))
	os.Symlink("/etc/alternatives/x", filepath.Join(host, "alt"))
	r := &rootBuilder{dir: t.TempDir()}
	r.mirror(filepath.Join(host, "bin"), "bin")
	r.mirror(filepath.Join(host, "missing"), "missing")
	r.mkdir("etc", 0o755)
	fi, _ := os.Lstat(filepath.Join(host, "alt"))
	r.bindEntry(filepath.Join(host, "alt"), "etc/alt", fi)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if target, _ := os.Readlink(r.path("bin")); target != "usr/bin" {
		t.Errorf("bin -> %q", target)
	}
	if target, _ := os.Readlink(r.path("etc/alt")); target != "/etc/alternatives/x" {
		t.Errorf("etc/alt -> %q", target)
	}
	if _, err := os.Lstat(r.path("missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing host entry was made: %v", err)
	}
}

// Each step fails closed with what it was doing, and the first failure
// is the one reported.
func TestRootBuilderErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		step func(r *rootBuilder)
		want string
	}{
		{"a bind of a missing host path", func(r *rootBuilder) { r.bind("/nonexistent/airlock", "x", true) }, "bind /nonexistent/airlock"},
		{"a write into a missing directory", func(r *rootBuilder) { r.write("missing/file", nil, 0o644) }, "write missing/file"},
		{"an attach of a closed descriptor", func(r *rootBuilder) { r.attach(-1, "x") }, "mount x"},
		{"a file's lines in a directory", func(r *rootBuilder) { r.mkdir("etc/passwd", 0o755); r.appendMissing("etc/passwd", "u:", "u\n") }, "not a regular file"},
		{"a host link where a directory is", func(r *rootBuilder) {
			host := filepath.Join(t.TempDir(), "bin")
			os.Symlink("usr/bin", host)
			r.mkdir("bin/sub", 0o755)
			r.mirror(host, "bin")
		}, "symlink bin"},
	} {
		r := &rootBuilder{dir: t.TempDir()}
		tc.step(r)
		if r.err == nil || !strings.Contains(r.err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, r.err, tc.want)
		}
		first := r.err
		r.fail("later")
		if r.err != first {
			t.Errorf("%s: a later failure replaced the first", tc.name)
		}
	}
}
