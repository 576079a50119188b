package httpapi

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"path"
	"strconv"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/volume"
)

// Volumes: E2B's /volumes (with the API key) and /volumecontent, the
// files of a volume without a sandbox, with the volume's token as a
// bearer token (the SDK's Volume sends no API key there) or the API key.
// The SDK reaches /volumecontent at E2B_VOLUME_API_URL, which a client of
// Airlock sets to the server's own address, as E2B_API_URL.

// HandleVolumes serves the volumes of store, whose tokens derive from key.
func (s *Server) HandleVolumes(store *volume.Store, key []byte) {
	s.volumes, s.volumeKey = store, key
	s.api("POST /volumes", s.createVolume)
	s.api("GET /volumes", s.listVolumes)
	s.api("GET /volumes/{id}", s.getVolume)
	s.api("DELETE /volumes/{id}", s.deleteVolume)
	content := func(pattern string, h func(http.ResponseWriter, *http.Request, *volume.Files)) {
		s.patterns = append(s.patterns, pattern)
		s.mux.HandleFunc(pattern, s.volumeFiles(h))
	}
	content("GET /volumecontent/{id}/dir", s.volumeList)
	content("POST /volumecontent/{id}/dir", s.volumeMkdir)
	content("GET /volumecontent/{id}/path", s.volumeStat)
	content("PATCH /volumecontent/{id}/path", s.volumeSetAttr)
	content("DELETE /volumecontent/{id}/path", s.volumeRemove)
	content("GET /volumecontent/{id}/file", s.volumeRead)
	content("PUT /volumecontent/{id}/file", s.volumeWrite)
}

// volumeJSON is E2B's VolumeAndToken (Volume without the token, in a
// list).
type volumeJSON struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
	Token    string `json:"token,omitempty"`
}

// volumeToken is the bearer token of volume id's files: a MAC of its id,
// so that it needs no storage and dies with the volume's id.
func (s *Server) volumeToken(id string) string {
	mac := hmac.New(sha256.New, s.volumeKey)
	mac.Write([]byte("volume token " + id))
	return "vol_" + hex.EncodeToString(mac.Sum(nil))
}

func (s *Server) volumeObject(v *volume.Volume) volumeJSON {
	return volumeJSON{VolumeID: v.ID, Name: v.Name, Token: s.volumeToken(v.ID)}
}

func (s *Server) createVolume(w http.ResponseWriter, r *http.Request) {
	var b struct {
		Name string `json:"name"`
	}
	raw, ok := readBody(w, r)
	if !ok {
		return
	}
	if err := refuseUnknown(raw, []string{"name"}, ""); err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	if err := json.Unmarshal(raw, &b); err != nil {
		writeError(w, http.StatusBadRequest, "invalid JSON body: %v", err)
		return
	}
	v, err := s.volumes.Create(b.Name)
	if err != nil {
		s.volumeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.volumeObject(v))
}

func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request) {
	out := []volumeJSON{}
	for _, v := range s.volumes.List() {
		out = append(out, volumeJSON{VolumeID: v.ID, Name: v.Name})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getVolume(w http.ResponseWriter, r *http.Request) {
	v, err := s.volumes.Get(r.PathValue("id"))
	if err != nil {
		s.volumeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.volumeObject(v))
}

// deleteVolume removes a volume, as E2B does even while sandboxes mount
// it: theirs keep its files until they end.
func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request) {
	if err := s.volumes.Delete(r.PathValue("id")); err != nil {
		s.volumeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// volumeError answers the store's errors on /volumes.
func (s *Server) volumeError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, volume.ErrNotFound):
		writeError(w, http.StatusNotFound, "volume not found")
	case errors.Is(err, volume.ErrInvalid):
		writeError(w, http.StatusBadRequest, "%v", err)
	case errors.Is(err, volume.ErrNoRoom):
		writeError(w, http.StatusInsufficientStorage, "%v", err)
	default:
		s.log.Error("volume request failed", "err", err)
		writeError(w, http.StatusInternalServerError, "internal error: the volume operation failed (the server log has the details)")
	}
}

