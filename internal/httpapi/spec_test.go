package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/image"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// testdata/e2b-openapi.json is E2B's API spec: spec/openapi.yml of
// e2b-dev/E2B at b8029973aa7da5f741f7bb1a9f833b38a0885438 (Apache-2.0,
// as Airlock), converted to JSON and cut to what this test reads (its
// paths, components.responses and components.schemas). E2B's SDKs are
// generated from it: the Python SDK's models pop each required key, so a
// response that lacks one fails in the client (KeyError).

// spec is E2B's OpenAPI document, as much of it as the test reads.
type spec struct {
	Paths      map[string]map[string]json.RawMessage `json:"paths"`
	Components struct {
		Responses map[string]json.RawMessage `json:"responses"`
		Schemas   map[string]json.RawMessage `json:"schemas"`
	} `json:"components"`
}

// schema is an OpenAPI schema object, the parts a response is checked by.
type schema struct {
	Ref                  string             `json:"$ref"`
	Type                 string             `json:"type"`
	Nullable             bool               `json:"nullable"`
	Required             []string           `json:"required"`
	Properties           map[string]*schema `json:"properties"`
	AdditionalProperties json.RawMessage    `json:"additionalProperties"`
	Items                *schema            `json:"items"`
	AllOf                []*schema          `json:"allOf"`
	OneOf                []*schema          `json:"oneOf"`
	AnyOf                []*schema          `json:"anyOf"`
	Enum                 []any              `json:"enum"`
	Format               string             `json:"format"`
}

// response is an OpenAPI response object (or a $ref to one).
type response struct {
	Ref     string `json:"$ref"`
	Content map[string]struct {
		Schema *schema `json:"schema"`
	} `json:"content"`
}

func loadSpec(t *testing.T) *spec {
	t.Helper()
	data, err := os.ReadFile("testdata/e2b-openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var s spec
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatalf("e2b-openapi.json: %v", err)
	}
	return &s
}

// match is the spec's operation for a request, "GET
// /sandboxes/{sandboxID}" for GET /sandboxes/abc (the path with the most
// literal segments when several fit, as a router picks), and its
// responses; "" when the spec has none.
func (s *spec) match(method, path string) (string, map[string]json.RawMessage) {
	segs := strings.Split(path, "/")
	best, literal := "", -1
	for p, ops := range s.Paths {
		if _, ok := ops[strings.ToLower(method)]; !ok {
			continue
		}
		tmpl := strings.Split(p, "/")
		if len(tmpl) != len(segs) {
			continue
		}
		n := 0
		for i, t := range tmpl {
			switch {
			case strings.HasPrefix(t, "{"):
			case t == segs[i]:
				n++
			default:
				n = -1
			}
			if n < 0 {
				break
			}
		}
		if n > literal {
			best, literal = p, n
		}
	}
	if best == "" {
		return "", nil
	}
	var op struct {
		Responses map[string]json.RawMessage `json:"responses"`
	}
	if json.Unmarshal(s.Paths[best][strings.ToLower(method)], &op) != nil {
		return "", nil
	}
	return method + " " + best, op.Responses
}

// ops are the spec's operations ("GET /sandboxes/{sandboxID}").
func (s *spec) ops() []string {
	var all []string
	for p, ops := range s.Paths {
		for m := range ops {
			if m := strings.ToUpper(m); slices.Contains([]string{"GET", "POST", "PUT", "PATCH", "DELETE"}, m) {
				all = append(all, m+" "+p)
			}
		}
	}
	sort.Strings(all)
	return all
}

// params are a path's parameters.
var params = regexp.MustCompile(`\{[^}]*\}`)

// servedBy is the pattern of the API's route that serves the spec's
// operation op, as the API's own mux picks it; "" for none.
func servedBy(a *api, op string) string {
	method, path, _ := strings.Cut(op, " ")
	r := httptest.NewRequest(method, params.ReplaceAllString(path, "x"), nil)
	_, pattern := a.s.mux.Handler(r)
	if !slices.Contains(a.s.Routes(), pattern) {
		return ""
	}
	return pattern
}

// resolve follows a schema's $ref.
func (s *spec) resolve(sc *schema) *schema {
	for sc != nil && sc.Ref != "" {
		name, ok := strings.CutPrefix(sc.Ref, "#/components/schemas/")
		raw := s.Components.Schemas[name]
		if !ok || raw == nil {
			return &schema{} // an unknown $ref checks nothing
		}
		var next schema
		if json.Unmarshal(raw, &next) != nil {
			return &schema{}
		}
		sc = &next
	}
	return sc
}

