package volume

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Files of a volume, as E2B's volume content API reads and writes them,
// without a sandbox. Sandboxes that mount the volume may have left
// anything in it: symbolic links to the host's files, FIFOs that block an
// open, device nodes, files sparse to terabytes, directories nested
// without end. So the daemon (host root) never resolves a path in it by
// name: every path is opened with openat2 beneath the descriptor of the
// volume's root, refusing symbolic links, magic links and other mounts
// on the way (RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_XDEV); a
// file is opened O_NOFOLLOW|O_NONBLOCK and used only if fstat says it is
// a regular file; what it creates it creates relative to its parent's
// descriptor, O_EXCL or O_NOFOLLOW. The mount itself is nodev: a device
// node in a volume opens nothing.

// Entry is one entry's E2B VolumeEntryStat.
type Entry struct {
	Name   string    `json:"name"`
	Type   string    `json:"type"` // "file", "directory", "symlink", "unknown"
	Path   string    `json:"path"`
	Size   int64     `json:"size"`
	Mode   uint32    `json:"mode"` // permission bits
	UID    uint32    `json:"uid"`
	GID    uint32    `json:"gid"`
	Atime  time.Time `json:"atime"`
	Mtime  time.Time `json:"mtime"`
	Ctime  time.Time `json:"ctime"`
	Target string    `json:"target,omitempty"` // a symlink's, never followed
}

// Errors of file operations.
var (
	ErrPathNotFound = errors.New("path not found")
	ErrExists       = errors.New("path already exists")
	ErrBadPath      = errors.New("invalid path")
	ErrFull         = errors.New("the volume is full")
	ErrBusy         = errors.New("the path is busy")
)

// Owner and modes of what the API creates when it names none: user's
// (uid 1000 in every sandbox), with E2B's modes.
const (
	DefaultUID      = 1000
	DefaultGID      = 1000
	DefaultFileMode = 0o666
	DefaultDirMode  = 0o777
)

// Limits of one request.
const (
	MaxDepth   = 10      // a listing's, as E2B's
	maxEntries = 100_000 // a listing's entries
	maxListed  = 8 << 20 // a listing's names, paths and link targets, in bytes
	maxNesting = 256     // a recursive removal's directories
)

// Files is a volume's root, held open.
type Files struct {
	root *os.File // O_PATH|O_DIRECTORY
}

// Files opens volume id's files (mounting it if it is not yet); the
// caller closes them.
func (s *Store) Files(id string) (*Files, error) {
	mnt, err := s.Mountpoint(id)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open(mnt, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("volume %s: %w", id, err)
	}
	return &Files{root: os.NewFile(uintptr(fd), mnt)}, nil
}

// Close closes f.
func (f *Files) Close() error { return f.root.Close() }

// clean is p as E2B reads it: absolute and cleaned, "/" the root; and
// the same relative to the root ("." for the root itself). A NUL is
// refused.
func clean(p string) (abs, rel string, err error) {
	if p == "" || strings.ContainsRune(p, 0) {
		return "", "", fmt.Errorf("%w: %q", ErrBadPath, p)
	}
	abs = path.Clean("/" + p)
	rel = strings.TrimPrefix(abs, "/")
	if rel == "" {
		rel = "."
	}
	return abs, rel, nil
}

// resolve is how every path in a volume is resolved.
const resolve = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// openBeneath opens rel beneath dir with flags (O_CLOEXEC added). A few
// tries: EAGAIN is a rename that raced the lookup, or a lease a sandbox
// holds on the file (an O_NONBLOCK open does not wait for it), which
// may never end: then the file is busy.
func openBeneath(dir int, rel string, flags uint64) (int, error) {
	for try := 0; ; try++ {
		fd, err := unix.Openat2(dir, rel, &unix.OpenHow{Flags: flags | unix.O_CLOEXEC, Resolve: resolve})
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN) && try < 8:
			continue
		case errors.Is(err, unix.EAGAIN):
			return -1, fmt.Errorf("%w (a lease is held on it, or it keeps being renamed): try again", ErrBusy)
		}
		return fd, pathErr(err)
	}
}

