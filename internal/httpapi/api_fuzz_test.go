package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/backend/fake"
	"github.com/airlock-sandbox/airlock/internal/build"
	"github.com/airlock-sandbox/airlock/internal/image"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// The fuzzers of the API's parsers of client input: request bodies and
// queries through the real handler (a Manager over the fake backend),
// and the pure parsers beside them. Every answer to garbage is the
// client's fault (4xx, never 5xx), said in one line that names no host
// directory.

// fuzzAPI is a Server with the build API on a Manager over the fake
// backend; requests go straight to its handler.
type fuzzAPI struct {
	s *Server
	m *sandbox.Manager
	// hostDirs are directories of the server's that no answer may name:
	// the fake backend's, the image store's, the uploads', the binary's.
	hostDirs []string
	builds   *build.Service
	// build is a requested build not started yet, for startBuild.
	build *build.Build
	// id is a sandbox with a network that requests aim at.
	id string
}

// noRegistry refuses every pull: a build started by a fuzzer must end
// without reaching anything.
type noRegistry struct{}

func (noRegistry) RoundTrip(*http.Request) (*http.Response, error) {
	return nil, errors.New("no registry in a fuzz test")
}

func newFuzzAPI(f *testing.F) *fuzzAPI {
	f.Helper()
	log := slog.New(slog.DiscardHandler)
	dir := f.TempDir()
	b := fake.New(filepath.Join(dir, "be"), log)
	b.SetMemory(20 << 20)
	m := sandbox.NewManager(sandbox.Config{
		DefaultTTL: time.Minute, MaxTTL: time.Hour, MaxSandboxes: 8, Network: &fakeNetwork{},
		Templates: []sandbox.Template{{Name: "base", Policy: policy.Default()}},
	}, b, log)
	f.Cleanup(m.Shutdown)
	store, err := image.Open(filepath.Join(dir, "images"), image.DefaultLimits)
	if err != nil {
		f.Fatal(err)
	}
	files, err := build.OpenFiles(filepath.Join(dir, "uploads"), 1<<20)
	if err != nil {
		f.Fatal(err)
	}
	// An upload outside the uploads' directory: no hash may name it.
	if err := os.WriteFile(filepath.Join(dir, "planted.tar"), nil, 0o600); err != nil {
		f.Fatal(err)
	}
	a := &fuzzAPI{s: New(m, key, "sandbox.test", log), m: m}
	a.hostDirs = append([]string{dir}, a.s.hostDirs...)
	a.newBuilds(store)
	a.s.HandleTemplates(&Templates{Builds: a.builds, Store: store, Files: files})
	f.Cleanup(func() { a.builds.Shutdown() })
	return a
}

// newBuilds makes a build service of its own, with a requested build:
// one service knows at most 1,000 builds.
func (a *fuzzAPI) newBuilds(store *image.Store) {
	if a.builds != nil {
		a.builds.Shutdown()
	}
	a.builds = &build.Service{
		Builder: &build.Builder{Store: store, Registries: noRegistry{}},
		Log:     slog.New(slog.DiscardHandler), Timeout: 10 * time.Second, Parallel: 1,
	}
	if a.s.templates != nil {
		a.s.templates.Builds = a.builds
	}
	a.build = nil
}

// pendingBuild is a requested build that was not started.
func (a *fuzzAPI) pendingBuild(t *testing.T) *build.Build {
	t.Helper()
	if a.build == nil {
		b, err := a.builds.Request("fuzz", []string{"default"}, image.Resources{})
		if errors.Is(err, build.ErrTooMany) {
			a.newBuilds(a.s.templates.Store)
			b, err = a.builds.Request("fuzz", []string{"default"}, image.Resources{})
		}
		if err != nil {
			t.Fatal(err)
		}
		a.build = b
	}
	return a.build
}

