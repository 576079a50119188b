package httpapi

import (
	"cmp"
	"encoding/hex"
	"errors"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/build"
	"github.com/airlock-sandbox/airlock/internal/image"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// The template list (the CLI's e2b template list) and E2B's publish
// (PATCH, public): every template a create can start from, the server's
// own and the image store's (not its snapshots, which GET /snapshots
// lists). The server has one team, whoever holds its API key: its
// templates are all that team's, none is public, and there is no other
// team to publish one to.

// templateJSON is E2B's Template.
type templateJSON struct {
	TemplateID    string     `json:"templateID"`
	BuildID       string     `json:"buildID"`
	CPUCount      int64      `json:"cpuCount"`
	MemoryMB      int64      `json:"memoryMB"`
	DiskSizeMB    int64      `json:"diskSizeMB"`
	Public        bool       `json:"public"`
	Aliases       []string   `json:"aliases"`
	Names         []string   `json:"names"`
	CreatedAt     time.Time  `json:"createdAt"`
	UpdatedAt     time.Time  `json:"updatedAt"`
	CreatedBy     *struct{}  `json:"createdBy"` // no user made it: an API key did
	LastSpawnedAt *time.Time `json:"lastSpawnedAt"`
	SpawnCount    int64      `json:"spawnCount"`
	BuildCount    int64      `json:"buildCount"`
	EnvdVersion   string     `json:"envdVersion"`
	BuildStatus   string     `json:"buildStatus"`
}

// buildIDOf is what E2B calls the build of an image: the key of the build
// that made it, or, for one pulled or imported, its manifest's digest.
func buildIDOf(img *image.Image) string { return cmp.Or(img.BuildKey, img.Digest) }

// templateOf describes the template called id, whose sandboxes get pol.
func (s *Server) templateOf(id string, pol policy.Policy, created, updated time.Time) templateJSON {
	return templateJSON{
		TemplateID: id, CPUCount: cpuCount(pol.CPUs), MemoryMB: pol.MemoryBytes >> 20,
		DiskSizeMB: pol.WritableBytes() >> 20, Aliases: []string{id}, Names: []string{id},
		CreatedAt: created, UpdatedAt: updated, EnvdVersion: agentproto.EnvdVersion, BuildStatus: "ready",
	}
}

// templateList is every template, the server's own first, then the image
// store's by name.
func (s *Server) templateList() ([]templateJSON, error) {
	var out []templateJSON
	for _, t := range s.m.Configured() {
		tj := s.templateOf(t.Name, t.Policy, s.m.Started(), s.m.Started())
		s.addUse(&tj, t.Name)
		out = append(out, tj)
	}
	if s.templates == nil {
		return out, nil
	}
	imgs, err := s.templates.Store.List()
	if err != nil {
		return nil, err
	}
	// A template is a name; its tags are images of "name:tag".
	byName := map[string][]*image.Image{}
	for _, img := range imgs {
		if img.Snapshot != nil {
			continue
		}
		n, _, _ := strings.Cut(img.Name, ":")
		if !s.m.IsConfigured(n) {
			byName[n] = append(byName[n], img)
		}
	}
	for _, n := range slices.Sorted(maps.Keys(byName)) {
		tags := byName[n]
		// Its default tag's, else its newest tag's.
		main := slices.MaxFunc(tags, func(a, b *image.Image) int {
			if (a.Name == n) != (b.Name == n) {
				if a.Name == n {
					return 1
				}
				return -1
			}
			return a.Created.Compare(b.Created)
		})
		tmpl, err := s.m.Lookup(main.Name)
		if err != nil {
			if errors.Is(err, sandbox.ErrUnknownTemplate) {
				continue // removed meanwhile
			}
			return nil, err
		}
		created := slices.MinFunc(tags, func(a, b *image.Image) int { return a.Created.Compare(b.Created) }).Created
		updated := slices.MaxFunc(tags, func(a, b *image.Image) int { return a.Created.Compare(b.Created) }).Created
		tj := s.templateOf(n, tmpl.Policy, created, updated)
		tj.BuildID = buildIDOf(main)
		builds := map[string]bool{}
		for _, img := range tags {
			if img.BuildKey != "" {
				builds[img.BuildKey] = true
			}
			s.addUse(&tj, img.Name)
		}
		tj.BuildCount = int64(len(builds))
		out = append(out, tj)
	}
	return out, nil
}

// addUse adds the sandboxes created of the template (or tag) called name
// since the server started.
func (s *Server) addUse(tj *templateJSON, name string) {
	n, last := s.m.Use(name)
	tj.SpawnCount += n
	if n > 0 && (tj.LastSpawnedAt == nil || last.After(*tj.LastSpawnedAt)) {
		tj.LastSpawnedAt = &last
	}
}

// listTemplates is E2B's GET /templates: all of them.
func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) {
	if !s.oneTeam(w, r) {
		return
	}
	out, err := s.templateList()
	if err != nil {
		s.managerError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// listTemplatesV2 is E2B's GET /v2/templates: pages of at most limit
// (100), X-Next-Token naming where the next starts.
func (s *Server) listTemplatesV2(w http.ResponseWriter, r *http.Request) {
	if !s.oneTeam(w, r) {
		return
	}
	all, err := s.templateList()
	if err != nil {
		s.managerError(w, err)
		return
	}
	q := r.URL.Query()
	if tok := q.Get("nextToken"); tok != "" {
		last, err := hex.DecodeString(tok)
		i := slices.IndexFunc(all, func(t templateJSON) bool { return t.TemplateID == string(last) })
		if err != nil || i < 0 {
			writeError(w, http.StatusBadRequest, "invalid nextToken: pass on the X-Next-Token of the previous page")
			return
		}
		all = all[i+1:]
	}
	limit := min(len(all), 100)
	if v := q.Get("limit"); v != "" {
		l, err := strconv.Atoi(v)
		if err != nil || l < 1 || l > 100 {
			writeError(w, http.StatusBadRequest, "limit must be a number from 1 to 100, not %q", v)
			return
		}
		limit = min(l, len(all))
	}
	if limit < len(all) {
		w.Header().Set("X-Next-Token", hex.EncodeToString([]byte(all[limit-1].TemplateID)))
	}
	writeJSON(w, http.StatusOK, all[:limit])
}

// oneTeam refuses a teamID that is not this server's one team: there is
// no other, so the only one a client can name is the empty one.
func (s *Server) oneTeam(w http.ResponseWriter, r *http.Request) bool {
	if v := r.URL.Query().Get("teamID"); v != "" {
		writeError(w, http.StatusBadRequest, "this server has one team, whose templates are listed without a teamID: drop teamID %q", v)
		return false
	}
	return true
}

// updateTemplate is E2B's PATCH /v2/templates/{id} (and the older
// PATCH /templates/{id}, which answers no body): publish or unpublish.
// Unpublishing is what every template here is; publishing would open it
// to other teams, of which this server has none.
func (s *Server) updateTemplate(w http.ResponseWriter, r *http.Request) {
	raw, ok := readBody(w, r)
	if !ok {
		return
	}
	if err := refuseUnknown(raw, []string{"public"}, ""); err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	var body struct {
		Public *bool `json:"public"`
	}
	if !unmarshal(w, raw, &body) {
		return
	}
	id, _, _ := strings.Cut(build.Normalize(r.PathValue("id")), ":")
	if !s.m.TemplateExists(id) {
		writeError(w, http.StatusNotFound, "template %q not found", id)
		return
	}
	if body.Public != nil && *body.Public {
		writeError(w, http.StatusBadRequest, "template %s cannot be made public: this server has one team, everyone with its API key, who can use every template already; there is no other team to publish it to", id)
		return
	}
	if !strings.HasPrefix(r.URL.Path, "/v2/") {
		w.WriteHeader(http.StatusOK)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"names": []string{id}})
}
