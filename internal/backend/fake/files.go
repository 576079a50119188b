package fake

import (
	"archive/tar"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"

	"github.com/airlock-sandbox/airlock/internal/agent/filestate"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// A sandbox's file state (a pause that keeps only the files) is the
// agent's own filestate service's, at the box's directory: its home is
// home/user there and its /tmp tmp, as in a sandbox. With OpFiles
// failing, the stream ends without the trailer that says all were read.
func (i *Instance) files() http.Handler {
	fs := filestate.NewAt(i.b.log, false, i.dir)
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+agentproto.SavedFilesPath, fs.Restore)
	mux.HandleFunc("GET "+agentproto.SavedFilesPath, func(w http.ResponseWriter, r *http.Request) {
		if i.b.failure(OpFiles) != nil {
			w.Header().Set("Trailer", agentproto.FilesCompleteTrailer)
			w.Header().Set("Content-Type", "application/x-tar")
			tar.NewWriter(w).Close()
			return
		}
		fs.Save(w, r)
	})
	return mux
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