// sandbox returns the id of a sandbox with a network, created if the
// last one is gone (a fuzzed timeout may end it).
func (a *fuzzAPI) sandbox(t *testing.T) string {
	t.Helper()
	if _, err := a.m.Get(a.id); err == nil {
		return a.id
	}
	w := a.do("POST", "/v2/sandboxes", "", []byte(`{"network":{"allowOut":[]}}`))
	if w.Code != http.StatusCreated {
		t.Fatalf("create: %d %s", w.Code, w.Body)
	}
	var c sandboxJSON
	if err := json.Unmarshal(w.Body.Bytes(), &c); err != nil {
		t.Fatal(err)
	}
	a.id = c.SandboxID
	return a.id
}

func (a *fuzzAPI) do(method, target, rawQuery string, body []byte) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, bytes.NewReader(body))
	r.URL.RawQuery = rawQuery
	r.Header.Set("X-Api-Key", key)
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	a.s.ServeHTTP(w, r)
	return w
}

// check fails t unless w, the answer to input, is a success or the
// client's fault, and a refusal is E2B's error body whose message is
// one line and names no host directory (unless the client did).
func (a *fuzzAPI) check(t *testing.T, w *httptest.ResponseRecorder, input string) {
	t.Helper()
	if w.Code >= 500 {
		t.Fatalf("answered %d %s to %q, want a success or a 4xx", w.Code, w.Body, input)
	}
	if w.Code < 400 {
		return
	}
	var e errorBody
	if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Code != w.Code || e.Message == "" {
		t.Fatalf("refusal %d %q to %q: want {code: %d, message}", w.Code, w.Body, input, w.Code)
	}
	if false && strings.ContainsAny(e.Message, "\r\n") {
		t.Errorf("refusal %d to %q is more than one line: %q", w.Code, input, e.Message)
	}
	for _, d := range a.hostDirs {
		if strings.Contains(e.Message, d) && !strings.Contains(input, d) {
			t.Errorf("refusal %d to %q names the host directory %s: %q", w.Code, input, d, e.Message)
		}
	}
}

// Bodies the fuzzers start from: valid ones, and the nasty.
var fuzzBodies = []string{
	``, `{}`, `null`, `[]`, `"x"`, `1`, `{`, `{"templateID":`, `{}{}`, `{} trailing`,
	`{"templateID":"base","timeout":60,"metadata":{"user":"a"},"envVars":{"K":"v"},"secure":true}`,
	`{"allow_internet_access":true,"network":{"allowOut":["example.com","10.0.0.0/8"],"denyOut":["0.0.0.0/0"],` +
		`"allowPublicTraffic":false,"maskRequestHost":"${PORT}.example.com","httpsPorts":[8443]}}`,
	`{"autoPause":true,"autoPauseMemory":false,"autoResume":{"enabled":false}}`,
	`{"autoPauseMemory":false,"autoResume":{"enabled":true}}`,
	`{"templateID":"../../../etc/passwd"}`, `{"templateID":"/etc/passwd"}`, `{"templateID":"a\u0000b"}`,
	`{"envVars":{"A\u0000":"b"}}`, `{"envVars":{"A=B":"c"}}`, `{"envVars":{"":"c"}}`,
	`{"metadata":{"ключ":"値","emoji":"😀"}}`, `{"metadata":{"a":1}}`,
	`{"timeout":0}`, `{"timeout":-1}`, `{"timeout":18446744074}`, `{"timeout":9223372036854775807}`,
	`{"timeout":1e400}`, `{"timeout":"60"}`, `{"timeout":1.5}`,
	`{"network":{"httpsPorts":[0,65536,49983,-1]}}`, `{"network":{"maskRequestHost":"a b/c"}}`,
	`{"network":[1]}`, `{"network":{"rules":{"a":[1]}}}`, `{"network":null,"mcp":null,"volumeMounts":[]}`,
	`{"backend":"fake"}`, `{"volumeMounts":[{"name":"v","path":"/data"}]}`,
	`{"timeout":5,"TIMEOUT":null}`, `{"templateid":"base"}`, `{"a\tb":1}`, `{"network":{"a\tb":1}}`,
	`{"metadata":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}`,
	`{"allowOut":["example.com"],"denyOut":["*.evil.example"]}`, `{"allow_internet_access":false}`,
	`{"memory":false}`, `{"memory":true}`, `{"count":3,"timeout":30}`, `{"count":-1}`, `{"count":1000000}`,
	`{"name":"snap"}`, `{"name":"../x"}`, `{"name":"` + strings.Repeat("a", 200) + `"}`,
}

