package httpapi

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/build"
	"github.com/airlock-sandbox/airlock/internal/image"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// storeSource is the templates of an image store, each with half of
// base's CPUs: what the daemon's Source does, in small.
type storeSource struct{ store *image.Store }

func (s storeSource) Template(name string) (sandbox.Template, error) {
	name = build.Normalize(name)
	if _, err := s.store.Get(name); err != nil {
		return sandbox.Template{}, fmt.Errorf("%w %q", sandbox.ErrUnknownTemplate, name)
	}
	p := policy.Default()
	p.CPUs /= 2
	return sandbox.Template{Name: name, Policy: p}, nil
}

// withStore is an API over a manager whose Source is an image store
// holding imgs, with the build API.
func withStore(t *testing.T, imgs ...*image.Image) *api {
	t.Helper()
	return withStoreConfig(t, sandbox.Config{}, imgs...)
}

// withStoreConfig is withStore over a manager of cfg.
func withStoreConfig(t *testing.T, cfg sandbox.Config, imgs ...*image.Image) *api {
	t.Helper()
	dir := t.TempDir()
	store, err := image.Open(filepath.Join(dir, "images"), image.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range imgs {
		if err := store.Save(img); err != nil {
			t.Fatal(err)
		}
	}
	files, err := build.OpenFiles(filepath.Join(dir, "uploads"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Source = storeSource{store}
	a := newAPI(t, cfg)
	svc := &build.Service{Builder: &build.Builder{Store: store, Registries: noRegistry{}}, Log: slog.New(slog.DiscardHandler), Timeout: time.Second}
	t.Cleanup(svc.Shutdown)
	a.s.HandleTemplates(&Templates{Builds: svc, Store: store, Files: files})
	return a
}

// TestTemplateList: the CLI's e2b template list has every template a
// create can use, with what its sandboxes get and how often they were
// made; snapshots are not templates here.
func TestTemplateList(t *testing.T) {
	day := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	a := withStore(t,
		&image.Image{Name: "app", Created: day, BuildKey: "k1"},
		&image.Image{Name: "app:v2", Created: day.Add(time.Hour), BuildKey: "k2"},
		&image.Image{Name: "pulled", Created: day, Digest: "sha256:abc"},
		&image.Image{Name: "snap", Created: day, Snapshot: &image.Snapshot{Dir: "x"}})
	a.create(map[string]any{"templateID": "app:v2"})
	a.create(nil)

	code, data := a.call("GET", "/templates", nil)
	var list []templateJSON
	if code != http.StatusOK || json.Unmarshal(data, &list) != nil {
		t.Fatalf("list: %d %s", code, data)
	}
	byID := map[string]templateJSON{}
	var ids []string
	for _, tj := range list {
		ids = append(ids, tj.TemplateID)
		byID[tj.TemplateID] = tj
	}
	if fmt.Sprint(ids) != "[base app pulled]" {
		t.Fatalf("templates %v, want base, app and pulled", ids)
	}
	app := byID["app"]
	if app.BuildID != "k1" || app.BuildCount != 2 || app.SpawnCount != 1 || app.LastSpawnedAt == nil ||
		!app.CreatedAt.Equal(day) || !app.UpdatedAt.Equal(day.Add(time.Hour)) || app.Public || app.CPUCount != 1 ||
		app.MemoryMB != 512 || app.BuildStatus != "ready" || fmt.Sprint(app.Names) != "[app]" {
		t.Errorf("app: %+v", app)
	}
	if p := byID["pulled"]; p.BuildID != "sha256:abc" || p.BuildCount != 0 || p.SpawnCount != 0 || p.LastSpawnedAt != nil {
		t.Errorf("pulled: %+v", p)
	}
	if b := byID["base"]; b.SpawnCount != 1 || b.CreatedAt.IsZero() {
		t.Errorf("base: %+v", b)
	}
	if code, _ := a.call("GET", "/templates?teamID=other", nil); code != http.StatusBadRequest {
		t.Errorf("another team's templates: %d, want 400", code)
	}

	// v2 pages them.
	code, hdr, data := a.do("GET", "/v2/templates?limit=2", nil, http.Header{"X-Api-Key": {key}})
	if json.Unmarshal(data, &list) != nil || code != 200 || len(list) != 2 || hdr.Get("X-Next-Token") == "" {
		t.Fatalf("v2 page 1: %d %s %v", code, data, hdr)
	}
	code, data = a.call("GET", "/v2/templates?nextToken="+hdr.Get("X-Next-Token"), nil)
	if json.Unmarshal(data, &list) != nil || code != 200 || len(list) != 1 || list[0].TemplateID != "pulled" {
		t.Errorf("v2 page 2: %d %s", code, data)
	}
	for _, q := range []string{"limit=101", "limit=0", "nextToken=zz"} {
		if code, _ := a.call("GET", "/v2/templates?"+q, nil); code != http.StatusBadRequest {
			t.Errorf("v2 ?%s: %d, want 400", q, code)
		}
	}
}

// TestTemplatePublish: E2B's publish (the CLI's e2b template publish)
// is refused, saying why: the one team has every template already;
// unpublishing is what every template is.
func TestTemplatePublish(t *testing.T) {
	a := withStore(t, &image.Image{Name: "app", Created: time.Now()})
	code, data := a.call("PATCH", "/v2/templates/app", map[string]any{"public": false})
	var names struct{ Names []string }
	if code != http.StatusOK || json.Unmarshal(data, &names) != nil || fmt.Sprint(names.Names) != "[app]" {
		t.Errorf("unpublish: %d %s", code, data)
	}
	if code, data := a.call("PATCH", "/v2/templates/app:default", nil); code != http.StatusOK {
		t.Errorf("an empty update: %d %s", code, data)
	}
	code, data = a.call("PATCH", "/v2/templates/app", map[string]any{"public": true})
	if msg := apiError(t, code, data); code != http.StatusBadRequest || msg == "" {
		t.Errorf("publish: %d %s, want 400 saying why", code, data)
	}
	if code, data := a.call("PATCH", "/templates/base", map[string]any{"public": false}); code != http.StatusOK || len(data) != 0 {
		t.Errorf("v1 unpublish of base: %d %q", code, data)
	}
	for body, want := range map[string]int{`{"public": "yes"}`: 400, `{"name": "x"}`: 400} {
		if code, _ := a.call("PATCH", "/v2/templates/app", body); code != want {
			t.Errorf("update %s: %d, want %d", body, code, want)
		}
	}
	if code, _ := a.call("PATCH", "/v2/templates/nope", map[string]any{"public": false}); code != http.StatusNotFound {
		t.Errorf("update of no template: %d, want 404", code)
	}
	if list := a.templates(t); list["app"].Public {
		t.Error("app is public after a refused publish")
	}
}

func (a *api) templates(t *testing.T) map[string]templateJSON {
	t.Helper()
	_, data := a.call("GET", "/templates", nil)
	var list []templateJSON
	if err := json.Unmarshal(data, &list); err != nil {
		t.Fatal(err)
	}
	out := map[string]templateJSON{}
	for _, tj := range list {
		out[tj.TemplateID] = tj
	}
	return out
}
