package cluster

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Template builds through a router: E2B's build API over AirlockTemplates.
// A build the SDK starts here becomes the spec of the AirlockTemplate that
// makes its template (the one that made it before, or a new one). Every
// node builds it as it builds any AirlockTemplate, a node that joins later
// too, and reports in its AirlockNode; the router reads those reports for
// the build's status and passes on one node's log. The router keeps
// nothing: a build's id carries what its request asked for until the
// build starts, and the uploads of COPY steps go on to every live node.

// buildTicket is what a build's id carries from its request (POST
// /v3/templates) to its start: all of it the client's own, so a forged
// one asks for nothing the client could not ask for.
type buildTicket struct {
	Nonce    string  `json:"n"`
	Tag      string  `json:"t"`
	CPUs     float64 `json:"c,omitempty"`
	MemoryMB int64   `json:"m,omitempty"`
	DiskMB   int64   `json:"d,omitempty"`
	At       int64   `json:"s"` // when it was requested, Unix ms
}

func (t buildTicket) id() string {
	b, _ := json.Marshal(t)
	return base64.RawURLEncoding.EncodeToString(b)
}

func parseTicket(id string) (buildTicket, bool) {
	var t buildTicket
	b, err := base64.RawURLEncoding.DecodeString(id)
	if err != nil || json.Unmarshal(b, &t) != nil || t.Nonce == "" || !validTag.MatchString(t.Tag) {
		return buildTicket{}, false
	}
	return t, true
}