// FuzzCreateBody: a create request's body (E2B's NewSandbox, with its
// refusal of fields the server does not implement) never panics and is
// answered 201 with a sandbox, or refused as the client's fault in one
// line that names no host directory.
func FuzzCreateBody(f *testing.F) {
	for _, b := range fuzzBodies {
		f.Add([]byte(b))
	}
	a := newFuzzAPI(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		w := a.do("POST", "/v2/sandboxes", "", body)
		a.check(t, w, string(body))
		if w.Code != http.StatusCreated {
			return
		}
		var c sandboxJSON
		if err := json.Unmarshal(w.Body.Bytes(), &c); err != nil || c.SandboxID == "" || c.EnvdAccessToken == "" {
			t.Fatalf("create answered %s (%v): want a sandbox", w.Body, err)
		}
		if w := a.do("DELETE", "/sandboxes/"+c.SandboxID, "", nil); w.Code != http.StatusNoContent {
			t.Fatalf("kill of the created sandbox: %d %s", w.Code, w.Body)
		}
	})
}

// sandboxRoutes are the requests with a body about one sandbox.
var sandboxRoutes = []struct{ method, path string }{
	{"POST", "/sandboxes/%s/timeout"},
	{"POST", "/sandboxes/%s/connect"},
	{"POST", "/v2/sandboxes/%s/connect"},
	{"POST", "/sandboxes/%s/pause"},
	{"PUT", "/sandboxes/%s/network"},
	{"POST", "/sandboxes/%s/fork"},
	{"POST", "/sandboxes/%s/snapshots"},
}

// FuzzSandboxRequests: the bodies of timeout, connect, pause, network
// update, fork and snapshot requests never panic and are answered with
// a success or a refusal that is the client's fault, in one line that
// names no host directory.
func FuzzSandboxRequests(f *testing.F) {
	for i := range sandboxRoutes {
		for _, b := range fuzzBodies {
			f.Add(uint8(i), []byte(b))
		}
	}
	a := newFuzzAPI(f)
	f.Fuzz(func(t *testing.T, route uint8, body []byte) {
		rt := sandboxRoutes[int(route)%len(sandboxRoutes)]
		w := a.do(rt.method, fmt.Sprintf(rt.path, a.sandbox(t)), "", body)
		a.check(t, w, string(body))
	})
}

// logQueryRoutes is how many routes FuzzListQuery sends its queries to.
const logQueryRoutes = 8