// volumeFiles authorizes a request for volume {id}'s files (its token,
// or the API key) and hands h the volume's files, closed after.
func (s *Server) volumeFiles(h func(http.ResponseWriter, *http.Request, *volume.Files)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		byToken := strings.EqualFold(scheme, "Bearer") && subtle.ConstantTimeCompare([]byte(token), []byte(s.volumeToken(id))) == 1
		key := r.Header.Get("X-API-KEY")
		if key == "" && strings.EqualFold(scheme, "Bearer") {
			key = token
		}
		byKey := key != "" && s.apiKey != "" && subtle.ConstantTimeCompare([]byte(key), []byte(s.apiKey)) == 1
		if !byToken && !byKey {
			writeContentError(w, http.StatusUnauthorized, "UNAUTHORIZED", "invalid or missing volume token (Authorization: Bearer) or API key")
			return
		}
		f, err := s.volumes.Files(id)
		if errors.Is(err, volume.ErrNotFound) {
			writeContentError(w, http.StatusNotFound, "VOLUME_NOT_FOUND", "volume not found")
			return
		}
		if err != nil {
			s.contentError(w, err)
			return
		}
		defer f.Close()
		if !r.URL.Query().Has("path") {
			writeContentError(w, http.StatusBadRequest, "INVALID_REQUEST", "the path query parameter is required")
			return
		}
		h(w, r, f)
	}
}

// writeContentError writes the volume content API's error body, whose
// code is a string.
func writeContentError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}{code, msg})
}

// contentError answers the errors of a volume's files as E2B's content
// API does.
func (s *Server) contentError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, volume.ErrPathNotFound):
		writeContentError(w, http.StatusNotFound, "PATH_NOT_FOUND", "path not found")
	case errors.Is(err, volume.ErrExists):
		writeContentError(w, http.StatusConflict, "PATH_ALREADY_EXISTS", err.Error())
	case errors.Is(err, volume.ErrBadPath):
		writeContentError(w, http.StatusBadRequest, "INVALID_REQUEST", err.Error())
	case errors.Is(err, volume.ErrFull):
		writeContentError(w, http.StatusInsufficientStorage, "VOLUME_FULL", "the volume is full")
	case errors.Is(err, volume.ErrBusy):
		writeContentError(w, http.StatusConflict, "PATH_BUSY", err.Error())
	default:
		s.log.Error("volume file request failed", "err", err)
		writeContentError(w, http.StatusInternalServerError, "INTERNAL", "the volume operation failed (the server log has the details)")
	}
}

// ownership reads uid, gid and mode from q, each defaulting as given.
func ownership(q map[string][]string, mode uint32) (uid, gid int, m uint32, err error) {
	uid, gid, m = volume.DefaultUID, volume.DefaultGID, mode
	get := func(name string, max uint64, dst func(uint64)) {
		if err != nil || len(q[name]) == 0 {
			return
		}
		v, perr := strconv.ParseUint(q[name][0], 10, 64)
		if perr != nil || v > max {
			err = fmt.Errorf("%s must be a whole number from 0 to %d, not %q", name, max, q[name][0])
			return
		}
		dst(v)
	}
	get("uid", math.MaxUint32-1, func(v uint64) { uid = int(v) })
	get("gid", math.MaxUint32-1, func(v uint64) { gid = int(v) })
	get("mode", 0o7777, func(v uint64) { m = uint32(v) })
	return
}

// creation reads what a create of a file or directory may say: its
// owner and mode (ownership) and ?force=true|false.
func creation(q map[string][]string, mode uint32) (uid, gid int, m uint32, force bool, err error) {
	if uid, gid, m, err = ownership(q, mode); err != nil || len(q["force"]) == 0 {
		return uid, gid, m, false, err
	}
	if force, err = strconv.ParseBool(q["force"][0]); err != nil {
		err = errors.New("force must be true or false")
	}
	return uid, gid, m, force, err
}

func (s *Server) volumeList(w http.ResponseWriter, r *http.Request, f *volume.Files) {
	q := r.URL.Query()
	depth := 1
	if v := q.Get("depth"); v != "" {
		d, err := strconv.Atoi(v)
		if err != nil || d > volume.MaxDepth {
			writeContentError(w, http.StatusBadRequest, "DEPTH_OUT_OF_RANGE", fmt.Sprintf("depth must be 1 to %d, not %q", volume.MaxDepth, v))
			return
		}
		depth = d
	}
	entries, err := f.List(q.Get("path"), depth)
	if err != nil {
		s.contentError(w, err)
		return
	}
	if entries == nil {
		entries = []*volume.Entry{}
	}
	writeJSON(w, http.StatusOK, entries)
}

func (s *Server) volumeMkdir(w http.ResponseWriter, r *http.Request, f *volume.Files) {
	q := r.URL.Query()
	uid, gid, mode, parents, err := creation(q, volume.DefaultDirMode)
	if err != nil {
		writeContentError(w, http.StatusBadRequest, "INVALID_REQUEST", err.Error())
		return
	}
	e, err := f.Mkdir(q.Get("path"), uid, gid, mode, parents)
	if err != nil {
		s.contentError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, e)
}

func (s *Server) volumeStat(w http.ResponseWriter, r *http.Request, f *volume.Files) {
	e, err := f.Stat(r.URL.Query().Get("path"))
	if err != nil {
		s.contentError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, e)
}