// responseSchema is the schema of a JSON body the spec gives for status
// ("default" when it names none); nil when it gives no body. An error
// status the operation does not list is checked as E2B's Error, which
// the SDKs read from every refusal.
func (s *spec) responseSchema(responses map[string]json.RawMessage, status int) (*schema, bool) {
	raw, ok := responses[strconv.Itoa(status)]
	if !ok {
		raw, ok = responses["default"]
	}
	if !ok {
		if status >= 400 {
			return &schema{Ref: "#/components/schemas/Error"}, true
		}
		return nil, false
	}
	var r response
	if json.Unmarshal(raw, &r) != nil {
		return nil, true
	}
	if name, ok := strings.CutPrefix(r.Ref, "#/components/responses/"); ok {
		r = response{}
		if json.Unmarshal(s.Components.Responses[name], &r) != nil {
			return nil, true
		}
	}
	for ct, c := range r.Content {
		if strings.Contains(ct, "json") {
			return c.Schema, true
		}
	}
	return nil, true
}

// check appends to errs where v breaks sc: a required field missing, a
// null where none may be, a value of another type or outside an enum, a
// time that is not one.
func (s *spec) check(v any, sc *schema, at string, errs *[]string) {
	if sc == nil {
		return
	}
	if sc.Ref != "" && v == nil && sc.Nullable {
		return
	}
	sc = s.resolve(sc)
	if v == nil {
		if !sc.Nullable {
			*errs = append(*errs, at+": null, which the spec does not allow")
		}
		return
	}
	for _, sub := range sc.AllOf {
		s.check(v, sub, at, errs)
	}
	if alts := append(slices.Clone(sc.OneOf), sc.AnyOf...); len(alts) > 0 {
		var first []string
		for i, alt := range alts {
			var e []string
			s.check(v, alt, at, &e)
			if len(e) == 0 {
				first = nil
				break
			}
			if i == 0 {
				first = e
			}
		}
		*errs = append(*errs, first...)
	}
	bad := func(want string) { *errs = append(*errs, fmt.Sprintf("%s: %s, want %s", at, short(v), want)) }
	typ := sc.Type
	switch {
	case typ != "":
	case sc.Properties != nil || sc.Required != nil:
		typ = "object" // the spec often leaves it implied
	case sc.Items != nil:
		typ = "array"
	}
	switch typ {
	case "object":
		m, ok := v.(map[string]any)
		if !ok {
			bad("an object")
			return
		}
		for _, k := range sc.Required {
			if _, ok := m[k]; !ok {
				*errs = append(*errs, fmt.Sprintf("%s: no %q, which the spec requires", at, k))
			}
		}
		for k, pv := range m {
			if p, ok := sc.Properties[k]; ok {
				s.check(pv, p, at+"."+k, errs)
				continue
			}
			var extra schema
			if len(sc.AdditionalProperties) > 0 && json.Unmarshal(sc.AdditionalProperties, &extra) == nil {
				s.check(pv, &extra, at+"."+k, errs)
			}
		}
	case "array":
		a, ok := v.([]any)
		if !ok {
			bad("an array")
			return
		}
		for i, item := range a {
			s.check(item, sc.Items, fmt.Sprintf("%s[%d]", at, i), errs)
		}
	case "string":
		str, ok := v.(string)
		if !ok {
			bad("a string")
			break
		}
		// The SDKs parse times (Python's isoparse, JavaScript's Date).
		if _, err := time.Parse(time.RFC3339Nano, str); sc.Format == "date-time" && err != nil {
			bad("an RFC 3339 time")
		}
	case "integer":
		if n, ok := v.(float64); !ok || n != math.Trunc(n) {
			bad("an integer")
		}
	case "number":
		if _, ok := v.(float64); !ok {
			bad("a number")
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			bad("a boolean")
		}
	}
	if len(sc.Enum) > 0 && !slices.Contains(sc.Enum, v) {
		bad(fmt.Sprintf("one of %v", sc.Enum))
	}
}

func short(v any) string {
	b, _ := json.Marshal(v)
	if len(b) > 80 {
		return string(b[:80]) + "…"
	}
	return string(b)
}

// exchange is one response the API gave, with the route that gave it.
type exchange struct {
	route        string // the API's pattern
	method, path string
	status       int
	body         []byte
}

