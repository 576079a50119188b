package cgroups

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// fakeFS is a cgroup file system in a temporary directory, as runc's
// tests make one: a test writes what the kernel would show (statistics,
// events, the processes in a cgroup) and reads what the package wrote.
// Its rmdir and kill do the kernel's part: a cgroup's control files go
// with its directory, one that holds processes cannot be removed, and a
// killed process leaves cgroup.procs.
type fakeFS struct {
	t *testing.T
	*tree

	mu     sync.Mutex
	killed []int
	onKill func(pid int) // after pid left its cgroup: a fork, say
}

// fakeV1 makes a v1 host mounting the hierarchies named; "a,b" is one
// hierarchy mounted under both names too, as cpu,cpuacct is.
func fakeV1(t *testing.T, hierarchies ...string) *fakeFS {
	root := t.TempDir()
	for _, h := range hierarchies {
		if err := os.Mkdir(filepath.Join(root, h), 0o755); err != nil {
			t.Fatal(err)
		}
		if names := strings.Split(h, ","); len(names) > 1 {
			for _, n := range names {
				if err := os.Symlink(h, filepath.Join(root, n)); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	f := &fakeFS{t: t}
	f.tree = newTree(root, false, f.rmdir, f.kill)
	return f
}

// fakeV2 makes a v2 host.
func fakeV2(t *testing.T) *fakeFS {
	f := &fakeFS{t: t}
	f.tree = newTree(t.TempDir(), true, f.rmdir, f.kill)
	return f
}

// hostV1 is the hybrid layout of the hosts Airlock runs on.
var hostV1 = []string{"memory", "pids", "cpu,cpuacct", "freezer", "blkio", "devices"}

func (f *fakeFS) path(rel string) string { return filepath.Join(f.root, rel) }

// rewritable makes the files the cgroup wrote (mode 0, as the kernel's
// are to no one but root) writable again by the test's user.
func (f *fakeFS) rewritable() {
	filepath.WalkDir(f.root, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() { // not cpu, a link to cpu,cpuacct
			os.Chmod(path, 0o644)
		}
		return nil
	})
}

// read returns a file the package wrote (with mode 0, as cgroupfs never
// minds: readable here for a test that is not root).
func (f *fakeFS) read(rel string) string {
	f.t.Helper()
	os.Chmod(f.path(rel), 0o644)
	data, err := os.ReadFile(f.path(rel))
	if err != nil {
		f.t.Fatal(err)
	}
	return string(data)
}

// put writes what the kernel shows in rel.
func (f *fakeFS) put(rel, content string) {
	f.t.Helper()
	if err := os.WriteFile(f.path(rel), []byte(content), 0o644); err != nil {
		f.t.Fatal(err)
	}
	os.Chmod(f.path(rel), 0o644)
}

func (f *fakeFS) exists(rel string) bool {
	_, err := os.Lstat(f.path(rel))
	return err == nil
}

func (f *fakeFS) rmdir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() {
			return unix.ENOTEMPTY
		}
	}
	if data, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs")); len(strings.Fields(string(data))) > 0 {
		return unix.EBUSY
	}
	for _, e := range entries {
		os.Remove(filepath.Join(dir, e.Name()))
	}
	return os.Remove(dir)
}

// kill takes pid out of every cgroup called name, where it is, as its
// death would.
func (f *fakeFS) kill(pid int, name string) {
	procs, _ := filepath.Glob(filepath.Join(f.root, "*", name, "cgroup.procs"))
	if top := filepath.Join(f.root, name, "cgroup.procs"); f.exists(name + "/cgroup.procs") {
		procs = append(procs, top)
	}
	for _, p := range procs {
		data, _ := os.ReadFile(p)
		var left []string
		for _, s := range strings.Fields(string(data)) {
			if s != strconv.Itoa(pid) {
				left = append(left, s)
			}
		}
		os.WriteFile(p, []byte(strings.Join(left, "\n")), 0o644)
	}
	f.mu.Lock()
	f.killed = append(f.killed, pid)
	onKill := f.onKill
	f.mu.Unlock()
	if onKill != nil {
		onKill(pid)
	}
}

func (f *fakeFS) killedPids() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.killed)
}

// The fake's kernel part, checked once: what the tests of the package
// rely on it for.
func TestFakeFS(t *testing.T) {
	f := fakeV1(t, "memory")
	os.Mkdir(f.path("memory/a"), 0o755)
	os.Mkdir(f.path("memory/a/b"), 0o755)
	if err := f.rmdir(f.path("memory/a")); !errors.Is(err, unix.ENOTEMPTY) {
		t.Errorf("rmdir of a parent: %v", err)
	}
	os.Mkdir(f.path("memory/c"), 0o755)
	f.put("memory/c/cgroup.procs", "7\n8\n")
	if err := f.rmdir(f.path("memory/c")); !errors.Is(err, unix.EBUSY) {
		t.Errorf("rmdir of a populated cgroup: %v", err)
	}
	f.kill(7, "c")
	if got := f.read("memory/c/cgroup.procs"); got != "8" {
		t.Errorf("after a kill: %q", got)
	}
	f.kill(8, "c")
	if err := f.rmdir(f.path("memory/c")); err != nil || f.exists("memory/c") {
		t.Errorf("rmdir of an empty cgroup: %v", err)
	}
}
