package volume

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/airlocktest"
)

// testStore opens a store of 32 MiB volumes in a directory of the test,
// checking that the host can hold one (root, loop devices, mkfs.ext4),
// and that nothing of it is left mounted or attached at the end.
func testStore(t *testing.T) (*Store, string) {
	t.Helper()
	airlocktest.RequiresRoot(t)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("volumes need loop devices: %v", err)
	}
	dir := t.TempDir()
	s, err := Open(dir, 32<<20, "", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
		if m := airlocktest.MountsUnder(dir); len(m) > 0 {
			t.Errorf("mounts left: %v", m)
		}
		// A loop device detaches once its file system is gone, which a
		// lazy unmount leaves to the kernel's own time.
		l := loopsOf(dir)
		for deadline := time.Now().Add(10 * time.Second); len(l) > 0 && time.Now().Before(deadline); l = loopsOf(dir) {
			time.Sleep(10 * time.Millisecond)
		}
		if len(l) > 0 {
			t.Errorf("loop devices left: %v", l)
		}
	})
	return s, dir
}

// loopsOf lists the loop devices whose backing file is under dir.
func loopsOf(dir string) []string {
	var out []string
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), dir) {
			out = append(out, f)
		}
	}
	return out
}

// created makes volume name in s and returns it with its mount point.
func created(t *testing.T, s *Store, name string) (*Volume, string) {
	t.Helper()
	v, err := s.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	mnt, err := s.Mountpoint(v.ID)
	if err != nil {
		t.Fatal(err)
	}
	return v, mnt
}

