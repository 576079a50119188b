package gvisor

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/layout"
)

// A gVisor sandbox's /etc is one directory, bind-mounted read-only: a copy
// of the template's host /etc entries plus the generated files. gVisor's
// gofer serves each bind mount on its own, at ~1.7 ms apiece when a
// sandbox starts, so one copy, made once and reused while the host's
// entries stay as they are, replaces some fifteen mounts.
//
// Only what the sandbox's user could have read through those mounts is
// copied: files others may read, directories others may list and enter,
// and symbolic links (resolved inside the sandbox, as before). Anything
// else, such as /etc/ssl/private, stays out, so the copy never shows more
// than the mounts did.

// etcCopyVersion changes with the rules of the copy, so that a copy made
// under older rules is not reused.
const etcCopyVersion = 1

// etcEntry is one file, directory or link to copy.
type etcEntry struct {
	path string      // on the host, below /etc
	info fs.FileInfo // nil for a symbolic link
}

// etcDir returns the directory to mount as the sandbox's /etc, building it
// if the host's entries changed since it was last built. Syscalls are
// slow on these VMs (a walk that stats all ~800 entries costs 5 ms), so
// the fingerprint skips the links, most of them: a link cannot change in
// place, only be replaced, which changes its directory's mtime.
func etcDir(stateDir string, networked bool, trust []byte) (dir string, trusted bool, err error) {
	h := sha256.New()
	fmt.Fprintf(h, "airlock etc copy %d\n", etcCopyVersion)
	fmt.Fprintf(h, "trust %d\n", len(trust))
	h.Write(trust)
	generated := layout.GeneratedEtc(networked)
	for _, name := range slices.Sorted(maps.Keys(generated)) {
		fmt.Fprintf(h, "generated %s %d\n", name, len(generated[name]))
		h.Write(generated[name])
	}
	var entries []etcEntry
	for _, name := range layout.HostEtc {
		top := "/etc/" + name
		filepath.WalkDir(top, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil // absent on this host
			}
			if d.Type()&fs.ModeSymlink != 0 {
				fmt.Fprintf(h, "%s link\n", path)
				if path == top { // /etc's mtime would say too much
					target, _ := os.Readlink(path)
					fmt.Fprintf(h, "-> %s\n", target)
				}
				entries = append(entries, etcEntry{path: path})
				return nil
			}
			fi, err := d.Info()
			if err != nil || !sandboxVisible(fi) {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			fmt.Fprintf(h, "%s %v %d %d\n", path, fi.Mode(), fi.Size(), fi.ModTime().UnixNano())
			entries = append(entries, etcEntry{path: path, info: fi})
			return nil
		})
	}
	dir = filepath.Join(stateDir, "etc", hex.EncodeToString(h.Sum(nil))[:16])
	// A copy that holds the CA in its store says so beside it.
	marker := dir + ".trusted"
	if _, err := os.Stat(dir); err == nil {
		_, merr := os.Stat(marker)
		return dir, trust != nil && merr == nil, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o711); err != nil {
		return "", false, err
	}
	// Built aside and renamed into place: a sandbox never sees half a copy,
	// and of two builders at once, one wins and the other's goes.
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".new-")
	if err != nil {
		return "", false, err
	}
	if err := buildEtc(tmp, generated, entries); err != nil {
		os.RemoveAll(tmp)
		return "", false, fmt.Errorf("sandbox /etc: %w", err)
	}
	if trust != nil {
		if trusted, err = addTrust(tmp, trust); err != nil {
			os.RemoveAll(tmp)
			return "", false, fmt.Errorf("sandbox /etc: %w", err)
		}
		if trusted {
			if err := os.WriteFile(marker, nil, 0o600); err != nil {
				os.RemoveAll(tmp)
				return "", false, err
			}
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		os.RemoveAll(tmp)
		if _, serr := os.Stat(dir); serr != nil {
			return "", false, err
		}
	}
	return dir, trusted, nil
}

// sandboxVisible reports whether uid 1000 could reach fi through a
// read-only bind mount of a root-owned tree.
func sandboxVisible(fi fs.FileInfo) bool {
	perm := fi.Mode().Perm()
	switch {
	case fi.IsDir():
		return perm&0o005 == 0o005
	case fi.Mode().IsRegular():
		return perm&0o004 != 0
	}
	return false
}

func buildEtc(dir string, generated map[string][]byte, entries []etcEntry) error {
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	for _, e := range entries {
		dst := filepath.Join(dir, strings.TrimPrefix(e.path, "/etc/"))
		var err error
		switch {
		case e.info == nil:
			var target string
			if target, err = os.Readlink(e.path); err == nil {
				err = os.Symlink(target, dst)
			}
		case e.info.IsDir():
			if err = os.Mkdir(dst, 0o755); err == nil {
				err = os.Chmod(dst, copyPerm(e.info))
			}
		default:
			err = copyFile(e, dst)
		}
		if err != nil {
			return err
		}
	}
	for name, data := range generated {
		dst := filepath.Join(dir, name)
		if err := os.WriteFile(dst, data, 0o644); err != nil {
			return err
		}
		if err := os.Chmod(dst, 0o644); err != nil { // past the umask
			return err
		}
	}
	return nil
}

// addTrust appends the egress CA to the store of the copy dir, and
// reports whether it did: only to a regular file reached without a link.
// The copy keeps the host's links as they are (they resolve inside the
// sandbox), and the daemon must not follow them on the host: where the
// store is behind one (/etc/ssl/certs -> ../pki/…), the copy goes without.
func addTrust(dir string, trust []byte) (bool, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, dir, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC})
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	rel := strings.TrimPrefix(layout.CABundle, "/etc/")
	f, err := unix.Openat2(fd, rel, &unix.OpenHow{Flags: unix.O_WRONLY | unix.O_APPEND | unix.O_NONBLOCK | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return false, nil // none, or behind a link
	}
	store := os.NewFile(uintptr(f), rel)
	defer store.Close()
	if fi, err := store.Stat(); err != nil || !fi.Mode().IsRegular() || fi.Size() == 0 {
		return false, nil
	}
	if _, err := store.Write(append([]byte("\n"), trust...)); err != nil {
		return false, err
	}
	return true, nil
}

// copyPerm is the mode of a copy: the original's, never writable by
// anyone but root (the cache is mounted read-only anyway).
func copyPerm(fi fs.FileInfo) fs.FileMode { return fi.Mode().Perm() &^ 0o022 }

// copyFile copies the regular file e to dst. The file is opened without
// following a link and checked again, so that one swapped since the walk
// (root's doing: /etc is root's) is not copied under the old rules.
func copyFile(e etcEntry, dst string) error {
	in, err := os.OpenFile(e.path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	if !os.SameFile(fi, e.info) || fi.Mode() != e.info.Mode() || !sandboxVisible(fi) {
		return fmt.Errorf("%s changed while being copied", e.path)
	}
	perm := copyPerm(fi)
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Chmod(dst, perm) // past the umask
}
