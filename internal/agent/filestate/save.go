package filestate

import (
	"archive/tar"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// Save writes the tar stream of dirs, names relative to "/". Directories,
// regular files and symbolic links are kept; sockets, pipes and devices
// are not files the user's work is in.
func (s *Service) Save(w http.ResponseWriter, r *http.Request) {
	// The status is sent before the first file is read: the trailer says
	// whether all were.
	w.Header().Set("Trailer", agentproto.FilesCompleteTrailer)
	w.Header().Set("Content-Type", "application/x-tar")
	tw := tar.NewWriter(w)
	for _, dir := range dirs {
		if err := tarDir(tw, s.base, dir); err != nil {
			s.log.Error("file state", "err", err)
			return
		}
	}
	if err := tw.Close(); err != nil {
		s.log.Error("file state", "err", err)
		return
	}
	w.Header().Set(agentproto.FilesCompleteTrailer, "1")
}

// tarDir writes dir (in base) and everything below it to tw, named
// relative to base.
func tarDir(tw *tar.Writer, base, dir string) error {
	return filepath.WalkDir(filepath.Join(base, dir), func(p string, d fs.DirEntry, err error) error {
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
		if hdr.Name, err = filepath.Rel(base, p); err != nil {
			return err
		}
		hdr.Uname, hdr.Gname = "", ""
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
		// A file that grows meanwhile is cut at its size when seen.
		_, err = io.CopyN(tw, f, hdr.Size)
		return err
	})
}