// Template names as the nodes' build API takes them: an id, and tags.
var (
	validID  = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,127}$`)
	validTag = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)
)

// storeName is what the AirlockTemplate of id's tag is called in
// spec.name (E2B's "id:default" is "id").
func storeName(id, tag string) string {
	if tag == "default" {
		return id
	}
	return id + ":" + tag
}

// validTemplateID reports whether id is a template's id, without a tag.
func validTemplateID(id string) bool { return validID.MatchString(id) && !strings.Contains(id, "..") }

// validHash reports whether h is a sha256 in hex, as a COPY's files hash.
func validHash(h string) bool { return len(h) == 64 && strings.Trim(h, "0123456789abcdef") == "" }

// parseName splits "id[:tag]" and checks both; tag is "default" if none.
func parseName(name string) (id, tag string, err error) {
	id, tag, hasTag := strings.Cut(name, ":")
	if !hasTag {
		tag = "default"
	}
	if !validTemplateID(id) {
		return "", "", fmt.Errorf("template name %q: use lower-case letters, digits and . _ - (and :tag)", name)
	}
	if !validTag.MatchString(tag) {
		return "", "", fmt.Errorf("tag %q: use up to 64 lower-case letters, digits and . _ -", tag)
	}
	return id, tag, nil
}

// madeBy labels the AirlockTemplates a router wrote: the only ones it
// changes or deletes. Those an operator declared are theirs: a build or a
// delete through the API that would touch one is refused.
const madeBy = Group + "/made-by"

func routerMade(u *unstructured.Unstructured) bool { return u.GetLabels()[madeBy] == "router" }

// errDeclared: a build or delete through the router would change an
// AirlockTemplate that an operator declared.
type errDeclared struct{ object, template string }

func (e errDeclared) Error() string {
	return fmt.Sprintf("template %s is declared by AirlockTemplate %q, which the API does not change: edit or delete that object", e.template, e.object)
}

// objectName is the name of a new AirlockTemplate for template name: its
// letters and digits, readable in kubectl, and a hash that keeps two
// names that read alike apart.
func objectName(name string) string {
	clean := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, name)
	sum := sha256.Sum256([]byte(name))
	return fmt.Sprintf("%.50s-%x", clean, sum[:4])
}

// templateRoutes serves the build API at the router; the upload of a
// COPY's files (PUT, signed) is served before the API key is asked for.
func (rt *Router) templateRoutes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v3/templates", rt.requestBuild)
	mux.HandleFunc("POST /v2/templates/{id}/builds/{buildID}", rt.startBuild)
	mux.HandleFunc("GET /templates/{id}/builds/{buildID}/status", rt.buildStatus)
	mux.HandleFunc("GET /templates/{id}/builds/{buildID}/logs", rt.buildLogs)
	mux.HandleFunc("GET /templates/{id}/files/{hash}", rt.filesLink)
	mux.HandleFunc("GET /templates", rt.listTemplates)
	mux.HandleFunc("GET /v2/templates", rt.listTemplates)
	mux.HandleFunc("GET /templates/{a}/{b}", rt.anyNode) // aliases/{alias}, {id}/tags
	mux.HandleFunc("PATCH /templates/{id}", rt.everyNode)
	mux.HandleFunc("PATCH /v2/templates/{id}", rt.everyNode)
	mux.HandleFunc("POST /templates/tags", rt.assignTags)
	mux.HandleFunc("DELETE /templates/tags", rt.removeTags)
	mux.HandleFunc("DELETE /templates/{id}", rt.deleteTemplate)
	return mux
}

// readJSON reads a request's body into v, refusing fields not in known.
func readJSON(w http.ResponseWriter, r *http.Request, v any, known ...string) bool {
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, "request body over %d bytes", maxBody)
		return false
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		writeError(w, http.StatusBadRequest, "invalid JSON body: %v", err)
		return false
	}
	for k := range fields {
		if !slices.Contains(known, k) {
			writeError(w, http.StatusBadRequest, "field %q is not supported", k)
			return false
		}
	}
	if err := json.Unmarshal(raw, v); err != nil {
		writeError(w, http.StatusBadRequest, "invalid JSON body: %v", err)
		return false
	}
	return true
}

// requestBuild is E2B's POST /v3/templates: a build id for the template,
// one tag at a time (E2B builds once for many; each AirlockTemplate makes
// one name).
func (rt *Router) requestBuild(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Name          string   `json:"name"`
		Alias         string   `json:"alias"`
		Tags          []string `json:"tags"`
		CPUCount      float64  `json:"cpuCount"`
		MemoryMB      int64    `json:"memoryMB"`
		MinFreeDiskMB int64    `json:"minFreeDiskMb"`
		TeamID        string   `json:"teamID"`
	}
	if !readJSON(w, r, &body, "name", "alias", "tags", "cpuCount", "memoryMB", "minFreeDiskMb", "teamID") {
		return
	}
	if body.Name == "" {
		body.Name = body.Alias
	}
	id, tag, err := parseName(body.Name)
	tags := body.Tags
	if strings.Contains(body.Name, ":") {
		tags = append(tags, tag)
	}
	switch tags = slices.Compact(slices.Sorted(slices.Values(tags))); {
	case err != nil:
	case len(tags) > 1:
		err = fmt.Errorf("tags %v: a cluster builds one tag of a template at a time; build one, then assign the others with POST /templates/tags", tags)
	case len(tags) == 1:
		_, tag, err = parseName(id + ":" + tags[0])
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	if body.CPUCount < 0 || body.MemoryMB < 0 || body.MinFreeDiskMB < 0 {
		writeError(w, http.StatusBadRequest, "cpuCount, memoryMB and minFreeDiskMb must not be negative")
		return
	}
	t := buildTicket{Nonce: rand.Text(), Tag: tag, CPUs: body.CPUCount, MemoryMB: body.MemoryMB, DiskMB: body.MinFreeDiskMB, At: time.Now().UnixMilli()}
	writeJSON(w, http.StatusAccepted, map[string]any{
		"templateID": id, "buildID": t.id(), "tags": []string{tag},
		"names": []string{id}, "aliases": []string{id}, "public": false,
	})
}

// startBuild is E2B's POST /v2/templates/{id}/builds/{buildID}: the build
// written as the spec of its AirlockTemplate.
func (rt *Router) startBuild(w http.ResponseWriter, r *http.Request) {
	id, buildID := r.PathValue("id"), r.PathValue("buildID")
	t, ok := parseTicket(buildID)
	if !ok || !validTemplateID(id) {
		writeError(w, http.StatusNotFound, "build %q of template %q not found", buildID, id)
		return
	}
	var body struct {
		FromImage         string            `json:"fromImage"`
		FromTemplate      string            `json:"fromTemplate"`
		FromImageRegistry json.RawMessage   `json:"fromImageRegistry"`
		Steps             []json.RawMessage `json:"steps"`
		StartCmd          string            `json:"startCmd"`
		ReadyCmd          string            `json:"readyCmd"`
		Force             bool              `json:"force"`
	}
	if !readJSON(w, r, &body, "fromImage", "fromTemplate", "fromImageRegistry", "steps", "startCmd", "readyCmd", "force") {
		return
	}
	if len(body.FromImageRegistry) > 0 && string(body.FromImageRegistry) != "null" {
		// The spec is readable by whoever may read AirlockTemplates: no
		// place for a password.
		writeError(w, http.StatusBadRequest, "fromImageRegistry: a cluster does not take registry credentials in a build (they would be stored in an AirlockTemplate); give the nodes the registry's credentials in $DOCKER_CONFIG")
		return
	}
	if (body.FromImage == "") == (body.FromTemplate == "") {
		writeError(w, http.StatusBadRequest, "give exactly one of fromImage and fromTemplate")
		return
	}
	name := storeName(id, t.Tag)
	spec := map[string]any{"name": name, "buildID": buildID}
	set := func(k string, v any, ok bool) {
		if ok {
			spec[k] = v
		}
	}
	set("fromImage", body.FromImage, body.FromImage != "")
	set("fromTemplate", body.FromTemplate, body.FromTemplate != "")
	set("startCmd", body.StartCmd, body.StartCmd != "")
	set("readyCmd", body.ReadyCmd, body.ReadyCmd != "")
	set("force", true, body.Force)
	set("cpuCount", t.CPUs, t.CPUs > 0)
	set("memoryMB", t.MemoryMB, t.MemoryMB > 0)
	set("minFreeDiskMb", t.DiskMB, t.DiskMB > 0)
	steps := []any{}
	for i, raw := range body.Steps {
		var st struct {
			Type            string   `json:"type"`
			Args            []string `json:"args"`
			FilesHash       string   `json:"filesHash"`
			Force           bool     `json:"force"`
			ForceUpload     any      `json:"forceUpload"`
			ResolveSymlinks any      `json:"resolveSymlinks"`
			Gzip            any      `json:"gzip"`
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(raw, &fields); err != nil {
			writeError(w, http.StatusBadRequest, "steps[%d]: not an object", i)
			return
		}
		for k := range fields {
			// forceUpload, resolveSymlinks and gzip are the SDK's options
			// of the upload, sent along; the upload is done.
			if !slices.Contains([]string{"type", "args", "filesHash", "force", "forceUpload", "resolveSymlinks", "gzip"}, k) {
				writeError(w, http.StatusBadRequest, "field \"steps[%d].%s\" is not supported", i, k)
				return
			}
		}
		if err := json.Unmarshal(raw, &st); err != nil {
			writeError(w, http.StatusBadRequest, "steps[%d]: %v", i, err)
			return
		}
		step := map[string]any{"type": st.Type}
		if len(st.Args) > 0 {
			args := make([]any, len(st.Args))
			for j, a := range st.Args {
				args[j] = a
			}
			step["args"] = args
		}
		if st.FilesHash != "" {
			step["filesHash"] = st.FilesHash
		}
		if st.Force {
			step["force"] = true
		}
		steps = append(steps, step)
	}
	if len(steps) > 0 {
		spec["steps"] = steps
	}
	if err := rt.writeSpec(r.Context(), name, spec); err != nil {
		rt.apiError(w, err)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

// writeSpec makes spec the spec of the AirlockTemplate that makes
// template name: the one every node builds it from now, if there is one
// (another's update between our read and write is read again), else a
// new one.
func (rt *Router) writeSpec(ctx context.Context, name string, spec map[string]any) error {
	for try := 0; ; try++ {
		u, err := rt.objectOf(ctx, name)
		if err != nil {
			return err
		}
		switch {
		case u != nil && !routerMade(u):
			return errDeclared{u.GetName(), name}
		case u != nil:
			u.Object["spec"] = spec
			_, err = rt.templates.Update(ctx, u, metav1.UpdateOptions{})
		default:
			u = &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": Group + "/" + Version, "kind": "AirlockTemplate",
				"metadata": map[string]any{"name": objectName(name), "labels": map[string]any{madeBy: "router"}},
				"spec":     spec,
			}}
			_, err = rt.templates.Create(ctx, u, metav1.CreateOptions{})
		}
		if (apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err)) && try < 3 {
			continue
		}
		return err
	}
}

// objectOf is the AirlockTemplate that every node builds template name
// from, or nil.
func (rt *Router) objectOf(ctx context.Context, name string) (*unstructured.Unstructured, error) {
	all, err := rt.allObjects(ctx)
	if err != nil {
		return nil, err
	}
	chosen, _ := chooseTemplates(all)
	return chosen[name], nil
}

func (rt *Router) allObjects(ctx context.Context) ([]any, error) {
	list, err := rt.templates.List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	all := make([]any, len(list.Items))
	for i := range list.Items {
		all[i] = &list.Items[i]
	}
	return all, nil
}

// apiError answers a failed call to the API server: a refusal of what
// the client gave is its 400; anything else is the router's trouble,
// logged and not passed on.
func (rt *Router) apiError(w http.ResponseWriter, err error) {
	var declared errDeclared
	if errors.As(err, &declared) {
		writeError(w, http.StatusConflict, "%v", err)
		return
	}
	if apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	rt.log.Warn("router: AirlockTemplates", "err", err)
	writeError(w, http.StatusBadGateway, "the cluster's API server did not take the template: see the router's log")
}

// buildState is where the build of template name with buildID stands,
// as the live nodes report it: "waiting" until a node has taken it up,
// "error" as soon as one failed, "ready" once every live node built it.
// node is the live node whose log of the build the router shows (the
// first by name that has one), if any.
func (rt *Router) buildState(ctx context.Context, name, buildID string, t buildTicket) (status, reason string, logs *node, err error) {
	u, err := rt.objectOf(ctx, name)
	if err != nil {
		return "", "", nil, err
	}
	var cur string
	if u != nil {
		cur, _, _ = unstructured.NestedString(u.Object, "spec", "buildID")
	}
	if cur != buildID {
		if other, ok := parseTicket(cur); ok && other.At > t.At {
			return "error", fmt.Sprintf("a newer build of template %s replaced this one", name), nil, nil
		}
		if time.Since(time.UnixMilli(t.At)) > time.Hour {
			// Never started, or its template deleted since.
			return "error", fmt.Sprintf("the build of template %s was not started within an hour, or its template was deleted", name), nil, nil
		}
		return "waiting", "", nil, nil
	}
	nodes := rt.nodes.live()
	status = "waiting"
	ready := 0
	for i, n := range nodes {
		b, ok := n.Templates[name]
		if !ok || b.BuildID != buildID {
			continue
		}
		if logs == nil && b.LocalBuildID != "" {
			logs = &nodes[i]
		}
		switch b.Phase {
		case "error":
			if reason == "" {
				reason = fmt.Sprintf("node %s: %s", n.Name, b.Message)
			}
		case "ready":
			ready++
		}
		if status == "waiting" {
			status = "building"
		}
	}
	switch {
	case reason != "":
		status = "error"
	case ready > 0 && ready == len(nodes):
		status = "ready"
	}
	return status, reason, logs, nil
}

// buildStatus is E2B's build status: the nodes' state, and the log of
// one node's build (they run the same steps).
func (rt *Router) buildStatus(w http.ResponseWriter, r *http.Request) {
	id, buildID := r.PathValue("id"), r.PathValue("buildID")
	t, ok := parseTicket(buildID)
	if !ok {
		writeError(w, http.StatusNotFound, "build %q of template %q not found", buildID, id)
		return
	}
	status, reason, from, err := rt.buildState(r.Context(), storeName(id, t.Tag), buildID, t)
	if err != nil {
		rt.apiError(w, err)
		return
	}
	out := map[string]any{"templateID": id, "buildID": buildID, "status": status, "logEntries": []any{}, "logs": []string{}}
	if from != nil {
		var got map[string]json.RawMessage
		local := from.Templates[storeName(id, t.Tag)].LocalBuildID
		if data, err := rt.ask(r.Context(), *from, "/templates/"+url.PathEscape(id)+"/builds/"+url.PathEscape(local)+"/status?"+r.URL.RawQuery); err == nil && json.Unmarshal(data, &got) == nil {
			for _, k := range []string{"logEntries", "logs"} {
				if v, ok := got[k]; ok {
					out[k] = v
				}
			}
		}
	}
	if reason != "" {
		out["reason"] = map[string]any{"message": reason}
	}
	writeJSON(w, http.StatusOK, out)
}

// buildLogs is E2B's build logs: one node's, as they are.
func (rt *Router) buildLogs(w http.ResponseWriter, r *http.Request) {
	id, buildID := r.PathValue("id"), r.PathValue("buildID")
	t, ok := parseTicket(buildID)
	if !ok {
		writeError(w, http.StatusNotFound, "build %q of template %q not found", buildID, id)
		return
	}
	_, _, from, err := rt.buildState(r.Context(), storeName(id, t.Tag), buildID, t)
	if err != nil {
		rt.apiError(w, err)
		return
	}
	if from == nil {
		writeJSON(w, http.StatusOK, map[string]any{"logs": []any{}})
		return
	}
	local := from.Templates[storeName(id, t.Tag)].LocalBuildID
	data, err := rt.ask(r.Context(), *from, "/templates/"+url.PathEscape(id)+"/builds/"+url.PathEscape(local)+"/logs?"+r.URL.RawQuery)
	if err != nil {
		writeError(w, http.StatusBadGateway, "node %s did not give the build's log", from.Name)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(data)
}

// ask GETs path of node n with the router's key.
func (rt *Router) ask(ctx context.Context, n node, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(n.Address, "/")+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-API-KEY", rt.key)
	resp, err := rt.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err == nil && resp.StatusCode/100 != 2 {
		err = fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(data)))
	}
	return data, err
}

// filesLink says whether every live node has a COPY's files, and where
// to put them: the router's own URL, signed for an hour, which passes
// the upload on to each node.
func (rt *Router) filesLink(w http.ResponseWriter, r *http.Request) {
	id, hash := r.PathValue("id"), r.PathValue("hash")
	if !validHash(hash) {
		writeError(w, http.StatusBadRequest, "files hash %q is not a sha256", hash)
		return
	}
	if !validTemplateID(id) {
		writeError(w, http.StatusBadRequest, "template %q: use lower-case letters, digits and . _ -", id)
		return
	}
	answers, ok := rt.fanOutOK(w, r)
	if !ok {
		return
	}
	present := len(answers) > 0
	for _, a := range answers {
		var got struct {
			Present bool `json:"present"`
		}
		present = present && json.Unmarshal(a.body, &got) == nil && got.Present
	}
	expires := strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	q := url.Values{"expires": {expires}, "token": {rt.uploadToken(id, hash, expires)}}
	u := fmt.Sprintf("%s://%s/templates/%s/files/%s?%s", scheme, r.Host, url.PathEscape(id), hash, q.Encode())
	writeJSON(w, http.StatusCreated, map[string]any{"present": present, "url": u})
}

// uploadToken signs the upload of files hash for template id until
// expires, with the key that every router of the cluster holds.
func (rt *Router) uploadToken(id, hash, expires string) string {
	m := hmac.New(sha256.New, []byte(rt.key))
	fmt.Fprintf(m, "airlock template files\x00%s\x00%s\x00%s", id, hash, expires)
	return hex.EncodeToString(m.Sum(nil))
}

// maxTemplateFiles bounds one COPY's upload through a router, as a
// node's default does (build.upload); templateUploads bounds those held at
// once (their own: a signed envd upload, which anyone may start, cannot
// take their places), and uploadRate is the slowest a client or node may
// send one at, for the deadlines.
const (
	maxTemplateFiles = 1 << 30
	templateUploads  = 2
	uploadRate       = 1 << 20 // bytes a second
)

// uploadDeadline is how long a transfer of size bytes may take.
func uploadDeadline(size int64) time.Duration {
	return time.Minute + time.Duration(size/uploadRate)*time.Second
}

// uploadFiles takes a COPY's files at the URL filesLink signed and puts
// them on every live node that lacks them, each through its own signed
// URL, all at once. The body is kept in a file that is gone once the
// router closes it: one read, many sends.
func (rt *Router) uploadFiles(w http.ResponseWriter, r *http.Request, id, hash string) {
	q := r.URL.Query()
	expires := q.Get("expires")
	n, err := strconv.ParseInt(expires, 10, 64)
	if err != nil || time.Now().Unix() > n || !validTemplateID(id) || !validHash(hash) ||
		!hmac.Equal([]byte(q.Get("token")), []byte(rt.uploadToken(id, hash, expires))) {
		writeError(w, http.StatusForbidden, "the upload URL is not valid, or has expired: ask for another")
		return
	}
	select {
	case rt.templateUploads <- struct{}{}:
		defer func() { <-rt.templateUploads }()
	case <-r.Context().Done():
		return
	}
	// A client that sends slower than uploadRate is cut off: it holds a
	// place of only a few.
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(uploadDeadline(max(r.ContentLength, maxTemplateFiles))))
	spool, err := os.CreateTemp("", "airlock-router-upload-")
	if err != nil {
		rt.log.Error("router: upload", "err", err)
		writeError(w, http.StatusInternalServerError, "internal error: the upload could not be kept")
		return
	}
	os.Remove(spool.Name()) // the open file is all the router needs
	defer spool.Close()
	size, err := io.Copy(spool, http.MaxBytesReader(w, r.Body, maxTemplateFiles))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, "the upload is too large: at most %d bytes", maxTemplateFiles)
		return
	case err != nil:
		rt.log.Warn("router: upload", "err", err)
		writeError(w, http.StatusBadRequest, "the upload could not be read whole")
		return
	}
	nodes := rt.nodes.live()
	if len(nodes) == 0 {
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "no live Airlock node to take the files")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), uploadDeadline(size))
	defer cancel()
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, nd := range nodes {
		wg.Go(func() { errs[i] = rt.putFiles(ctx, nd, id, hash, io.NewSectionReader(spool, 0, size), size) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			// Its reason stays in the log: it may name the node's
			// addresses, and a signed URL.
			rt.log.Warn("router: upload", "node", nodes[i].Name, "err", err)
			writeError(w, http.StatusBadGateway, "node %s did not take the files: see the router's log", nodes[i].Name)
			return
		}
	}
	w.WriteHeader(http.StatusOK)
}

// putFiles puts a COPY's files on node n, at the URL n signs for them,
// unless n has them already (a node keeps the first upload of a hash).
func (rt *Router) putFiles(ctx context.Context, n node, id, hash string, body io.Reader, size int64) error {
	data, err := rt.ask(ctx, n, "/templates/"+url.PathEscape(id)+"/files/"+hash)
	if err != nil {
		return err
	}
	var link struct {
		Present bool   `json:"present"`
		URL     string `json:"url"`
	}
	if err := json.Unmarshal(data, &link); err != nil || link.URL == "" {
		return fmt.Errorf("no upload URL")
	}
	if link.Present {
		return nil
	}
	// The node signed the URL with the address the router asked it at;
	// only its query is taken, so the router sends to no other host.
	signed, err := url.Parse(link.URL)
	if err != nil {
		return fmt.Errorf("no upload URL")
	}
	target := strings.TrimSuffix(n.Address, "/") + "/templates/" + url.PathEscape(id) + "/files/" + hash + "?" + signed.RawQuery
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, target, body)
	if err != nil {
		return err
	}
	req.ContentLength = size
	// Not rt.client: its timeout is a request's, not a gigabyte's.
	resp, err := uploadClient.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // without the URL, which is signed
		}
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		var e struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(msg, &e) == nil && e.Message != "" {
			return fmt.Errorf("%s: %s", resp.Status, e.Message)
		}
		return fmt.Errorf("%s", resp.Status)
	}
	return nil
}

// uploadClient sends COPY uploads to nodes: bounded by the request's
// context (uploadDeadline), not by a client timeout.
var uploadClient = &http.Client{Transport: &http.Transport{
	DialContext:     (&net.Dialer{Timeout: 3 * time.Second}).DialContext,
	IdleConnTimeout: 90 * time.Second,
}}

// listTemplates merges the nodes' lists (GET /templates, and /v2's pages
// over the merged list): every template some node can start, once.
func (rt *Router) listTemplates(w http.ResponseWriter, r *http.Request) {
	if v := r.URL.Query().Get("teamID"); v != "" {
		writeError(w, http.StatusBadRequest, "this server has one team, whose templates are listed without a teamID: drop teamID %q", v)
		return
	}
	all := r.Clone(r.Context())
	all.URL.Path, all.URL.RawQuery = "/templates", ""
	answers, ok := rt.fanOutOK(w, all)
	if !ok {
		return
	}
	type item struct {
		id  string
		raw json.RawMessage
	}
	var items []item
	seen := map[string]bool{}
	for _, a := range answers {
		var page []json.RawMessage
		json.Unmarshal(a.body, &page)
		for _, raw := range page {
			var t struct {
				TemplateID string `json:"templateID"`
			}
			if json.Unmarshal(raw, &t) == nil && !seen[t.TemplateID] {
				seen[t.TemplateID] = true
				items = append(items, item{t.TemplateID, raw})
			}
		}
	}
	slices.SortFunc(items, func(a, b item) int { return strings.Compare(a.id, b.id) })
	if r.URL.Path == "/v2/templates" {
		q := r.URL.Query()
		if tok := q.Get("nextToken"); tok != "" {
			last, err := hex.DecodeString(tok)
			i := slices.IndexFunc(items, func(it item) bool { return it.id > string(last) })
			if err != nil {
				writeError(w, http.StatusBadRequest, "invalid nextToken: pass on the X-Next-Token of the previous page")
				return
			}
			if i < 0 {
				i = len(items)
			}
			items = items[i:]
		}
		limit := min(len(items), 100)
		if v := q.Get("limit"); v != "" {
			l, err := strconv.Atoi(v)
			if err != nil || l < 1 || l > 100 {
				writeError(w, http.StatusBadRequest, "limit must be a number from 1 to 100, not %q", v)
				return
			}
			limit = min(l, len(items))
		}
		if limit < len(items) {
			w.Header().Set("X-Next-Token", hex.EncodeToString([]byte(items[limit-1].id)))
		}
		items = items[:limit]
	}
	out := make([]json.RawMessage, len(items))
	for i, it := range items {
		out[i] = it.raw
	}
	writeJSON(w, http.StatusOK, out)
}

// anyNode answers what one node can (does a template exist, its tags):
// the first node's success, else the first answer.
func (rt *Router) anyNode(w http.ResponseWriter, r *http.Request) {
	answers := rt.fanOut(r)
	if len(answers) == 0 {
		writeError(w, http.StatusServiceUnavailable, "no live Airlock node answered")
		return
	}
	slices.SortStableFunc(answers, func(a, b answer) int { return min(a.status/100, 3) - min(b.status/100, 3) })
	relay(w, answers[0])
}

// everyNode passes a change to every node (publishing): each checks it
// alike, so one's refusal is every one's.
func (rt *Router) everyNode(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, "request body over %d bytes", maxBody)
		return
	}
	var first *answer
	for _, n := range rt.nodes.live() {
		resp, err := rt.send(r.Context(), n, r, body)
		if err != nil {
			writeError(w, http.StatusBadGateway, "node %s did not answer", n.Name)
			return
		}
		data, _ := io.ReadAll(io.LimitReader(resp.Body, maxBody))
		resp.Body.Close()
		a := answer{node: n, status: resp.StatusCode, header: resp.Header, body: data}
		if a.status/100 != 2 {
			relay(w, a)
			return
		}
		if first == nil {
			first = &a
		}
	}
	if first == nil {
		writeError(w, http.StatusServiceUnavailable, "no live Airlock node answered")
		return
	}
	relay(w, *first)
}

// assignTags is E2B's POST /templates/tags: each new tag an
// AirlockTemplate made from the tagged one, which each node builds at
// once (no steps).
func (rt *Router) assignTags(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Target string   `json:"target"`
		Tags   []string `json:"tags"`
	}
	if !readJSON(w, r, &body, "target", "tags") {
		return
	}
	id, from, tags, err := parseTags(body.Target, body.Tags, "assign")
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	target, err := rt.objectOf(r.Context(), storeName(id, from))
	if err != nil {
		rt.apiError(w, err)
		return
	}
	if target == nil {
		writeError(w, http.StatusNotFound, "template %s has no tag %s that the cluster builds", id, from)
		return
	}
	buildID, _, _ := unstructured.NestedString(target.Object, "spec", "buildID")
	for _, tag := range slices.Compact(slices.Sorted(slices.Values(tags))) {
		if tag == from {
			continue // the target's own: it has it
		}
		spec := map[string]any{"name": storeName(id, tag), "fromTemplate": storeName(id, from)}
		if err := rt.writeSpec(r.Context(), storeName(id, tag), spec); err != nil {
			rt.apiError(w, err)
			return
		}
	}
	writeJSON(w, http.StatusCreated, map[string]any{"buildID": buildID, "tags": tags})
}

// parseTags reads a tag request's name and tags (to verb them): the
// template's id, the tag its name gives ("default" if none), and each
// tag, checked.
func parseTags(name string, tags []string, verb string) (id, tag string, checked []string, err error) {
	if id, tag, err = parseName(name); err != nil {
		return "", "", nil, err
	}
	if len(tags) == 0 {
		return "", "", nil, fmt.Errorf("give the tags to %s", verb)
	}
	for _, t := range tags {
		if _, t, err = parseName(id + ":" + t); err != nil {
			return "", "", nil, err
		}
		checked = append(checked, t)
	}
	return id, tag, checked, nil
}

// removeTags is E2B's DELETE /templates/tags: the AirlockTemplates of
// those tags are deleted, and every node removes what it built of them.
func (rt *Router) removeTags(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Name string   `json:"name"`
		Tags []string `json:"tags"`
	}
	if !readJSON(w, r, &body, "name", "tags") {
		return
	}
	id, _, tags, err := parseTags(body.Name, body.Tags, "remove")
	var names []string
	for _, tag := range tags {
		names = append(names, storeName(id, tag))
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	rt.deleteObjects(w, r, func(name string) bool { return slices.Contains(names, name) }, "template %s has none of the tags %v that the cluster builds", id, body.Tags)
}

// deleteTemplate is E2B's DELETE /templates/{id}: every tag of it.
func (rt *Router) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	id, tag, tagged := strings.Cut(r.PathValue("id"), ":")
	rt.deleteObjects(w, r, func(name string) bool {
		if tagged { // that tag alone
			return name == storeName(id, tag)
		}
		got, _, _ := strings.Cut(name, ":")
		return got == id
	}, "template %q not found: no AirlockTemplate makes it", r.PathValue("id"))
}

// deleteObjects deletes the AirlockTemplates whose template name match
// picks, and answers 404 with notFound if there are none.
func (rt *Router) deleteObjects(w http.ResponseWriter, r *http.Request, match func(string) bool, notFound string, args ...any) {
	all, err := rt.allObjects(r.Context())
	if err != nil {
		rt.apiError(w, err)
		return
	}
	var mine []*unstructured.Unstructured
	for _, obj := range all {
		u := obj.(*unstructured.Unstructured)
		if !match(templateName(u)) {
			continue
		}
		if !routerMade(u) {
			rt.apiError(w, errDeclared{u.GetName(), templateName(u)})
			return
		}
		mine = append(mine, u)
	}
	deleted := 0
	for _, u := range mine {
		err := rt.templates.Delete(r.Context(), u.GetName(), metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			rt.apiError(w, err)
			return
		}
		deleted++
	}
	if deleted == 0 {
		writeError(w, http.StatusNotFound, notFound, args...)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// filesPath splits /templates/{id}/files/{hash}.
func filesPath(path string) (id, hash string) {
	parts := strings.Split(path, "/")
	return parts[2], parts[4]
}

func isFilesPath(path string) bool {
	parts := strings.Split(path, "/")
	return len(parts) == 5 && parts[0] == "" && parts[1] == "templates" && parts[2] != "" && parts[3] == "files" && parts[4] != ""
}