// FuzzListQuery: the query of a sandbox list (metadata filter, state,
// order, startedAfter, limit, nextToken) never panics and is refused as
// the client's fault or answered with at most limit sandboxes that match
// the metadata filter, whose X-Next-Token opens a next page that holds
// none of them. Other queries (snapshots, metrics, several sandboxes'
// metrics, build status and logs, sandbox logs) are refused or
// answered, never failed.
func FuzzListQuery(f *testing.F) {
	for _, q := range []string{
		"", "limit=1", "limit=2&order=asc", "order=desc&state=running,paused", "state=paused&state=running",
		"metadata=" + url.QueryEscape("user=a"), "metadata=" + url.QueryEscape("user=a&n=2"),
		"metadata=%25zz", "metadata=" + url.QueryEscape("%zz=1"), "metadata=a%00b", "template=base",
		"startedAfter=2020-01-01T00:00:00Z", "startedAfter=yesterday", "limit=0", "limit=-1", "limit=ten",
		"limit=99999999999999999999", "nextToken=garbage", "nextToken=1.x", "nextToken=-9223372036854775808.",
		"nextToken=9223372036854775807.zzzz&limit=1", "order=sideways", "limit=1&limit=2", "%gg", "a=%",
		"name=" + url.QueryEscape("team/snap:tag"), "sandboxID=../x", "start=0&end=1", "start=-1", "end=x",
		"start=9223372036854775807&end=9223372036854775807", "logsOffset=-1", "logsOffset=99999999999",
		"metadata=" + url.QueryEscape("ключ=値"), "cursor=1&direction=backward&level=warn", "direction=up",
		"level=fatal", "search=" + strings.Repeat("x", 300), "limit=1001", "limit=101&level=debug", "source=persistent",
		"start=1700000000000&limit=3", "cursor=-5", "sandbox_ids=", "sandbox_ids=,,", "sandbox_ids=a,a,%00",
		"sandbox_ids=" + strings.Repeat("x,", 101), "sandbox_ids=../x&sandbox_ids=y",
	} {
		for route := range logQueryRoutes {
			f.Add(uint8(route), q)
		}
	}
	a := newFuzzAPI(f)
	for _, md := range []string{`{"user":"a","n":"1"}`, `{"user":"a","n":"2"}`, `{"user":"b"}`} {
		if w := a.do("POST", "/v2/sandboxes", "", []byte(`{"metadata":`+md+`}`)); w.Code != http.StatusCreated {
			f.Fatalf("create: %d %s", w.Code, w.Body)
		}
	}
	f.Fuzz(func(t *testing.T, route uint8, query string) {
		var w *httptest.ResponseRecorder
		switch route % logQueryRoutes {
		case 0:
			w = a.do("GET", "/v2/sandboxes", query, nil)
		case 1:
			w = a.do("GET", "/snapshots", query, nil)
		case 2:
			w = a.do("GET", "/sandboxes/"+a.sandbox(t)+"/metrics", query, nil)
		case 3:
			b := a.pendingBuild(t)
			w = a.do("GET", "/templates/"+b.TemplateID+"/builds/"+b.BuildID+"/status", query, nil)
		case 4:
			w = a.do("GET", "/sandboxes/"+a.sandbox(t)+"/logs", query, nil)
		case 5:
			w = a.do("GET", "/v2/sandboxes/"+a.sandbox(t)+"/logs", query, nil)
		case 6:
			b := a.pendingBuild(t)
			w = a.do("GET", "/templates/"+b.TemplateID+"/builds/"+b.BuildID+"/logs", query, nil)
		case 7:
			// With a sandbox of its own among those it names.
			w = a.do("GET", "/sandboxes/metrics", query+"&sandbox_ids="+a.sandbox(t)+",x", nil)
		}
		a.check(t, w, query)
		if route%logQueryRoutes != 0 || w.Code != http.StatusOK {
			return
		}
		q, _ := url.ParseQuery(query)
		filter, _ := parseMetadataFilter(q.Get("metadata"))
		page := a.listPage(t, w, filter)
		if limit, err := strconv.Atoi(q.Get("limit")); err == nil && len(page) > limit {
			t.Errorf("%q: %d sandboxes, past the limit %d", query, len(page), limit)
		}
		next := w.Header().Get("X-Next-Token")
		if next == "" {
			return
		}
		q.Set("nextToken", next)
		w = a.do("GET", "/v2/sandboxes", q.Encode(), nil)
		if w.Code != http.StatusOK {
			t.Fatalf("%q: the next page (token %q): %d %s", query, next, w.Code, w.Body)
		}
		for id := range a.listPage(t, w, filter) {
			if page[id] {
				t.Errorf("%q: sandbox %s is on the page and the next", query, id)
			}
		}
	})
}

