package files

import (
	"io"
	"mime"
	"net/http"
	"os"
	"strconv"

	"github.com/airlock-sandbox/airlock/internal/agent/filesystem"
	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// Download streams the file ?path= names, opened as the request's user.
func (s *Service) Download(w http.ResponseWriter, r *http.Request) {
	id, err := s.users.Who(r)
	if err != nil {
		httpError(w, rpc.AsError(err))
		return
	}
	path := r.URL.Query().Get("path")
	if path == "" {
		httpError(w, rpc.Errorf(agentproto.CodeInvalidArgument, "no path given"))
		return
	}
	p := id.Resolve(path)
	var f *os.File
	err = s.users.As(id, func() (err error) { f, err = os.Open(p); return err })
	if err != nil {
		httpError(w, filesystem.PathError(p, err))
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		httpError(w, filesystem.PathError(p, err))
		return
	}
	if fi.IsDir() {
		httpError(w, rpc.Errorf(agentproto.CodeInvalidArgument, "path '%s' is a directory", p))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": fi.Name()}))
	if fi.Mode().IsRegular() {
		w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
	}
	io.Copy(w, f)
}
