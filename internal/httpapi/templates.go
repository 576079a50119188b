package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/build"
	"github.com/airlock-sandbox/airlock/internal/image"
)

// Templates is what the build API needs: the builds and the image store
// they write to.
type Templates struct {
	Builds *build.Service
	Store  *image.Store
	Files  *build.Files
}

// HandleTemplates serves E2B's template build API over t: the routes
// the SDK's Template builder calls.
func (s *Server) HandleTemplates(t *Templates) {
	s.templates = t
	api := s.api
	api("POST /v3/templates", s.requestBuild)
	api("GET /templates/{id}/files/{hash}", s.uploadLink)
	api("POST /v2/templates/{id}/builds/{buildID}", s.startBuild)
	api("GET /templates/{id}/builds/{buildID}/status", s.buildStatus)
	api("GET /templates/{id}/builds/{buildID}/logs", s.buildLogs)
	api("POST /templates/tags", s.assignTags)
	api("DELETE /templates/tags", s.removeTags)
	api("DELETE /templates/{id}", s.deleteTemplate)
	// Signed instead: the SDK puts the archive to the URL it was given,
	// without the API key.
	s.patterns = append(s.patterns, "PUT /templates/{id}/files/{hash}")
	s.mux.HandleFunc("PUT /templates/{id}/files/{hash}", s.upload)
}

var requestBuildFields = []string{"name", "alias", "tags", "cpuCount", "memoryMB", "minFreeDiskMb", "teamID"}

func (s *Server) requestBuild(w http.ResponseWriter, r *http.Request) {
	raw, ok := readBody(w, r)
	if !ok {
		return
	}
	if err := refuseUnknown(raw, requestBuildFields, ""); err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	var body struct {
		Name          string   `json:"name"`
		Alias         string   `json:"alias"`
		Tags          []string `json:"tags"`
		CPUCount      float64  `json:"cpuCount"`
		MemoryMB      int64    `json:"memoryMB"`
		MinFreeDiskMB int64    `json:"minFreeDiskMb"`
	}
	if err := json.Unmarshal(raw, &body); err != nil {
		writeError(w, http.StatusBadRequest, "invalid JSON body: %v", err)
		return
	}
	if body.Name == "" {
		body.Name = body.Alias
	}
	id, tags, err := build.ParseName(body.Name, body.Tags)
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	if body.CPUCount < 0 || body.MemoryMB < 0 || body.MinFreeDiskMB < 0 {
		writeError(w, http.StatusBadRequest, "cpuCount, memoryMB and minFreeDiskMb must not be negative")
		return
	}
	if s.m.IsConfigured(id) {
		writeError(w, http.StatusBadRequest, "template %s is one of the server's own: build under another name", id)
		return
	}
	b, err := s.templates.Builds.Request(id, tags, image.Resources{CPUs: body.CPUCount, MemoryMB: body.MemoryMB, DiskMB: body.MinFreeDiskMB})
	if errors.Is(err, build.ErrTooMany) {
		writeError(w, http.StatusTooManyRequests, "%v", err)
		return
	} else if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]any{
		"templateID": id, "buildID": b.BuildID, "tags": tags,
		"names": []string{id}, "aliases": []string{id}, "public": false,
	})
}

// uploadLink says whether a COPY's files are here, and where to put them:
// a URL signed for this upload, valid for an hour. As E2B's, the URL comes
// with files that are present too, for a copy with forceUpload, which the
// SDK uploads again whatever is here (the first upload of a hash stays:
// Files.Put).
func (s *Server) uploadLink(w http.ResponseWriter, r *http.Request) {
	id, hash := r.PathValue("id"), r.PathValue("hash")
	if len(hash) != 64 || strings.Trim(hash, "0123456789abcdef") != "" {
		writeError(w, http.StatusBadRequest, "files hash %q is not a sha256", hash)
		return
	}
	expires := time.Now().Add(time.Hour)
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	q := url.Values{"expires": {strconv.FormatInt(expires.Unix(), 10)}, "token": {s.templates.Builds.UploadToken(id, hash, expires)}}
	u := fmt.Sprintf("%s://%s/templates/%s/files/%s?%s", scheme, r.Host, url.PathEscape(id), hash, q.Encode())
	writeJSON(w, http.StatusCreated, map[string]any{"present": s.templates.Files.Has(hash), "url": u})
}

func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	id, hash := r.PathValue("id"), r.PathValue("hash")
	expires, _ := strconv.ParseInt(r.URL.Query().Get("expires"), 10, 64)
	if !s.templates.Builds.CheckUpload(id, hash, r.URL.Query().Get("token"), expires) {
		writeError(w, http.StatusForbidden, "the upload URL is not valid, or has expired: ask for another")
		return
	}
	err := s.templates.Files.Put(hash, r.Body)
	switch {
	case errors.Is(err, build.ErrTooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, "%v", err)
	case err != nil:
		s.log.Error("build upload", "err", err)
		writeError(w, http.StatusInternalServerError, "internal error: the upload could not be stored")
	default:
		w.WriteHeader(http.StatusOK)
	}
}

var startBuildFields = []string{"fromImage", "fromTemplate", "fromImageRegistry", "steps", "startCmd", "readyCmd", "force"}

