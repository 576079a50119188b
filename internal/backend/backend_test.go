package backend

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/policy"
)

func TestCappedWriter(t *testing.T) {
	var out bytes.Buffer
	w := NewCappedWriter(&out, 10)
	for _, chunk := range []string{"abcd", "efgh", "ijkl", "mnop"} {
		if n, err := w.Write([]byte(chunk)); n != len(chunk) || err != nil {
			t.Fatalf("Write(%q) = %d, %v: the sandbox's writes are always consumed", chunk, n, err)
		}
	}
	if out.String() != "abcdefghij" || !w.Truncated() {
		t.Errorf("got %q, truncated %v", out.String(), w.Truncated())
	}
	exact := NewCappedWriter(&bytes.Buffer{}, 4)
	exact.Write([]byte("abcd"))
	if exact.Truncated() {
		t.Error("output of exactly the limit reported truncated")
	}
	// No writer: everything is drained, nothing kept.
	if n, err := NewCappedWriter(nil, 5).Write([]byte("xyz")); n != 3 || err != nil {
		t.Errorf("nil writer: %d %v", n, err)
	}
}

// failing fails every write after the first.
type failing struct{ writes int }

func (f *failing) Write(b []byte) (int, error) {
	if f.writes++; f.writes > 1 {
		return 0, errors.New("reader gone")
	}
	return len(b), nil
}

// A reader that went away stops the copying, never the sandbox.
func TestCappedWriterReaderGone(t *testing.T) {
	f := &failing{}
	w := NewCappedWriter(f, 100)
	for range 3 {
		if n, err := w.Write([]byte("data")); n != 4 || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	if f.writes != 2 {
		t.Errorf("%d writes reached the failed reader, want 2", f.writes)
	}
}

// lines collects what a logger logs as "line".
type lines struct {
	mu  sync.Mutex
	got []string
}

func (l *lines) Enabled(context.Context, slog.Level) bool { return true }
func (l *lines) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "line" {
			l.mu.Lock()
			l.got = append(l.got, a.Value.String())
			l.mu.Unlock()
		}
		return true
	})
	return nil
}
func (l *lines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *lines) WithGroup(string) slog.Handler      { return l }

func TestLineLog(t *testing.T) {
	h := &lines{}
	w := LineLog(slog.New(h))
	w.Write([]byte("first line\nsecond "))
	w.Write([]byte("half\n\nthird"))
	long := strings.Repeat("x", 5000)
	w.Write([]byte(long))
	want := []string{"first line", "second half", "", "third" + long}
	if len(h.got) != len(want) {
		t.Fatalf("logged %d lines %.60q, want %d", len(h.got), h.got, len(want))
	}
	for i := range want {
		if h.got[i] != want[i] {
			t.Errorf("line %d: %.40q, want %.40q", i, h.got[i], want[i])
		}
	}
	// Two streams at once, each line whole.
	h.got = nil
	var wg sync.WaitGroup
	for _, s := range []string{"aaaa\n", "bbbb\n"} {
		wg.Go(func() {
			for range 100 {
				w.Write([]byte(s))
			}
		})
	}
	wg.Wait()
	for _, l := range h.got {
		if l != "aaaa" && l != "bbbb" {
			t.Fatalf("a line of two streams mixed: %q", l)
		}
	}
}

func TestCheckSpec(t *testing.T) {
	ok := Spec{Policy: policy.Default(), Argv: []string{"x"}, Files: []File{{Name: "main.py"}}}
	if err := CheckSpec(&ok); err != nil {
		t.Fatalf("a valid spec: %v", err)
	}
	for _, name := range []string{"", ".", "..", "a/b", "../x", "nul\x00"} {
		s := ok
		s.Files = []File{{Name: name}}
		if err := CheckSpec(&s); err == nil || !strings.Contains(err.Error(), "single path element") {
			t.Errorf("file %q: %v", name, err)
		}
	}
	s := ok
	s.Argv = nil
	if err := CheckSpec(&s); err == nil {
		t.Error("no command: accepted")
	}
	s = ok
	s.Policy.Pids = -1
	if err := CheckSpec(&s); err == nil {
		t.Error("an invalid policy: accepted")
	}
	dir := t.TempDir()
	os.Symlink(dir, filepath.Join(dir, "link"))
	for src, want := range map[string]string{filepath.Join(dir, "link"): "symbolic link", filepath.Join(dir, "missing"): "does not exist"} {
		s = ok
		s.Policy.Mounts = []policy.Mount{{Source: src, Target: "/data", ReadOnly: true}}
		if err := CheckSpec(&s); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("mount source %s: %v, want %q", src, err, want)
		}
	}
}

func TestCheckNetNS(t *testing.T) {
	netns, err := os.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer netns.Close()
	none, open := policy.Default(), policy.Default()
	none.Network.Mode = policy.NetNone
	open.Network.Mode = policy.NetInternet
	for _, c := range []struct {
		p     policy.Policy
		netns *os.File
		ok    bool
	}{{none, nil, true}, {none, netns, false}, {open, netns, true}, {open, nil, false}} {
		if err := CheckNetNS(&c.p, c.netns); (err == nil) != c.ok {
			t.Errorf("mode %v, netns %v: %v", c.p.Network.Mode, c.netns != nil, err)
		}
	}
}

func TestErrors(t *testing.T) {
	if e := (&SetupError{Msg: "mount proc: EPERM"}).Error(); e != "sandbox setup failed: mount proc: EPERM" {
		t.Errorf("SetupError: %q", e)
	}
	if e := (&StateError{Reason: "is corrupt"}).Error(); e != "the saved state is corrupt" {
		t.Errorf("StateError: %q", e)
	}
}

// A mount's source is taken through no symlink, anywhere in its path.
func TestOpenMountSource(t *testing.T) {
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "real"), 0o755)
	os.Symlink("real", filepath.Join(dir, "link"))
	f, err := OpenMountSource(filepath.Join(dir, "real"))
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	for _, p := range []string{filepath.Join(dir, "link"), filepath.Join(dir, "link", ".")} {
		if _, err := OpenMountSource(p); err == nil || !strings.Contains(err.Error(), "symbolic link") {
			t.Errorf("%s: %v", p, err)
		}
	}
}

// A clone of a host mount is private, nosuid and nodev, and read-only
// unless writable.
func TestCloneMount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CI runs as root): open_tree clones a mount")
	}
	dir := t.TempDir()
	for _, ro := range []bool{true, false} {
		tree, err := CloneMount(policy.Mount{Source: dir, Target: "/data", ReadOnly: ro}, false)
		if err != nil {
			t.Fatal(err)
		}
		var st unix.Statfs_t
		err = unix.Fstatfs(int(tree.Fd()), &st)
		tree.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got := st.Flags&unix.ST_RDONLY != 0; got != ro || st.Flags&unix.ST_NOSUID == 0 || st.Flags&unix.ST_NODEV == 0 {
			t.Errorf("read-only %v: flags %#x", ro, st.Flags)
		}
	}
	if _, err := CloneMount(policy.Mount{Source: filepath.Join(dir, "missing")}, true); err == nil {
		t.Error("cloned a missing source")
	}
}