// listPage decodes a list's page, and fails t unless each sandbox on it
// has the metadata of filter.
func (a *fuzzAPI) listPage(t *testing.T, w *httptest.ResponseRecorder, filter map[string]string) map[string]bool {
	t.Helper()
	var items []listItem
	if err := json.Unmarshal(w.Body.Bytes(), &items); err != nil {
		t.Fatalf("list answered %s: %v", w.Body, err)
	}
	ids := map[string]bool{}
	for _, it := range items {
		for k, v := range filter {
			if it.Metadata[k] != v {
				t.Errorf("sandbox %s with metadata %v passed the filter %v", it.SandboxID, it.Metadata, filter)
			}
		}
		ids[it.SandboxID] = true
	}
	return ids
}

// templateRoutes are the build API's requests; {name} is a name of the
// fuzzer's, {template} and {build} a pending build's template and id.
var templateRoutes = []struct{ method, path string }{
	{"POST", "/v3/templates"},
	{"POST", "/v2/templates/{template}/builds/{build}"},
	{"POST", "/templates/tags"},
	{"DELETE", "/templates/tags"},
	{"GET", "/templates/{name}/files/{name}"},
	{"GET", "/templates/x/files/{name}"},
	{"PUT", "/templates/{name}/files/{name}"},
	{"DELETE", "/templates/{name}"},
	{"GET", "/templates/{name}/tags"},
	{"GET", "/templates/aliases/{name}"},
	{"GET", "/templates/{template}/builds/{name}/status"},
}

// FuzzTemplateRequests: the build API's bodies (a build's request and
// start, with its steps, tags) and the names in its paths never panic
// and are answered with a success or a refusal that is the client's
// fault, in one line that names no host directory; an upload is
// present only under a sha256 (no name reaches a file outside the
// uploads).
func FuzzTemplateRequests(f *testing.F) {
	for _, b := range []string{
		`{"name":"tool","tags":["v1","latest"],"cpuCount":2,"memoryMB":512}`, `{"alias":"tool:v2"}`,
		`{"name":"Tool"}`, `{"name":"../etc"}`, `{"name":"a:b:c"}`, `{"cpuCount":-1,"name":"x"}`, `{"teamID":"t","name":"x"}`,
		`{"fromImage":"docker.io/library/alpine:3","steps":[{"type":"RUN","args":["echo hi","root"]}],"startCmd":"sleep 1","readyCmd":"true"}`,
		`{"fromTemplate":"base","steps":[{"type":"COPY","args":["src","/dst","user","0755"],"filesHash":"` + strings.Repeat("ab", 32) + `"}]}`,
		`{"fromTemplate":"none","steps":[{"type":"ENV","args":["A","1","B"]},{"type":"WORKDIR","args":[""]},{"type":"USER","args":["x\u0000"]}]}`,
		`{"fromImage":"x","fromTemplate":"y"}`, `{"fromImage":"x","fromImageRegistry":{"type":"aws"}}`,
		`{"fromImage":"x","steps":[{"type":"RUN","args":["true"],"mounts":["/"]}]}`, `{"fromImage":"x","steps":[1]}`,
		`{"fromImage":"x","steps":{"type":"RUN"}}`, `{"fromImage":"` + strings.Repeat("a/", 3000) + `"}`,
		`{"target":"tool:v1","tags":["v2"]}`, `{"target":"tool","tags":[]}`, `{"name":"tool","tags":["../../x"]}`,
	} {
		for route := range 4 {
			f.Add(uint8(route), "tool", []byte(b))
		}
	}
	for _, name := range []string{
		"tool", "tool:v1", "..", "../planted", "..%2Fplanted", "%2e%2e", strings.Repeat("ab", 32), "a\x00b", "ключ",
		strings.Repeat("a", 300), "aliases", "tags",
	} {
		for route := 4; route < len(templateRoutes); route++ {
			f.Add(uint8(route), name, []byte(nil))
		}
	}
	a := newFuzzAPI(f)
	f.Fuzz(func(t *testing.T, route uint8, name string, body []byte) {
		rt := templateRoutes[int(route)%len(templateRoutes)]
		b := a.pendingBuild(t)
		target := strings.NewReplacer("{name}", url.PathEscape(name), "{template}", b.TemplateID, "{build}", b.BuildID).Replace(rt.path)
		w := a.do(rt.method, target, "", body)
		a.check(t, w, name+" "+string(body))
		switch {
		case strings.HasSuffix(rt.path, "/builds/{build}") && (w.Code == http.StatusAccepted || w.Code == http.StatusConflict):
			a.build = nil // started: the next start needs another
		case strings.Contains(rt.path, "/files/") && rt.method == "GET" && w.Code == http.StatusCreated:
			var got struct {
				Present bool `json:"present"`
			}
			json.Unmarshal(w.Body.Bytes(), &got)
			if got.Present {
				t.Errorf("an upload is present under %q, which no upload has", name)
			}
		}
	})
}