func (s *Server) volumeSetAttr(w http.ResponseWriter, r *http.Request, f *volume.Files) {
	var b struct {
		UID  *int64 `json:"uid"`
		GID  *int64 `json:"gid"`
		Mode *int64 `json:"mode"`
	}
	raw, ok := readBody(w, r)
	if !ok {
		return
	}
	if err := refuseUnknown(raw, []string{"uid", "gid", "mode"}, ""); err != nil {
		writeContentError(w, http.StatusBadRequest, "INVALID_REQUEST", err.Error())
		return
	}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &b); err != nil {
			writeContentError(w, http.StatusBadRequest, "INVALID_REQUEST", "invalid JSON body: "+err.Error())
			return
		}
	}
	var uid, gid *int
	var mode *uint32
	for _, c := range []struct {
		name string
		v    *int64
		max  int64
		set  func(int64)
	}{
		{"uid", b.UID, math.MaxUint32 - 1, func(v int64) { uid = ptrTo(int(v)) }},
		{"gid", b.GID, math.MaxUint32 - 1, func(v int64) { gid = ptrTo(int(v)) }},
		{"mode", b.Mode, 0o7777, func(v int64) { mode = ptrTo(uint32(v)) }},
	} {
		if c.v == nil {
			continue
		}
		if *c.v < 0 || *c.v > c.max {
			writeContentError(w, http.StatusBadRequest, "INVALID_REQUEST", fmt.Sprintf("%s must be from 0 to %d", c.name, c.max))
			return
		}
		c.set(*c.v)
	}
	e, err := f.SetAttr(r.URL.Query().Get("path"), uid, gid, mode)
	if err != nil {
		s.contentError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, e)
}

func ptrTo[T any](v T) *T { return &v }

func (s *Server) volumeRemove(w http.ResponseWriter, r *http.Request, f *volume.Files) {
	p := r.URL.Query().Get("path")
	if p != "" && path.Clean("/"+p) == "/" {
		writeContentError(w, http.StatusBadRequest, "CANNOT_DELETE_ROOT", "the volume's root cannot be removed")
		return
	}
	if err := f.Remove(p); err != nil {
		s.contentError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) volumeRead(w http.ResponseWriter, r *http.Request, f *volume.Files) {
	file, err := f.Open(r.URL.Query().Get("path"))
	if err != nil {
		s.contentError(w, err)
		return
	}
	defer file.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	if st, err := file.Stat(); err == nil {
		w.Header().Set("Content-Length", strconv.FormatInt(st.Size(), 10))
	}
	w.WriteHeader(http.StatusOK)
	io.Copy(w, file) // streamed: a sparse file of terabytes is never held
}

func (s *Server) volumeWrite(w http.ResponseWriter, r *http.Request, f *volume.Files) {
	q := r.URL.Query()
	uid, gid, mode, replace, err := creation(q, volume.DefaultFileMode)
	if err != nil {
		writeContentError(w, http.StatusBadRequest, "INVALID_REQUEST", err.Error())
		return
	}
	e, err := f.WriteFile(q.Get("path"), r.Body, uid, gid, mode, replace)
	if err != nil {
		s.contentError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, e)
}

// maxVolumeMounts bounds one sandbox's volume mounts.
const maxVolumeMounts = 16

// volumeMounts checks a create's volumeMounts as E2B does (absolute,
// clean, each path once) and returns them, or the one error that lists
// every problem.
func volumeMounts(in []struct {
	Name string `json:"name"`
	Path string `json:"path"`
}) ([]sandbox.VolumeMount, error) {
	if len(in) > maxVolumeMounts {
		return nil, fmt.Errorf("invalid mounts: at most %d volume mounts, got %d", maxVolumeMounts, len(in))
	}
	var out []sandbox.VolumeMount
	var problems []string
	used := map[string]bool{}
	for i, m := range in {
		var why string
		switch {
		case m.Path == "":
			why = "path cannot be empty"
		case !path.IsAbs(m.Path):
			why = "path must be absolute"
		case path.Clean(m.Path) != m.Path:
			why = "path must not contain any '.' or '..' components"
		case used[m.Path]:
			why = fmt.Sprintf("path '%s' is already used", m.Path)
		case m.Name == "":
			why = "name cannot be empty"
		}
		if why != "" {
			problems = append(problems, fmt.Sprintf("volume mount #%d: %s", i, why))
			continue
		}
		used[m.Path] = true
		out = append(out, sandbox.VolumeMount{Name: m.Name, Path: m.Path})
	}
	if len(problems) > 0 {
		return nil, errors.New("invalid mounts:\n\t- " + strings.Join(problems, "\n\t- "))
	}
	return out, nil
}