// recorder keeps every response of the API's routes.
type recorder struct {
	h   http.Handler
	mu  sync.Mutex
	got []exchange
}

type capture struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (c *capture) WriteHeader(code int) {
	if c.status == 0 {
		c.status = code
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *capture) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	c.body.Write(p)
	return c.ResponseWriter.Write(p)
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := &capture{ResponseWriter: w}
	rec.h.ServeHTTP(c, r)
	if r.Pattern == "" {
		return // not one of the API's routes (the gateway's traffic)
	}
	if c.status == 0 {
		c.status = http.StatusOK
	}
	rec.mu.Lock()
	rec.got = append(rec.got, exchange{r.Pattern, r.Method, r.URL.Path, c.status, c.body.Bytes()})
	rec.mu.Unlock()
}

// notE2B are Airlock's routes that serve none of E2B's operations: its
// own, and twins of E2B's routes that the spec leaves out.
var notE2B = map[string]string{
	"GET /metrics":                     "Prometheus's",
	"GET /airlock/pools":               "Airlock's own",
	"PUT /airlock/pools/{template}":    "Airlock's own",
	"DELETE /airlock/pools/{template}": "Airlock's own",
	"POST /v2/sandboxes":               "a twin of POST /sandboxes; the spec has only GET",
	"POST /v2/sandboxes/{id}/connect":  "a twin of POST /sandboxes/{id}/connect, not in the spec",
	"PUT /templates/{id}/files/{hash}": "the upload URL the files route answers, not in the spec",
}

// TestE2BRequiredFields: every response of every route of Airlock's API
// that serves an operation of E2B's API carries every field E2B's spec
// marks as required, of the spec's types, nulls only where it allows
// them; refusals too (as E2B's Error). Each operation the API serves is
// called until it succeeds at least once, so a new route without a call
// in exercise fails, as does a route that is neither E2B's nor listed in
// notE2B.
func TestE2BRequiredFields(t *testing.T) {
	sp := loadSpec(t)
	a := specAPI(t)
	rec := &recorder{h: a.s}
	srv := httptest.NewServer(rec)
	t.Cleanup(srv.Close)
	a.url = srv.URL

	// What the API serves of E2B's spec, and by which route.
	served := map[string]bool{} // the spec's operations
	routes := map[string]bool{} // the API's routes that serve one
	for _, op := range sp.ops() {
		if route := servedBy(a, op); route != "" {
			served[op], routes[route] = true, true
		}
	}
	for _, route := range a.s.Routes() {
		_, own := notE2B[route]
		switch {
		case own && routes[route]:
			t.Errorf("%s is listed as not E2B's, but serves an operation of E2B's spec", route)
		case !own && !routes[route]:
			t.Errorf("%s serves no operation of E2B's spec and is not listed in notE2B", route)
		}
	}

	exercise(t, a)

	ok := map[string]bool{}
	for _, ex := range rec.got {
		if _, own := notE2B[ex.route]; own {
			continue
		}
		op, responses := sp.match(ex.method, ex.path)
		if op == "" {
			t.Errorf("%s %s (%s) answered %d, but E2B's spec has no such operation", ex.method, ex.path, ex.route, ex.status)
			continue
		}
		if ex.status < 300 {
			ok[op] = true
		}
		sc, documented := sp.responseSchema(responses, ex.status)
		if !documented {
			t.Errorf("%s answered %d, a status E2B's spec does not give it", op, ex.status)
			continue
		}
		if sc == nil {
			continue
		}
		var v any
		if err := json.Unmarshal(ex.body, &v); err != nil {
			t.Errorf("%s answered %d with %q, not JSON", op, ex.status, ex.body)
			continue
		}
		var errs []string
		sp.check(v, sc, "body", &errs)
		for _, e := range errs {
			t.Errorf("%s (%d): %s", op, ex.status, e)
		}
	}
	for _, op := range sp.ops() {
		if served[op] && !ok[op] {
			t.Errorf("%s: served by %s, but no successful response was checked (call it in exercise)", op, servedBy(a, op))
		}
	}
}

// specAPI is an API with the build API over an image store holding a
// built template, and a state directory (pause, snapshots, fork).
func specAPI(t *testing.T) *api {
	t.Helper()
	return withStoreConfig(t, sandbox.Config{StateDir: t.TempDir(), Network: &fakeNetwork{}},
		&image.Image{Name: "app", Created: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), BuildKey: "k1"})
}

