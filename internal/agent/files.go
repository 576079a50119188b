package agent

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"strconv"

	"github.com/airlock-sandbox/airlock/internal/agent/filesystem"
	"github.com/airlock-sandbox/airlock/internal/agent/identity"
	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// httpError writes envd's JSON error body with the status the SDK maps
// (400 invalid, 401 auth, 404 not found, 507 no space).
func httpError(w http.ResponseWriter, e *agentproto.Error) {
	status := map[agentproto.Code]int{
		agentproto.CodeInvalidArgument: 400, agentproto.CodeNotFound: 404, agentproto.CodePermissionDenied: 403,
		agentproto.CodeResourceExhausted: 507, agentproto.CodeAlreadyExists: 409, agentproto.CodeFailedPrecondition: 400,
	}[e.Code]
	if status == 0 {
		status = 500
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"code": status, "message": e.Message})
}

// getFile streams a file of the sandbox; it is never held in memory.
func (a *Agent) getFile(w http.ResponseWriter, r *http.Request) {
	id, err := a.users.Who(r)
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
	err = a.users.As(id, func() (err error) { f, err = os.Open(p); return err })
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

type writtenFile struct {
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Path     string            `json:"path"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// postFile writes files into the sandbox, streamed to disk: multipart (one
// "file" part per file, named by the query's path or by the part's file
// name) or a raw body (application/octet-stream, gzip allowed).
func (a *Agent) postFile(w http.ResponseWriter, r *http.Request) {
	id, err := a.users.Who(r)
	if err != nil {
		httpError(w, rpc.AsError(err))
		return
	}
	query := r.URL.Query().Get("path")
	md, e := filesystem.UploadMetadata(r.Header)
	if e != nil {
		httpError(w, e)
		return
	}
	var written []writtenFile
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch mt {
	case "multipart/form-data":
		mr, err := r.MultipartReader()
		if err != nil {
			httpError(w, rpc.Errorf(agentproto.CodeInvalidArgument, "multipart: %v", err))
			return
		}
		for {
			part, err := mr.NextPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				httpError(w, rpc.Errorf(agentproto.CodeInvalidArgument, "multipart: %v", err))
				return
			}
			if part.FormName() != "file" {
				continue
			}
			dest := query
			if dest == "" {
				// The file name is the destination path; part.FileName()
				// would cut it to its base name.
				_, params, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
				dest = params["filename"]
			}
			wf, e := a.writeFile(id, dest, md, part)
			if e != nil {
				httpError(w, e)
				return
			}
			written = append(written, wf)
		}
	case "application/octet-stream":
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			gz, err := gzip.NewReader(r.Body)
			if err != nil {
				httpError(w, rpc.Errorf(agentproto.CodeInvalidArgument, "gzip: %v", err))
				return
			}
			defer gz.Close()
			body = gz
		}
		wf, e := a.writeFile(id, query, md, body)
		if e != nil {
			httpError(w, e)
			return
		}
		written = append(written, wf)
	default:
		httpError(w, rpc.Errorf(agentproto.CodeInvalidArgument, "content type %q: want multipart/form-data or application/octet-stream", mt))
		return
	}
	if len(written) == 0 {
		httpError(w, rpc.Errorf(agentproto.CodeInvalidArgument, "no file in the request"))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(written)
}

// writeFile writes body to dest as id, and gives the file the metadata md
// (replacing what it had).
func (a *Agent) writeFile(id identity.ID, dest string, md map[string]string, body io.Reader) (writtenFile, *agentproto.Error) {
	if dest == "" {
		return writtenFile{}, rpc.Errorf(agentproto.CodeInvalidArgument, "no path given for the file")
	}
	p := id.Resolve(dest)
	written := writtenFile{Name: filepath.Base(p), Type: "file", Path: p}
	var fail *agentproto.Error
	err := a.users.As(id, func() error {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			fail = filesystem.PathError(filepath.Dir(p), err)
			return nil
		}
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			fail = filesystem.PathError(p, err)
			return nil
		}
		_, err = io.Copy(f, body)
		if err == nil {
			err = filesystem.SetMetadata(f, md)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			fail = filesystem.PathError(p, err)
			return nil
		}
		written.Metadata = filesystem.Metadata(p)
		return nil
	})
	if err != nil { // the identity could not be taken: nothing was written
		return writtenFile{}, rpc.AsError(err)
	}
	if fail != nil {
		return writtenFile{}, fail
	}
	return written, nil
}
