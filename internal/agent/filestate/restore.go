package filestate

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// Restore writes the tar stream of the request's body, which Save made in
// an earlier sandbox of the same template, back into dirs, owned by the
// agent's user. An entry outside them is refused.
func (s *Service) Restore(w http.ResponseWriter, r *http.Request) {
	roots := map[string]*os.Root{}
	for _, dir := range dirs {
		root, err := os.OpenRoot(filepath.Join(s.base, dir))
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
		root, name, ok := entryRoot(roots, hdr.Name)
		if !ok {
			http.Error(w, fmt.Sprintf("entry %q is outside the saved directories", hdr.Name), http.StatusBadRequest)
			return
		}
		if name == "." {
			continue // the directory itself is the new sandbox's, as made
		}
		if err := writeEntry(root, name, hdr, tr, s.root); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// entryRoot is the root among roots (by directory) and the name in it of
// the stream's entry name.
func entryRoot(roots map[string]*os.Root, name string) (*os.Root, string, bool) {
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