// FuzzRefuseUnknown: refuseUnknown passes only a JSON object (or null,
// none), and a refusal names a field of it that is not known and
// carries a value, in one line; knowing every field of an object passes
// it.
func FuzzRefuseUnknown(f *testing.F) {
	for _, b := range fuzzBodies {
		f.Add([]byte(b))
	}
	for _, b := range []string{`{"a":1,"a":null}`, `{"a":null,"a":1}`, `{" templateID":1}`, `{"templateID\u0000":1}`} {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		err := refuseUnknown(raw, createFields, "")
		var fields map[string]json.RawMessage
		isObject := json.Unmarshal(raw, &fields) == nil
		if err == nil {
			if !isObject {
				t.Fatalf("%q passed, and is not a JSON object", raw)
			}
			return
		}
		msg := err.Error()
		if strings.ContainsAny(msg, "\r\n") {
			t.Errorf("refusal of %q is more than one line: %q", raw, msg)
		}
		if !isObject {
			return
		}
		field, ok := strings.CutSuffix(msg, " is not supported by this server")
		if !ok {
			t.Fatalf("refusal of the object %q: %q names no field", raw, msg)
		}
		v, present := fields[field]
		if !present || isEmptyJSON(v) || slices.Contains(createFields, field) {
			t.Errorf("refusal of %q names %q, not an unknown field with a value", raw, field)
		}
		if err := refuseUnknown(raw, slices.Collect(maps.Keys(fields)), ""); err != nil {
			t.Errorf("%q with all its fields known: %v", raw, err)
		}
	})
}

// FuzzMetadataFilter: a list's metadata filter (k=v pairs, URL-encoded
// once more by the SDK) never panics, and what it reads is what the SDK
// would have sent: encoded again and read back, the same pairs.
func FuzzMetadataFilter(f *testing.F) {
	for _, q := range []string{
		"", "user=a", "user=a&n=1", url.QueryEscape("a b") + "=" + url.QueryEscape("c&d=e"), "%zz", "a=%zz", "%25zz=1",
		"a=1&a=2", "=", "&&&", ";", "a;b=c", "k%00=v%00", url.QueryEscape("ключ") + "=" + url.QueryEscape("値"), "a=b=c",
	} {
		f.Add(q)
	}
	f.Fuzz(func(t *testing.T, q string) {
		got, err := parseMetadataFilter(q)
		if err != nil || len(got) == 0 {
			return
		}
		again := url.Values{}
		for k, v := range got {
			again.Set(url.QueryEscape(k), url.QueryEscape(v))
		}
		back, err := parseMetadataFilter(again.Encode())
		if err != nil || !maps.Equal(back, got) {
			t.Errorf("%q read as %v; sent again as %q, read as %v (%v)", q, got, again.Encode(), back, err)
		}
	})
}

