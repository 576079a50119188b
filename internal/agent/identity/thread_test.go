package identity

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/airlocktest"
)

// status is a thread's /proc status line by field name (Uid, Gid,
// Groups, CapEff).
func status(t *testing.T, path string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Error(err)
		return nil
	}
	m := map[string]string{}
	for line := range strings.SplitSeq(string(data), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	return m
}

// fsCapsIn reports which of fsCaps the hex capability set holds.
func fsCapsIn(t *testing.T, set string) []uint {
	t.Helper()
	v, err := strconv.ParseUint(set, 16, 64)
	if err != nil {
		t.Errorf("capability set %q: %v", set, err)
	}
	var held []uint
	for _, c := range fsCaps {
		if v&(1<<c) != 0 {
			held = append(held, c)
		}
	}
	return held
}

// TestActAs: the calling thread, and only it, takes the user's ids and
// groups and loses the capabilities that override file permissions;
// restore gives it back all it had.
func TestActAs(t *testing.T) {
	airlocktest.RequiresRoot(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		before := status(t, "/proc/thread-self/status")
		restore, err := ActAs(User)
		if err != nil {
			t.Errorf("ActAs: %v", err)
			return
		}
		during := status(t, "/proc/thread-self/status")
		// Real and saved stay root's, to come back; effective and file
		// system ids are the user's.
		if during["Uid"] != "0 1000 0 1000" || during["Gid"] != "0 1000 0 1000" || during["Groups"] != "1000" {
			t.Errorf("acting as the user: Uid %q Gid %q Groups %q", during["Uid"], during["Gid"], during["Groups"])
		}
		if held := fsCapsIn(t, during["CapEff"]); len(held) > 0 {
			t.Errorf("acting as the user, the thread holds capabilities %v that override file permissions", held)
		}
		if unix.Gettid() != os.Getpid() {
			if leader := status(t, "/proc/self/status"); leader["Uid"] != before["Uid"] || leader["Groups"] != before["Groups"] {
				t.Errorf("the process's first thread changed too: Uid %q Groups %q", leader["Uid"], leader["Groups"])
			}
		}
		if !restore() {
			t.Error("restore: the thread is not root's again")
		}
		after := status(t, "/proc/thread-self/status")
		for _, k := range []string{"Uid", "Gid", "Groups", "CapEff", "CapPrm"} {
			if after[k] != before[k] {
				t.Errorf("after restore, %s is %q, want %q as before", k, after[k], before[k])
			}
		}
	}()
	<-done
}

// TestAsChecksAccessAsTheUser: what f does, the kernel checks and records
// as the user's; what the agent does after, as root's again.
func TestAsChecksAccessAsTheUser(t *testing.T) {
	airlocktest.RequiresRoot(t)
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil { // the user may look in
			t.Fatal(err)
		}
	}
	open := filepath.Join(dir, "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(open, 0o777) // past the umask
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("root's"), 0o600); err != nil {
		t.Fatal(err)
	}
	users := Users{Home: dir, Root: true}
	err := users.As(users.User(), func() error {
		if err := os.WriteFile(filepath.Join(open, "mine"), []byte("x"), 0o644); err != nil {
			return err
		}
		if _, err := os.ReadFile(secret); !errors.Is(err, fs.ErrPermission) {
			t.Errorf("reading root's 0600 file: %v, want permission denied", err)
		}
		if err := os.Mkdir(filepath.Join(dir, "new"), 0o755); !errors.Is(err, fs.ErrPermission) {
			t.Errorf("making a directory in root's 0755 one: %v, want permission denied", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	owner := func(p string) (uint32, uint32) {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		return st.Uid, st.Gid
	}
	if uid, gid := owner(filepath.Join(open, "mine")); uid != 1000 || gid != 1000 {
		t.Errorf("a file made as the user is %d:%d's, want 1000:1000", uid, gid)
	}
	// Root's again, on every thread the runtime gives this goroutine.
	if err := os.WriteFile(filepath.Join(open, "agent's"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if uid, _ := owner(filepath.Join(open, "agent's")); uid != 0 || os.Geteuid() != 0 {
		t.Errorf("after As, a file the agent makes is %d's (euid %d), want root's", uid, os.Geteuid())
	}
	// For root, f runs as the agent: root's file is readable.
	if err := users.As(Root, func() error { _, err := os.ReadFile(secret); return err }); err != nil {
		t.Errorf("as root: %v", err)
	}
}
