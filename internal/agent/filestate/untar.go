package filestate

import (
	"archive/tar"
	"errors"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// Untar writes the tar stream of the request's body into the directory
// ?dir= (made if missing), with the owners and modes its entries carry:
// the COPY step of a template build, whose files the daemon took from
// the upload and laid out for their destination. Only an agent that
// runs as the sandbox's root (a build's) can give files their owners.
//
// The sandbox's file system is the sandbox's own, yet every entry is
// written through an os.Root of dir, so that no name, symlink or link of
// the stream lands outside it.
func (s *Service) Untar(w http.ResponseWriter, r *http.Request) {
	if !s.root {
		http.Error(w, "only a sandbox's root can lay out files for others", http.StatusForbidden)
		return
	}
	dir := r.URL.Query().Get("dir")
	if !filepath.IsAbs(dir) {
		http.Error(w, "dir must be an absolute path", http.StatusBadRequest)
		return
	}
	// new=1: dir itself (the entry ".") is set up only if it is made now.
	_, statErr := os.Lstat(dir)
	keepDir := r.URL.Query().Get("new") == "1" && statErr == nil
	if err := os.MkdirAll(dir, 0o755); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	defer root.Close()
	if err := untarInto(root, tar.NewReader(r.Body), keepDir); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func untarInto(root *os.Root, tr *tar.Reader, keepDir bool) error {
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := path.Clean(strings.TrimPrefix(hdr.Name, "/"))
		if name == ".." || strings.HasPrefix(name, "../") {
			return errors.New("entry " + hdr.Name + " is outside the destination")
		}
		if name == "." && keepDir {
			continue
		}
		if err := writeEntry(root, name, hdr, tr, true); err != nil {
			return err
		}
	}
}

// writeEntry writes the tar entry hdr, whose contents tr reads next, as
// name in root, with hdr's mode and time, and its owners if owners. Only
// directories, files and symbolic links are written.
func writeEntry(root *os.Root, name string, hdr *tar.Header, tr io.Reader, owners bool) error {
	if d := path.Dir(name); d != "." {
		if err := root.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	mode := os.FileMode(hdr.Mode & 0o777)
	switch hdr.Typeflag {
	case tar.TypeDir:
		if name != "." {
			if err := root.Mkdir(name, mode); err != nil && !errors.Is(err, os.ErrExist) {
				return err
			}
		}
	case tar.TypeReg:
		root.Remove(name) // a file replaces what was there, as cp does
		f, err := root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, tr)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	case tar.TypeSymlink:
		root.Remove(name)
		if err := root.Symlink(hdr.Linkname, name); err != nil {
			return err
		}
	default:
		return nil // what a build's upload cannot carry
	}
	if owners {
		if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	if hdr.Typeflag != tar.TypeSymlink {
		// Chmod after chown: chown clears setuid and setgid bits.
		if err := root.Chmod(name, mode|unixBits(hdr.Mode)); err != nil {
			return err
		}
		if !hdr.ModTime.IsZero() {
			root.Chtimes(name, time.Now(), hdr.ModTime)
		}
	}
	return nil
}

// unixBits are the setuid, setgid and sticky bits of a tar mode as an
// os.FileMode's.
func unixBits(m int64) os.FileMode {
	var fm os.FileMode
	if m&0o4000 != 0 {
		fm |= os.ModeSetuid
	}
	if m&0o2000 != 0 {
		fm |= os.ModeSetgid
	}
	if m&0o1000 != 0 {
		fm |= os.ModeSticky
	}
	return fm
}