// FuzzPageToken: any nextToken is read without a panic; the token of a
// sandbox's place lets only the sandboxes after it through, in an order
// that is total: of two sandboxes at different places exactly one comes
// after the other.
func FuzzPageToken(f *testing.F) {
	f.Add("1.a", int64(1), "a", int64(2), "b", true)
	f.Add("garbage", int64(0), "", int64(0), "x", false)
	f.Add("-9223372036854775808.", int64(-1<<63), "", int64(1<<63-1), "zz", true)
	f.Add("9223372036854775808.a", int64(5), "a.b", int64(5), "a", false)
	f.Add(".", int64(5), "ключ", int64(5), "ключ", true)
	f.Fuzz(func(t *testing.T, tok string, ns1 int64, id1 string, ns2 int64, id2 string, desc bool) {
		if after, ok := afterToken(tok, desc); ok {
			after(&sandbox.Sandbox{ID: id1, StartedAt: time.Unix(0, ns1)})
		}
		a := &sandbox.Sandbox{ID: id1, StartedAt: time.Unix(0, ns1)}
		b := &sandbox.Sandbox{ID: id2, StartedAt: time.Unix(0, ns2)}
		afterA, okA := afterToken(pageToken(a), desc)
		afterB, okB := afterToken(pageToken(b), desc)
		if !okA || !okB {
			t.Fatalf("tokens %q, %q of sandboxes were refused", pageToken(a), pageToken(b))
		}
		if afterA(a) {
			t.Errorf("sandbox %q at %d comes after its own token", id1, ns1)
		}
		if same := ns1 == ns2 && id1 == id2; !same && afterA(b) == afterB(a) {
			t.Errorf("%d.%q and %d.%q (desc %v): after each other %v, %v; want exactly one", ns1, id1, ns2, id2, desc, afterA(b), afterB(a))
		}
	})
}

// FuzzPageLimit: a page's size is the query's positive limit, at most
// all; anything else is refused.
func FuzzPageLimit(f *testing.F) {
	for _, l := range []string{"", "1", "0", "-1", "+3", "ten", "99999999999999999999", "1e3", " 2", "0x10"} {
		f.Add(l, uint16(5))
	}
	f.Fuzz(func(t *testing.T, limit string, n uint16) {
		got, err := pageLimit(limit, int(n))
		want, perr := strconv.Atoi(limit)
		switch {
		case limit == "":
			if err != nil || got != int(n) {
				t.Errorf("no limit of %d: got %d, %v", n, got, err)
			}
		case perr != nil || want < 1:
			if err == nil {
				t.Errorf("limit %q of %d: got %d, want a refusal", limit, n, got)
			}
		case err != nil || got != min(want, int(n)):
			t.Errorf("limit %q of %d: got %d, %v, want %d", limit, n, got, err, min(want, int(n)))
		}
	})
}

// FuzzSandboxHost: a Host header is read as {port}-{id}.{domain} only
// when it is one: a port of digits, an id with no dot, and the server's
// domain; and the host the SDK builds of them reads back the same.
func FuzzSandboxHost(f *testing.F) {
	for _, h := range []string{
		"49983-abc.sandbox.test", "8080-abc.sandbox.test:443", "49983-abc.SANDBOX.test", "abc.sandbox.test",
		"-abc.sandbox.test", "80-.sandbox.test", "80-a-b.sandbox.test", "80-a.b.sandbox.test", "x80-a.sandbox.test",
		"80-a.other.test", "[::1]:80", "80-a.sandbox.test.", "", ".", "80-a.", "0000000000000000000080-a.sandbox.test",
	} {
		f.Add(h, "sandbox.test")
	}
	f.Add("80-a.localhost", "localhost:49982")
	f.Add("80-a.localhost:1", "")
	f.Fuzz(func(t *testing.T, host, domain string) {
		s := &Server{domain: domain}
		port, id, ok := s.sandboxHost(host)
		if !ok {
			return
		}
		if port == "" || strings.Trim(port, "0123456789") != "" || id == "" || strings.Contains(id, ".") {
			t.Fatalf("%q (domain %q) read as port %q, id %q", host, domain, port, id)
		}
		if !strings.HasPrefix(strings.ToLower(host), port+"-"+id+".") {
			t.Errorf("%q (domain %q) read as port %q, id %q, which it does not start with", host, domain, port, id)
		}
		built := port + "-" + id + "." + domain
		if p, i, ok := s.sandboxHost(built); !ok || p != port || i != strings.ToLower(id) {
			t.Errorf("%q, built of port %q and id %q, read as %q %q %v", built, port, id, p, i, ok)
		}
	})
}

