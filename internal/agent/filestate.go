package agent

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

// A pause that keeps only the files (E2B's keepMemory: false) saves what
// the sandbox's user can change of its file system, and nothing that
// runs: the daemon takes the tar stream of those directories from the
// agent (GET agentproto.SavedFilesPath), ends the sandbox, and at connect starts
// a new one of its template and gives the stream back to its agent
// (POST agentproto.SavedFilesPath) before anything else runs there.
//
// The daemon only keeps the stream: it is the sandbox's own, made and
// read inside it, by the sandbox's user. In a template of the daemon's
// (base, the code interpreter) these are the only places that user can
// write; the daemon refuses the pause for other sandboxes.
var fileStateDirs = []string{"home/user", "tmp"}

// getFileState writes the tar stream of fileStateDirs, names relative to
// "/". Directories, regular files and symbolic links are kept; sockets,
// pipes and devices are not files the user's work is in.
func (a *Agent) getFileState(w http.ResponseWriter, r *http.Request) {
	// The status is sent before the first file is read: the trailer says
	// whether all were.
	w.Header().Set("Trailer", agentproto.FilesCompleteTrailer)
	w.Header().Set("Content-Type", "application/x-tar")
	tw := tar.NewWriter(w)
	for _, dir := range fileStateDirs {
		if err := tarDir(tw, dir); err != nil {
			a.log.Error("file state", "err", err)
			return
		}
	}
	if err := tw.Close(); err != nil {
		a.log.Error("file state", "err", err)
		return
	}
	w.Header().Set(agentproto.FilesCompleteTrailer, "1")
}

// tarDir writes dir ("/"+dir) and everything below it to tw.
func tarDir(tw *tar.Writer, dir string) error {
	return filepath.WalkDir("/"+dir, func(p string, d fs.DirEntry, err error) error {
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
		hdr.Name = strings.TrimPrefix(p, "/")
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

// postFileState writes the tar stream of the request's body, made by
// getFileState in an earlier sandbox of the same template, back into
// fileStateDirs, owned by the agent's user. An entry outside them is
// refused.
func (a *Agent) postFileState(w http.ResponseWriter, r *http.Request) {
	roots := map[string]*os.Root{}
	for _, dir := range fileStateDirs {
		root, err := os.OpenRoot("/" + dir)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer root.Close()
		roots[dir] = root
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
		root, name, ok := fileStateEntry(roots, hdr.Name)
		if !ok {
			http.Error(w, fmt.Sprintf("entry %q is outside the saved directories", hdr.Name), http.StatusBadRequest)
			return
		}
		if name == "." {
			continue // the directory itself is the new sandbox's, as made
		}
		if err := writeEntry(root, name, hdr, tr, a.users.Root); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// fileStateEntry is the root among roots (by directory) and the name in
// it of the stream's entry name.
func fileStateEntry(roots map[string]*os.Root, name string) (*os.Root, string, bool) {
	name = path.Clean(name)
	for dir, root := range roots {
		if name == dir {
			return root, ".", true
		}
		if rest, ok := strings.CutPrefix(name, dir+"/"); ok {
			return root, rest, true
		}
	}
	return nil, "", false
}
