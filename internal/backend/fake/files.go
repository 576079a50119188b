package fake

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// A sandbox's file state, as the agent streams it for a pause that keeps
// only the files (agentproto.FilesCompleteTrailer): a tar of the box's
// home as home/user and of its /tmp as tmp. Directories, regular files
// and symbolic links are kept, as the agent keeps them.

// fileDirs maps the names in the stream to the box's directories.
func (i *Instance) fileDirs() [][2]string {
	return [][2]string{{"home/user", i.home}, {"tmp", i.tmp}}
}

// getFiles streams the file state; with OpFiles failing, it stops before
// the trailer that says all were read.
func (i *Instance) getFiles(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Trailer", agentproto.FilesCompleteTrailer)
	w.Header().Set("Content-Type", "application/x-tar")
	tw := tar.NewWriter(w)
	for _, d := range i.fileDirs() {
		if err := tarDir(tw, d[0], d[1]); err != nil {
			i.b.log.Error("fake file state", "err", err)
			return
		}
	}
	if i.b.failure(OpFiles) != nil {
		return
	}
	if err := tw.Close(); err != nil {
		return
	}
	w.Header().Set(agentproto.FilesCompleteTrailer, "1")
}

// tarDir writes dir and everything below it to tw, named under name.
func tarDir(tw *tar.Writer, name, dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		case !fi.IsDir() && !fi.Mode().IsRegular():
			return nil
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		hdr.Name = path.Join(name, filepath.ToSlash(rel))
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.CopyN(tw, f, hdr.Size)
		return err
	})
}

// postFiles writes a file state back into the box's directories,
// refusing an entry outside them, as the agent does.
func (i *Instance) postFiles(w http.ResponseWriter, r *http.Request) {
	roots := map[string]*os.Root{}
	for _, d := range i.fileDirs() {
		root, err := os.OpenRoot(d[1])
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer root.Close()
		roots[d[0]] = root
	}
	tr := tar.NewReader(r.Body)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if err := writeEntry(roots, hdr, tr); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// writeEntry writes the stream's entry hdr into the root it names.
func writeEntry(roots map[string]*os.Root, hdr *tar.Header, r io.Reader) error {
	name := path.Clean(hdr.Name)
	var root *os.Root
	for dir, rt := range roots {
		if name == dir {
			return nil // the directory itself is the box's, as made
		}
		if rest, ok := strings.CutPrefix(name, dir+"/"); ok {
			root, name = rt, rest
			break
		}
	}
	if root == nil {
		return fmt.Errorf("entry %q is outside the saved directories", hdr.Name)
	}
	if d := path.Dir(name); d != "." {
		if err := root.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := root.Mkdir(name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	case tar.TypeReg:
		root.Remove(name)
		f, err := root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, os.FileMode(hdr.Mode)&0o777)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, r)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	case tar.TypeSymlink:
		root.Remove(name)
		return root.Symlink(hdr.Linkname, name)
	}
	return nil
}

// copyTree copies the directories, regular files and symbolic links
// under src to dst.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case fi.IsDir():
			err := os.Mkdir(to, fi.Mode().Perm())
			if rel == "." && errors.Is(err, fs.ErrExist) {
				return nil // the new box's own
			}
			return err
		case fi.Mode()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(link, to)
		case fi.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(to, data, fi.Mode().Perm())
		}
		return nil
	})
}