func files(t *testing.T, s *Store, id string) *Files {
	t.Helper()
	f, err := s.Files(id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestCreateAndFiles(t *testing.T) {
	s, _ := testStore(t)
	v, err := s.Create("data")
	if err != nil {
		t.Fatal(err)
	}
	if !validID(v.ID) {
		t.Errorf("id %q is not of the UUID form", v.ID)
	}
	if _, err := s.Create("data"); !errors.Is(err, ErrInvalid) {
		t.Errorf("a second volume named data: %v", err)
	}
	for _, bad := range []string{"", "a/b", "..", "a b", strings.Repeat("a", 251)} {
		if _, err := s.Create(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("name %q: %v", bad, err)
		}
	}
	f := files(t, s, v.ID)
	root, err := f.Stat("/")
	if err != nil {
		t.Fatal(err)
	}
	if root.Type != "directory" || root.UID != DefaultUID || root.GID != DefaultGID {
		t.Errorf("the root: %+v, want a directory of user's", root)
	}
	if l, err := f.List("/", 1); err != nil || len(l) != 0 {
		t.Errorf("a new volume lists %v, %v; want nothing (no lost+found)", l, err)
	}

	e, err := f.WriteFile("/a/b/c.txt", strings.NewReader("hello"), DefaultUID, DefaultGID, DefaultFileMode, false)
	if !errors.Is(err, ErrPathNotFound) {
		t.Errorf("write under missing directories without force: %v, %v", e, err)
	}
	e, err = f.WriteFile("a/b/c.txt", strings.NewReader("hello"), 1000, 1000, 0o640, true)
	if err != nil {
		t.Fatal(err)
	}
	if e.Path != "/a/b/c.txt" || e.Name != "c.txt" || e.Type != "file" || e.Size != 5 || e.Mode != 0o640 || e.UID != 1000 {
		t.Errorf("written: %+v", e)
	}
	if _, err := f.WriteFile("/a/b/c.txt", strings.NewReader("x"), 1000, 1000, 0o644, false); !errors.Is(err, ErrExists) {
		t.Errorf("a second write without force: %v", err)
	}
	r, err := f.Open("/a/b/c.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r)
	r.Close()
	if string(b) != "hello" {
		t.Errorf("read %q", b)
	}
	if _, err := f.Mkdir("/a", 1000, 1000, 0o755, false); !errors.Is(err, ErrExists) {
		t.Errorf("mkdir of an existing directory: %v", err)
	}
	if e, err := f.Mkdir("/a/b/d/e", 1000, 1000, 0o750, true); err != nil || e.Type != "directory" || e.Mode != 0o750 {
		t.Errorf("mkdir with parents: %+v, %v", e, err)
	}
	list, err := f.List("/a", 3)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, e := range list {
		paths = append(paths, e.Path)
	}
	if got := strings.Join(paths, " "); got != "/a/b /a/b/c.txt /a/b/d /a/b/d/e" {
		t.Errorf("list /a depth 3: %s", got)
	}
	if _, err := f.List("/", MaxDepth+1); !errors.Is(err, ErrBadPath) {
		t.Errorf("depth %d: %v", MaxDepth+1, err)
	}
	mode, uid := uint32(0o600), 0
	if e, err := f.SetAttr("/a/b/c.txt", &uid, nil, &mode); err != nil || e.Mode != 0o600 || e.UID != 0 || e.GID != 1000 {
		t.Errorf("setattr: %+v, %v", e, err)
	}
	if err := f.Remove("/"); !errors.Is(err, ErrBadPath) {
		t.Errorf("remove the root: %v", err)
	}
	if err := f.Remove("/a"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Stat("/a"); !errors.Is(err, ErrPathNotFound) {
		t.Errorf("after remove: %v", err)
	}
	if err := f.Remove("/a"); !errors.Is(err, ErrPathNotFound) {
		t.Errorf("remove of nothing: %v", err)
	}
}

// TestSizeIsTheVolumes: a volume holds its size and no more, and its
// space on the host is reserved when it is made.
func TestSizeIsTheVolumes(t *testing.T) {
	s, dir := testStore(t)
	v, err := s.Create("small")
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, v.ID, "image"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 < v.Size {
		t.Errorf("the image holds %d bytes of the host's disk, want its %d reserved", st.Blocks*512, v.Size)
	}
	f := files(t, s, v.ID)
	_, err = f.WriteFile("/big", io.LimitReader(zeros{}, 2*v.Size), 1000, 1000, 0o644, false)
	if !errors.Is(err, ErrFull) {
		t.Errorf("writing twice the volume's size: %v, want it full", err)
	}
	if err := unix.Stat(filepath.Join(dir, v.ID, "image"), &st); err != nil || st.Size != v.Size {
		t.Errorf("the image grew: %d bytes, %v", st.Size, err)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// TestHostileEntries: what a sandbox may leave in a volume leads no file
// operation out of it, nor blocks one.
func TestHostileEntries(t *testing.T) {
	s, _ := testStore(t)
	v, mnt := created(t, s, "hostile")
	outside := filepath.Join(t.TempDir(), "outside")
	os.WriteFile(outside, []byte("host"), 0o644)
	// As a sandbox would make them, inside its mount of the volume.
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Symlink(outside, filepath.Join(mnt, "link")))
	must(os.Symlink(filepath.Dir(outside), filepath.Join(mnt, "linkdir")))
	must(os.Symlink("/", filepath.Join(mnt, "root")))
	must(unix.Mkfifo(filepath.Join(mnt, "fifo"), 0o666))
	must(unix.Mknod(filepath.Join(mnt, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	sparse, err := os.Create(filepath.Join(mnt, "sparse"))
	must(err)
	must(sparse.Truncate(1 << 40))
	sparse.Close()

	f := files(t, s, v.ID)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, p := range []string{"link", "linkdir/outside", "root/etc/passwd", "fifo", "null"} {
			if r, err := f.Open(p); err == nil {
				r.Close()
				t.Errorf("read %s: opened", p)
			}
			if _, err := f.WriteFile(p, strings.NewReader("pwned"), 0, 0, 0o644, true); err == nil {
				t.Errorf("write %s: written", p)
			}
		}
		// ".." is the volume's root at most, as E2B reads paths.
		if e, err := f.WriteFile("../../etc/passwd", strings.NewReader("mine"), 0, 0, 0o644, true); err != nil || e.Path != "/etc/passwd" {
			t.Errorf("write ../../etc/passwd: %+v, %v", e, err)
		}
		if _, err := f.Mkdir("linkdir/new", 0, 0, 0o755, true); err == nil {
			t.Error("mkdir through a symlink")
		}
		if _, err := f.SetAttr("link", nil, nil, ptr(uint32(0o777))); err == nil {
			t.Error("chmod of a symlink")
		}
		if e, err := f.Stat("link"); err != nil || e.Type != "symlink" || e.Target != outside {
			t.Errorf("stat of the symlink: %+v, %v", e, err)
		}
		if e, err := f.Stat("fifo"); err != nil || e.Type != "unknown" {
			t.Errorf("stat of the fifo: %+v, %v", e, err)
		}
		// The sparse file streams as what it is, never held whole.
		if r, err := f.Open("sparse"); err != nil {
			t.Errorf("open the sparse file: %v", err)
		} else {
			n, _ := io.CopyN(io.Discard, r, 64<<20)
			r.Close()
			if n != 64<<20 {
				t.Errorf("read %d bytes of the sparse file", n)
			}
		}
		for _, p := range []string{"linkdir", "root", "link"} {
			if err := f.Remove(p); err != nil {
				t.Errorf("remove %s: %v", p, err)
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("a file operation blocked")
	}
	if b, _ := os.ReadFile(outside); string(b) != "host" {
		t.Errorf("the host's file: %q", b)
	}
	if _, err := os.Stat(filepath.Dir(outside)); err != nil {
		t.Errorf("the host's directory: %v", err)
	}
	if b, _ := os.ReadFile("/etc/passwd"); !strings.HasPrefix(string(b), "root:") {
		t.Errorf("the host's /etc/passwd: %q", b)
	}
}

func ptr[T any](v T) *T { return &v }

// TestReopen: volumes and their files outlive the store, and a crashed
// daemon's mount (a store never closed) and half-made volume are cleaned
// up by the next Open.
func TestReopen(t *testing.T) {
	s, dir := testStore(t)
	v, err := s.Create("kept")
	if err != nil {
		t.Fatal(err)
	}
	f := files(t, s, v.ID)
	if _, err := f.WriteFile("/x", bytes.NewReader([]byte("kept")), 1000, 1000, 0o644, false); err != nil {
		t.Fatal(err)
	}
	f.Close()
	os.Mkdir(filepath.Join(dir, ".new-half"), 0o700)
	// A second daemon while the first runs is refused.
	if _, err := Open(dir, 32<<20, "", slog.New(slog.DiscardHandler)); err == nil {
		t.Fatal("a second store opened the volumes of a live one")
	}
	// As after kill -9: s is never closed, its mount stays, its lock
	// goes with its process.
	s.lock.Close()
	s.lock = nil
	s2, err := Open(dir, 32<<20, "", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	s.mounted = map[string]bool{} // s2 owns the mounts now
	t.Cleanup(func() { s2.Close() })
	if _, err := os.Stat(filepath.Join(dir, ".new-half")); !os.IsNotExist(err) {
		t.Errorf("a half-made volume stays: %v", err)
	}
	if m := airlocktest.MountsUnder(filepath.Join(dir, v.ID)); len(m) != 1 {
		t.Errorf("mounts of the volume after reopening: %v, want the new one alone", m)
	}
	got, err := s2.ByName("kept")
	if err != nil || got.ID != v.ID {
		t.Fatalf("after reopening: %+v, %v", got, err)
	}
	f2 := files(t, s2, v.ID)
	r, err := f2.Open("/x")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r)
	r.Close()
	if string(b) != "kept" {
		t.Errorf("read %q", b)
	}
}

// TestDeleteMounted: a volume a sandbox mounts is deleted as on E2B; the
// sandbox's mount keeps the file system until it goes, then nothing of
// it is left.
func TestDeleteMounted(t *testing.T) {
	s, dir := testStore(t)
	v, mnt := created(t, s, "doomed")
	// A sandbox's mount: a clone of the volume's, as the backends make.
	tree, err := unix.OpenTree(unix.AT_FDCWD, mnt, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(v.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(v.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("after delete: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, v.ID)); !os.IsNotExist(err) {
		t.Errorf("its directory: %v", err)
	}
	unix.Close(tree)
	// The loop device detaches once the last mount is gone.
	for deadline := time.Now().Add(5 * time.Second); len(loopsOf(dir)) > 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
	}
}

// TestOneFileSystemPerImage: a volume whose mount a sandbox still holds
// when the store closes (a lazy unmount: its loop device stays) is
// mounted again through that same device by the next store, never a
// second ext4 on the same blocks.
func TestOneFileSystemPerImage(t *testing.T) {
	s, dir := testStore(t)
	_, mnt := created(t, s, "held")
	tree, err := unix.OpenTree(unix.AT_FDCWD, mnt, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(tree)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(dir, 32<<20, "", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if l := loopsOf(dir); len(l) != 1 {
		t.Errorf("loop devices of the volume's image: %v, want the one", l)
	}
}

// TestListingBounded: a listing of what a sandbox made to be huge stops
// at its bound, whole directories of names included.
func TestListingBounded(t *testing.T) {
	s, _ := testStore(t)
	v, mnt := created(t, s, "huge")
	// Long names and link targets, within the volume's inodes.
	target := strings.Repeat("x", 1000)
	name := strings.Repeat("n", 240)
	for i := range maxListed/(len(target)+2*len(name)) + 10 {
		if err := os.Symlink(target, filepath.Join(mnt, fmt.Sprint("l", i, name))); err != nil {
			t.Fatal(err)
		}
	}
	f := files(t, s, v.ID)
	if _, err := f.List("/", 1); !errors.Is(err, ErrBadPath) || !strings.Contains(err.Error(), "MiB of names") {
		t.Errorf("a listing of %d MiB of link targets: %v", maxListed>>20, err)
	}
	if err := f.Remove("/l1" + name); err != nil {
		t.Error(err)
	}
}