// pathErr is err as the API answers it.
func pathErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.ENOENT):
		return ErrPathNotFound
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
		return fmt.Errorf("%w: it goes through a symbolic link or out of the volume", ErrBadPath)
	case errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("%w: a part of it is not a directory", ErrBadPath)
	case errors.Is(err, unix.EEXIST):
		return ErrExists
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return ErrFull
	}
	return err
}

// Stat returns the entry at p, a symbolic link as itself.
func (f *Files) Stat(p string) (*Entry, error) {
	fd, abs, err := f.openPath(p)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return entryOf(fd, "", abs)
}

// openPath opens p itself (O_PATH: a symbolic link as itself), and
// returns it with its clean absolute form.
func (f *Files) openPath(p string) (int, string, error) {
	abs, rel, err := clean(p)
	if err != nil {
		return -1, "", err
	}
	fd, err := openBeneath(int(f.root.Fd()), rel, unix.O_PATH|unix.O_NOFOLLOW)
	return fd, abs, err
}

// entryOf is the entry of name in dir (name "": dir itself), at abs.
func entryOf(dir int, name, abs string) (*Entry, error) {
	var st unix.Stat_t
	flags := unix.AT_SYMLINK_NOFOLLOW
	if name == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	if err := unix.Fstatat(dir, name, &st, flags); err != nil {
		return nil, pathErr(err)
	}
	e := &Entry{
		Name: path.Base(abs), Path: abs, Size: st.Size, Mode: st.Mode & 0o7777, UID: st.Uid, GID: st.Gid,
		Atime: time.Unix(st.Atim.Unix()).UTC(), Mtime: time.Unix(st.Mtim.Unix()).UTC(), Ctime: time.Unix(st.Ctim.Unix()).UTC(),
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		e.Type = "file"
	case unix.S_IFDIR:
		e.Type = "directory"
	case unix.S_IFLNK:
		e.Type = "symlink"
		buf := make([]byte, unix.PathMax)
		if n, err := unix.Readlinkat(dir, name, buf); err == nil {
			e.Target = string(buf[:n])
		}
	default:
		e.Type = "unknown"
	}
	if abs == "/" {
		e.Name = "/"
	}
	return e, nil
}

// List returns the entries below directory p, depth levels down (1: its
// own), each directory followed by its entries; p itself is not one.
func (f *Files) List(p string, depth int) ([]*Entry, error) {
	if depth < 1 {
		depth = 1
	}
	if depth > MaxDepth {
		return nil, fmt.Errorf("%w: depth %d is more than %d", ErrBadPath, depth, MaxDepth)
	}
	abs, rel, err := clean(p)
	if err != nil {
		return nil, err
	}
	fd, err := openBeneath(int(f.root.Fd()), rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW)
	if err != nil {
		return nil, err
	}
	l := &listing{}
	err = l.list(fd, abs, depth)
	unix.Close(fd)
	return l.out, err
}

// listing is a listing under way, bounded in entries and bytes: a
// sandbox may have made a million names, each of 255 bytes, or links
// with targets of 4 KiB.
type listing struct {
	out   []*Entry
	bytes int
}

var errTooMany = fmt.Errorf("%w: more than %d entries or %d MiB of names: list a smaller depth or a directory below", ErrBadPath, maxEntries, maxListed>>20)