// exercise calls every route of E2B's API that Airlock serves, each at
// least once with a request it accepts, and some with one it refuses.
func exercise(t *testing.T, a *api) {
	t.Helper()
	must := func(method, path string, body any, want int) []byte {
		t.Helper()
		code, data := a.call(method, path, body)
		if code != want {
			t.Errorf("%s %s: %d %s, want %d", method, path, code, data, want)
		}
		return data
	}
	var sb created
	if err := json.Unmarshal(must("POST", "/sandboxes", map[string]any{"templateID": "base", "metadata": map[string]string{"k": "v"}, "network": map[string]any{"allowOut": []string{}}}, 201), &sb); err != nil {
		t.Fatal(err)
	}
	id := "/sandboxes/" + sb.SandboxID
	must("GET", "/sandboxes", nil, 200)
	must("GET", "/v2/sandboxes", nil, 200)
	must("GET", "/v2/sandboxes?state=running,paused", nil, 200)
	must("GET", id, nil, 200)
	must("GET", id+"/metrics", nil, 200)
	must("GET", "/sandboxes/metrics?sandbox_ids="+sb.SandboxID+",nope", nil, 200)
	must("GET", id+"/logs", nil, 200)
	must("GET", "/v2"+id+"/logs", nil, 200)
	must("POST", id+"/timeout", map[string]any{"timeout": 600}, 204)
	must("PUT", id+"/network", map[string]any{"allowOut": []string{}}, 204)
	must("POST", id+"/connect", map[string]any{"timeout": 600}, 200)
	must("DELETE", id, nil, 204)
	// Snapshots and forks are of sandboxes without a network (for now).
	if err := json.Unmarshal(must("POST", "/v2/sandboxes", map[string]any{"allowInternetAccess": false}, 201), &sb); err != nil {
		t.Fatal(err)
	}
	id = "/sandboxes/" + sb.SandboxID
	must("POST", id+"/snapshots", map[string]any{"name": "snap"}, 201)
	must("GET", "/snapshots", nil, 200)
	must("POST", id+"/fork", nil, 201)
	must("POST", id+"/pause", nil, 204)
	must("GET", "/v2/sandboxes?state=paused", nil, 200)
	must("POST", id+"/resume", map[string]any{"timeout": 600}, 201)
	must("POST", id+"/pause", nil, 204)
	must("POST", id+"/connect", map[string]any{"timeout": 600}, 201)

	must("GET", "/templates", nil, 200)
	must("GET", "/v2/templates", nil, 200)
	must("PATCH", "/templates/app", map[string]any{"public": false}, 200)
	must("PATCH", "/v2/templates/app", map[string]any{"public": false}, 200)
	must("POST", "/templates/tags", map[string]any{"target": "app:default", "tags": []string{"v2"}}, 201)
	must("DELETE", "/templates/tags", map[string]any{"name": "app", "tags": []string{"v2"}}, 204)
	must("GET", "/templates/app/tags", nil, 200)
	must("GET", "/templates/aliases/app", nil, 200)
	var b struct{ TemplateID, BuildID string }
	if err := json.Unmarshal(must("POST", "/v3/templates", map[string]any{"name": "built"}, 202), &b); err != nil {
		t.Fatal(err)
	}
	must("GET", "/templates/"+b.TemplateID+"/files/"+strings.Repeat("ab", 32), nil, 201)
	must("POST", "/v2/templates/"+b.TemplateID+"/builds/"+b.BuildID, map[string]any{"fromImage": "registry.test/app:1"}, 202)
	must("GET", "/templates/"+b.TemplateID+"/builds/"+b.BuildID+"/status", nil, 200)
	must("GET", "/templates/"+b.TemplateID+"/builds/"+b.BuildID+"/logs", nil, 200)
	must("DELETE", "/templates/app", nil, 204)

	// Refusals: E2B's Error, whichever route refuses.
	must("GET", "/sandboxes/nope", nil, 404)
	must("GET", "/sandboxes/nope/metrics", nil, 404)
	must("GET", "/sandboxes/metrics", nil, 400)
	must("GET", "/templates/aliases/nope", nil, 404)
	must("POST", "/sandboxes", map[string]any{"templateID": "nope"}, 400)
	must("GET", "/templates/nope/builds/nope/status", nil, 404)
	must("PATCH", "/v2/templates/nope", map[string]any{"public": true}, 404)
	if code, _, _ := a.do("GET", "/sandboxes", nil, nil); code != http.StatusUnauthorized {
		t.Errorf("no key: %d", code)
	}
}