// stepFields: forceUpload, resolveSymlinks and gzip are the SDK's own
// options of a copy's upload, sent along with the step.
var stepFields = []string{"type", "args", "filesHash", "force", "forceUpload", "resolveSymlinks", "gzip"}

func (s *Server) startBuild(w http.ResponseWriter, r *http.Request) {
	b, err := s.templates.Builds.Get(r.PathValue("id"), r.PathValue("buildID"))
	if err != nil {
		writeError(w, http.StatusNotFound, "%v", err)
		return
	}
	raw, ok := readBody(w, r)
	if !ok {
		return
	}
	if err := refuseUnknown(raw, startBuildFields, ""); err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	var req build.Request
	if err := json.Unmarshal(raw, &req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid JSON body: %v", err)
		return
	}
	var steps struct {
		Steps []json.RawMessage `json:"steps"`
	}
	json.Unmarshal(raw, &steps)
	for i, st := range steps.Steps {
		if err := refuseUnknown(st, stepFields, fmt.Sprintf("steps[%d].", i)); err != nil {
			writeError(w, http.StatusBadRequest, "%v", err)
			return
		}
	}
	err = s.templates.Builds.Start(b, &req)
	switch {
	case errors.Is(err, build.ErrConflict):
		writeError(w, http.StatusConflict, "%v", err)
	case err != nil:
		writeError(w, http.StatusBadRequest, "%v", err)
	default:
		w.WriteHeader(http.StatusAccepted)
	}
}

// templateGet answers GET /templates/aliases/{alias} and, with a build
// service, GET /templates/{id}/tags (one pattern: the two overlap).
func (s *Server) templateGet(w http.ResponseWriter, r *http.Request) {
	a, b := r.PathValue("a"), r.PathValue("b")
	switch {
	case a == "aliases":
		s.templateExists(w, r, b)
	case b == "tags" && s.templates != nil:
		s.templateTags(w, r, a)
	default:
		writeError(w, http.StatusNotFound, "no such route")
	}
}

// templateExists: 200 for the server's own templates and those of the
// image store, 404 otherwise.
func (s *Server) templateExists(w http.ResponseWriter, r *http.Request, alias string) {
	if !s.m.TemplateExists(alias) {
		writeError(w, http.StatusNotFound, "template %q not found", alias)
		return
	}
	id, _, _ := strings.Cut(alias, ":")
	writeJSON(w, http.StatusOK, map[string]any{"templateID": id, "public": false})
}

func (s *Server) assignTags(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Target string   `json:"target"`
		Tags   []string `json:"tags"`
	}
	if !decode(w, r, &body) {
		return
	}
	id, from, err := build.ParseName(body.Target, nil)
	if err == nil && len(body.Tags) == 0 {
		err = errors.New("give the tags to assign")
	}
	var tags []string
	if err == nil {
		_, tags, err = build.ParseName(id, body.Tags)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	img, err := s.templates.Store.Get(build.StoreName(id, from[0]))
	if errors.Is(err, image.ErrNotFound) {
		writeError(w, http.StatusNotFound, "template %s has no tag %s", id, from[0])
		return
	} else if err != nil {
		s.managerError(w, err)
		return
	}
	for _, t := range tags {
		rec := *img
		rec.Name = build.StoreName(id, t)
		if err := s.templates.Store.Save(&rec); err != nil {
			s.managerError(w, err)
			return
		}
	}
	writeJSON(w, http.StatusCreated, map[string]any{"buildID": buildIDOf(img), "tags": tags})
}

func (s *Server) removeTags(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Name string   `json:"name"`
		Tags []string `json:"tags"`
	}
	if !decode(w, r, &body) {
		return
	}
	id, tags, err := build.ParseName(body.Name, body.Tags)
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	for _, t := range tags {
		if err := s.templates.Store.Remove(build.StoreName(id, t)); err != nil && !errors.Is(err, image.ErrNotFound) {
			s.managerError(w, err)
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) templateTags(w http.ResponseWriter, r *http.Request, id string) {
	imgs, err := s.templates.Store.List()
	if err != nil {
		s.managerError(w, err)
		return
	}
	out := []map[string]any{}
	for _, img := range imgs {
		n, tag, _ := strings.Cut(img.Name, ":")
		if n != id {
			continue
		}
		if tag == "" {
			tag = "default"
		}
		out = append(out, map[string]any{"tag": tag, "buildID": buildIDOf(img), "createdAt": img.Created})
	}
	if len(out) == 0 {
		writeError(w, http.StatusNotFound, "template %q not found", id)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteTemplate removes every tag of a template, and the layers no
// other template has.
func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	// "name" or "name:default" is every tag of it; "name:tag" that one
	// (a snapshotID is "name:default").
	id := build.Normalize(r.PathValue("id"))
	imgs, err := s.templates.Store.List()
	if err != nil {
		s.managerError(w, err)
		return
	}
	found := false
	for _, img := range imgs {
		if n, _, _ := strings.Cut(img.Name, ":"); n == id || img.Name == id {
			found = true
			if err := s.templates.Store.Remove(img.Name); err != nil {
				s.managerError(w, err)
				return
			}
		}
	}
	if !found {
		writeError(w, http.StatusNotFound, "template %q not found", id)
		return
	}
	// Layers no image has any more go too (Remove prunes), but for those
	// of images being made (image.Store.Hold).
	w.WriteHeader(http.StatusNoContent)
}