// list appends the entries of dir (at abs), and those below its
// directories down to depth; it closes nothing of the caller's.
func (l *listing) list(dir int, abs string, depth int) error {
	names, err := readNames(dir, maxEntries-len(l.out))
	if err != nil {
		return err
	}
	for _, name := range names {
		e, err := entryOf(dir, name, path.Join(abs, name))
		if errors.Is(err, ErrPathNotFound) {
			continue // removed meanwhile
		}
		if err != nil {
			return err
		}
		l.bytes += len(e.Name) + len(e.Path) + len(e.Target)
		if len(l.out) >= maxEntries || l.bytes > maxListed {
			return errTooMany
		}
		l.out = append(l.out, e)
		if e.Type == "directory" && depth > 1 {
			sub, err := openBeneath(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW)
			if errors.Is(err, ErrPathNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			err = l.list(sub, e.Path, depth-1)
			unix.Close(sub)
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// readNames reads the names in directory dir, sorted, from the start,
// without "." and "..": at most max of them, or errTooMany. It leaves
// dir open.
func readNames(dir int, max int) ([]string, error) {
	f, err := rewound(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var names []string
	for {
		batch, err := f.Readdirnames(1024)
		names = append(names, batch...)
		if len(names) > max {
			return nil, errTooMany
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	slices.Sort(names)
	return names, nil
}

// firstNames reads at most n names of directory dir, from its start.
func firstNames(dir, n int) ([]string, error) {
	f, err := rewound(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(n)
	if errors.Is(err, io.EOF) {
		err = nil
	}
	return names, err
}

// rewound is a duplicate of directory dir, to be read from its start
// and closed by the caller; dir stays open.
func rewound(dir int) (*os.File, error) {
	dup, err := unix.Dup(dir)
	if err != nil {
		return nil, err
	}
	unix.CloseOnExec(dup)
	f := os.NewFile(uintptr(dup), "dir")
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// parent opens the directory that holds rel (creating the missing ones,
// with mkdirs, owned and moded as given), and returns it with rel's last
// name. The root itself has no parent.
func (f *Files) parent(rel string, mkdirs bool, uid, gid int, mode uint32) (int, string, error) {
	if rel == "." {
		return -1, "", fmt.Errorf("%w: the volume's root", ErrBadPath)
	}
	dirRel, name := path.Split(rel)
	dirRel = strings.TrimSuffix(dirRel, "/")
	dir, err := unix.Dup(int(f.root.Fd()))
	if err != nil {
		return -1, "", err
	}
	unix.CloseOnExec(dir)
	if dirRel == "" {
		return dir, name, nil
	}
	for _, part := range strings.Split(dirRel, "/") {
		next, err := openBeneath(dir, part, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW)
		if errors.Is(err, ErrPathNotFound) && mkdirs {
			if err = mkdirAt(dir, part, uid, gid, mode); err == nil || errors.Is(err, ErrExists) {
				next, err = openBeneath(dir, part, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW)
			}
		}
		unix.Close(dir)
		if err != nil {
			return -1, "", err
		}
		dir = next
	}
	return dir, name, nil
}

// mkdirAt makes directory name in dir, owned and moded as given (the
// mode set after the umask). Owner and mode are set on the directory
// opened after it was made, never by name: a sandbox that swaps the name
// meanwhile for a link to another of the volume's files does not have
// that file chowned.
func mkdirAt(dir int, name string, uid, gid int, mode uint32) error {
	if err := unix.Mkdirat(dir, name, 0o700); err != nil {
		return pathErr(err)
	}
	fd, err := openBeneath(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Fchown(fd, uid, gid); err != nil {
		return err
	}
	return unix.Fchmod(fd, mode&0o7777)
}

// chmodFD sets the mode of what fd (O_PATH) is, unless it is a symbolic
// link: through /proc/self/fd, which names that inode and no path.
func chmodFD(fd int, mode uint32) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return fmt.Errorf("%w: a symbolic link has no mode of its own", ErrBadPath)
	}
	return unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), mode&0o7777)
}

// Mkdir makes directory p. With parents, missing ones are made too, and
// a directory already there is no error.
func (f *Files) Mkdir(p string, uid, gid int, mode uint32, parents bool) (*Entry, error) {
	abs, rel, err := clean(p)
	if err != nil {
		return nil, err
	}
	dir, name, err := f.parent(rel, parents, uid, gid, mode)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dir)
	err = mkdirAt(dir, name, uid, gid, mode)
	if errors.Is(err, ErrExists) && parents {
		if e, serr := entryOf(dir, name, abs); serr == nil && e.Type == "directory" {
			return e, nil
		}
	}
	if err != nil {
		return nil, err
	}
	return entryOf(dir, name, abs)
}

// WriteFile writes r to file p, owned and moded as given. Without force
// a file already there is an error; with it the file is replaced and
// missing directories are made.
func (f *Files) WriteFile(p string, r io.Reader, uid, gid int, mode uint32, force bool) (*Entry, error) {
	abs, rel, err := clean(p)
	if err != nil {
		return nil, err
	}
	dir, name, err := f.parent(rel, force, uid, gid, DefaultDirMode)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dir)
	// O_NONBLOCK: a FIFO in the file's place fails (ENXIO) instead of
	// waiting for a reader; O_NOFOLLOW: a symbolic link fails (ELOOP).
	flags := unix.O_WRONLY | unix.O_CREAT | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC
	if force {
		flags |= unix.O_TRUNC
	} else {
		flags |= unix.O_EXCL
	}
	fd, err := unix.Openat(dir, name, flags, 0o600)
	if err != nil {
		if errors.Is(err, unix.ENXIO) || errors.Is(err, unix.EISDIR) {
			return nil, fmt.Errorf("%w: something other than a file is there", ErrExists)
		}
		return nil, pathErr(err)
	}
	file := os.NewFile(uintptr(fd), abs)
	defer file.Close()
	if err := regular(fd); err != nil {
		return nil, err
	}
	if _, err := io.Copy(file, r); err != nil {
		return nil, pathErr(err)
	}
	if err := file.Sync(); err != nil {
		return nil, pathErr(err)
	}
	if err := unix.Fchown(fd, uid, gid); err != nil {
		return nil, err
	}
	if err := unix.Fchmod(fd, mode&0o7777); err != nil {
		return nil, err
	}
	return entryOf(fd, "", abs)
}

// regular fails unless fd is a regular file.
func regular(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%w: not a regular file", ErrBadPath)
	}
	return nil
}

// Open opens file p for reading; it must be a regular file.
func (f *Files) Open(p string) (*os.File, error) {
	abs, rel, err := clean(p)
	if err != nil {
		return nil, err
	}
	fd, err := openBeneath(int(f.root.Fd()), rel, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK)
	if err != nil {
		return nil, err
	}
	if err := regular(fd); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), abs), nil
}

// SetAttr changes the mode, owner or both of p (nil: unchanged).
func (f *Files) SetAttr(p string, uid, gid *int, mode *uint32) (*Entry, error) {
	fd, abs, err := f.openPath(p)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	// The owner first: a chown clears the set-id bits a mode may ask for.
	if uid != nil || gid != nil {
		u, g := -1, -1
		if uid != nil {
			u = *uid
		}
		if gid != nil {
			g = *gid
		}
		if err := unix.Fchownat(fd, "", u, g, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return nil, err
		}
	}
	if mode != nil {
		if err := chmodFD(fd, *mode); err != nil {
			return nil, err
		}
	}
	return entryOf(fd, "", abs)
}

// Remove removes p and everything below it; a symbolic link is removed,
// never followed.
func (f *Files) Remove(p string) error {
	_, rel, err := clean(p)
	if err != nil {
		return err
	}
	if rel == "." {
		return fmt.Errorf("%w: the volume's root cannot be removed", ErrBadPath)
	}
	dir, name, err := f.parent(rel, false, 0, 0, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dir)
	if err := unix.Fstatat(dir, name, new(unix.Stat_t), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return pathErr(err)
	}
	return removeAt(dir, name, 0)
}

// removeAt removes name in dir and, if it is a directory, what is in it,
// nesting at most maxNesting directories.
func removeAt(dir int, name string, nesting int) error {
	err := unix.Unlinkat(dir, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) {
		return pathErr(err)
	}
	if nesting >= maxNesting {
		return fmt.Errorf("%w: directories nested deeper than %d", ErrBadPath, maxNesting)
	}
	sub, err := openBeneath(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW)
	if err != nil {
		return err
	}
	// A batch of names at a time, each read from the start of what is
	// left: a directory of a million entries is emptied in bounded memory.
	for {
		var names []string
		if names, err = firstNames(sub, 1024); err != nil || len(names) == 0 {
			break
		}
		for _, n := range names {
			if err = removeAt(sub, n, nesting+1); err != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	unix.Close(sub)
	if err != nil {
		return err
	}
	if err := unix.Unlinkat(dir, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return pathErr(err)
	}
	return nil
}