// FuzzSignedFor: a file URL signed with a sandbox's token (the SDK's
// scheme) opens that sandbox for that operation until it expires, and
// neither another sandbox, the other operation, nor another path; a
// query of the fuzzer's own never opens it.
func FuzzSignedFor(f *testing.F) {
	soon := time.Now().Add(time.Hour).Unix()
	f.Add("/home/user/f", "", "token", int64(0), false, "/etc/shadow", "signature=v1_x&path=/")
	f.Add("/home/user/f", "root", "token", soon, true, "/home/user/f/../f", "signature=v1_&signature_expiration=1")
	f.Add("a:read:b", "c", "t", int64(-1), false, "a", "signature=v1_%00&path=%00")
	f.Add("../../x", "user\x00", "", int64(1<<63-1), true, "../../x ", "signature=v2_x")
	f.Add("ключ", "😀", "t", int64(1), false, "", "%gg")
	opens := func(r *http.Request, sb *sandbox.Sandbox) bool { return signedFor(r, sb) == nil }
	f.Fuzz(func(t *testing.T, path, user, token string, exp int64, write bool, other, rawQuery string) {
		sb := &sandbox.Sandbox{AccessToken: token}
		method, op := http.MethodGet, "read"
		if write {
			method, op = http.MethodPost, "write"
		}
		req := func(method string, q string) *http.Request {
			r := httptest.NewRequest(method, "/files", nil)
			r.URL.RawQuery = q
			return r
		}
		q := sign(path, op, user, token, exp)
		now := time.Now().Unix()
		switch {
		case token == "":
			// No sandbox has no token: anyone could sign for it.
			if opens(req(method, q.Encode()), sb) {
				t.Errorf("a signature without a token opens a sandbox without one")
			}
		case len(path) > maxSignedPath || len(user) > maxSignedUser:
			if opens(req(method, q.Encode()), sb) {
				t.Errorf("a path of %d bytes or a user of %d is signed", len(path), len(user))
			}
		case exp == 0 || exp > now+5:
			if !opens(req(method, q.Encode()), sb) {
				t.Errorf("a signature of %q %s %q (expiring %d) does not open its sandbox", path, op, user, exp)
			}
		}
		if exp != 0 && exp < now-5 {
			no := signedFor(req(method, q.Encode()), sb)
			switch {
			case no == nil:
				t.Errorf("a signature of %q expired at %d opens its sandbox", path, exp)
			case token != "" && len(path) <= maxSignedPath && len(user) <= maxSignedUser && no.msg != errExpiredSignature:
				t.Errorf("a signature of %q expired at %d is refused with %q, want envd's %q", path, exp, no.msg, errExpiredSignature)
			}
		}
		if opens(req(method, q.Encode()), &sandbox.Sandbox{AccessToken: token + "x"}) {
			t.Errorf("a signature of the token %q opens another sandbox's", token)
		}
		otherMethod := map[bool]string{true: http.MethodGet, false: http.MethodPost}[write]
		if opens(req(otherMethod, q.Encode()), sb) {
			t.Errorf("a %s signature of %q opens it for %s", op, path, otherMethod)
		}
		if other != path {
			q.Set("path", other)
			if opens(req(method, q.Encode()), sb) {
				t.Errorf("a signature of %q opens %q", path, other)
			}
		}
		if opens(req(method, rawQuery), &sandbox.Sandbox{AccessToken: "the sandbox's token"}) {
			t.Errorf("the fuzzer's query %q opens a sandbox", rawQuery)
		}
	})
}
