package httpapi

import (
	"cmp"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/build"
	"github.com/airlock-sandbox/airlock/internal/image"
)

// Snapshots and forks (E2B's createSnapshot, listSnapshots,
// deleteSnapshot, fork). A snapshot is a template of the image store:
// Sandbox.create(snapshotID) starts from it, DELETE /templates/{id}
// removes it, and it lasts until then, beyond the sandbox it was taken
// of.

func (s *Server) handleSnapshots() {
	api := s.api
	api("POST /sandboxes/{id}/snapshots", s.createSnapshot)
	api("GET /snapshots", s.listSnapshots)
	api("POST /sandboxes/{id}/fork", s.fork)
}

// snapshotInfo is E2B's SnapshotInfo.
type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func infoOf(img *image.Image) snapshotInfo {
	n := img.Name
	if !strings.Contains(n, ":") {
		n += ":default"
	}
	return snapshotInfo{SnapshotID: n, Names: []string{n}}
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	raw, ok := readBody(w, r)
	if !ok {
		return
	}
	if err := refuseUnknown(raw, []string{"name"}, ""); err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	var body struct {
		Name string `json:"name"`
	}
	if !unmarshal(w, raw, &body) {
		return
	}
	if s.templates == nil {
		writeError(w, http.StatusBadRequest, "this server keeps no templates, so no snapshots")
		return
	}
	store := s.templates.Store
	name := build.Normalize(body.Name)
	if name != "" {
		if err := image.CheckName(name); err != nil {
			writeError(w, http.StatusBadRequest, "snapshot name: %v", err)
			return
		}
		// A name is the snapshot's to take: an image that is not a
		// snapshot keeps it.
		if img, err := store.Get(name); err == nil && img.Snapshot == nil {
			writeError(w, http.StatusConflict, "template %q exists and is not a snapshot: choose another name", name)
			return
		}
	}
	if _, err := s.m.Get(id); err != nil {
		s.managerError(w, err)
		return
	}
	// What no image names is pruned: not while the state is saved.
	release, err := store.Hold()
	if err != nil {
		s.managerError(w, err)
		return
	}
	defer release()
	dirName, dir, err := store.NewSnapshotDir()
	if err != nil {
		s.managerError(w, err)
		return
	}
	of, err := s.m.Snapshot(r.Context(), id, dir)
	if err != nil {
		os.RemoveAll(dir)
		s.managerError(w, err)
		return
	}
	if name == "" {
		name = "snapshot-" + dirName[:16]
	}
	img := &image.Image{Name: name, Source: "snapshot of sandbox " + id, Created: time.Now().UTC(),
		Snapshot: &image.Snapshot{Dir: dirName, Sandbox: id, Template: of.Template, Backend: of.Backend.Name(), Policy: of.Policy}}
	for _, vm := range of.VolumeMounts {
		img.Snapshot.Volumes = append(img.Snapshot.Volumes, image.SnapshotVolume{Name: vm.Name, Path: vm.Path})
	}
	// A sandbox of an image keeps that image's layers, which its clones
	// run on, for as long as the snapshot is.
	if base, err := store.Get(build.Normalize(of.Template)); err == nil {
		img.Layers, img.Size, img.Config, img.Resources = base.Layers, base.Size, base.Config, base.Resources
		img.Digest = base.Digest
	}
	if err := store.Save(img); err != nil {
		os.RemoveAll(dir)
		s.managerError(w, err)
		return
	}
	release()
	store.Prune() // the state of the snapshot this name had, if any
	writeJSON(w, http.StatusCreated, infoOf(img))
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var snaps []*image.Image
	if s.templates != nil {
		imgs, err := s.templates.Store.List()
		if err != nil {
			s.managerError(w, err)
			return
		}
		for _, img := range imgs {
			if img.Snapshot != nil {
				snaps = append(snaps, img)
			}
		}
	}
	// Newest first, the name breaking ties: the order the page token
	// counts in.
	slices.SortFunc(snaps, func(a, b *image.Image) int {
		return cmp.Or(b.Created.Compare(a.Created), strings.Compare(a.Name, b.Name))
	})
	if v := q.Get("sandboxID"); v != "" {
		snaps = slices.DeleteFunc(snaps, func(img *image.Image) bool { return img.Snapshot.Sandbox != v })
	}
	if v := q.Get("name"); v != "" {
		// "name", "name:tag", or a team-qualified "team/name[:tag]": this
		// server has one team.
		if _, after, ok := strings.Cut(v, "/"); ok {
			v = after
		}
		v = build.Normalize(v)
		snaps = slices.DeleteFunc(snaps, func(img *image.Image) bool {
			n, _, _ := strings.Cut(img.Name, ":")
			return img.Name != v && n != v
		})
	}
	if tok := q.Get("nextToken"); tok != "" {
		last, err := hex.DecodeString(tok)
		i := slices.IndexFunc(snaps, func(img *image.Image) bool { return img.Name == string(last) })
		if err != nil || i < 0 {
			writeError(w, http.StatusBadRequest, "invalid nextToken: pass on the X-Next-Token of the previous page")
			return
		}
		snaps = snaps[i+1:]
	}
	limit, err := pageLimit(q.Get("limit"), len(snaps))
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	if limit < len(snaps) {
		w.Header().Set("X-Next-Token", hex.EncodeToString([]byte(snaps[limit-1].Name)))
	}
	out := make([]snapshotInfo, 0, limit)
	for _, img := range snaps[:limit] {
		out = append(out, infoOf(img))
	}
	writeJSON(w, http.StatusOK, out)
}

// forkDefaultTimeout is E2B's, for a fork request without one.
const forkDefaultTimeout = 15 * time.Second

func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	raw, ok := readBody(w, r)
	if !ok {
		return
	}
	if err := refuseUnknown(raw, []string{"count", "timeout"}, ""); err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	var body struct {
		Count   *int   `json:"count"`
		Timeout *int64 `json:"timeout"`
	}
	if !unmarshal(w, raw, &body) {
		return
	}
	count, ttl := 1, forkDefaultTimeout
	if body.Count != nil {
		count = *body.Count
	}
	if body.Timeout != nil {
		if *body.Timeout <= 0 {
			writeError(w, http.StatusBadRequest, "timeout must be a positive number of seconds")
			return
		}
		ttl = seconds(*body.Timeout)
	}
	results, err := s.m.Fork(r.Context(), r.PathValue("id"), count, ttl)
	if err != nil {
		s.managerError(w, err)
		return
	}
	type forkResult struct {
		Sandbox *sandboxJSON `json:"sandbox,omitempty"`
		Error   *errorBody   `json:"error,omitempty"`
	}
	out := make([]forkResult, len(results))
	for i, res := range results {
		if res.Err != nil {
			status, msg := s.errorOf(res.Err)
			out[i].Error = &errorBody{Code: status, Message: msg}
			continue
		}
		obj := s.sandboxObject(res.Sandbox)
		out[i].Sandbox = &obj
	}
	writeJSON(w, http.StatusCreated, out)
}

// unmarshal decodes raw into v, or answers 400.
func unmarshal(w http.ResponseWriter, raw []byte, v any) bool {
	if len(raw) == 0 {
		return true
	}
	if err := json.Unmarshal(raw, v); err != nil {
		writeError(w, http.StatusBadRequest, "invalid JSON body: %v", err)
		return false
	}
	return true
}
