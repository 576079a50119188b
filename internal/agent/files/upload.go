package files

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"os"
	"path/filepath"

	"github.com/airlock-sandbox/airlock/internal/agent/filesystem"
	"github.com/airlock-sandbox/airlock/internal/agent/identity"
	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

type writtenFile struct {
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Path     string            `json:"path"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// Upload writes files into the sandbox, streamed to disk: multipart (one
// "file" part per file, named by the query's path or by the part's file
// name) or a raw body (application/octet-stream, gzip allowed).
func (s *Service) Upload(w http.ResponseWriter, r *http.Request) {
	id, err := s.users.Who(r)
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
		written, e = s.writeParts(r, id, query, md)
	case "application/octet-stream":
		var wf writtenFile
		wf, e = s.writeBody(r, id, query, md)
		written = append(written, wf)
	default:
		e = rpc.Errorf(agentproto.CodeInvalidArgument, "content type %q: want multipart/form-data or application/octet-stream", mt)
	}
	if e != nil {
		httpError(w, e)
		return
	}
	if len(written) == 0 {
		httpError(w, rpc.Errorf(agentproto.CodeInvalidArgument, "no file in the request"))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(written)
}

// writeParts writes each "file" part of a multipart upload, to query or,
// without one, to the part's file name; it stops at the first that fails.
func (s *Service) writeParts(r *http.Request, id identity.ID, query string, md map[string]string) ([]writtenFile, *agentproto.Error) {
	mr, err := r.MultipartReader()
	if err != nil {
		return nil, rpc.Errorf(agentproto.CodeInvalidArgument, "multipart: %v", err)
	}
	var written []writtenFile
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			return written, nil
		}
		if err != nil {
			return nil, rpc.Errorf(agentproto.CodeInvalidArgument, "multipart: %v", err)
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
		wf, e := s.writeFile(id, dest, md, part)
		if e != nil {
			return nil, e
		}
		written = append(written, wf)
	}
}

// writeBody writes a raw upload's body, gzip-compressed or not.
func (s *Service) writeBody(r *http.Request, id identity.ID, dest string, md map[string]string) (writtenFile, *agentproto.Error) {
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		gz, err := gzip.NewReader(r.Body)
		if err != nil {
			return writtenFile{}, rpc.Errorf(agentproto.CodeInvalidArgument, "gzip: %v", err)
		}
		defer gz.Close()
		body = gz
	}
	return s.writeFile(id, dest, md, body)
}

// writeFile writes body to dest as id, and gives the file the metadata md
// (replacing what it had).
func (s *Service) writeFile(id identity.ID, dest string, md map[string]string, body io.Reader) (writtenFile, *agentproto.Error) {
	if dest == "" {
		return writtenFile{}, rpc.Errorf(agentproto.CodeInvalidArgument, "no path given for the file")
	}
	p := id.Resolve(dest)
	written := writtenFile{Name: filepath.Base(p), Type: "file", Path: p}
	var fail *agentproto.Error
	err := s.users.As(id, func() error {
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
