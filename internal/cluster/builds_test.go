package cluster

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// buildNode is a node's build API as the router uses it: upload links
// signed with a token of its own, uploads, and the log of build local.
func buildNode(t *testing.T, name string) *fakeNode {
	return newFakeNode(t, name, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == "GET" && strings.Contains(r.URL.Path, "/files/"):
			writeJSON(w, http.StatusCreated, map[string]any{"present": name == "node-a", "url": "http://elsewhere.test" + r.URL.Path + "?token=tok-" + name})
		case r.Method == "PUT":
			if r.URL.Query().Get("token") != "tok-"+name {
				writeError(w, http.StatusForbidden, "bad token")
				return
			}
			w.WriteHeader(http.StatusOK)
		case r.URL.Path == "/templates/hello/builds/local-"+name+"/status":
			writeJSON(w, http.StatusOK, map[string]any{"status": "building", "logs": []string{"step 1 on " + name}, "logEntries": []any{map[string]any{"message": "step 1 on " + name}}})
		case r.URL.Path == "/templates":
			writeJSON(w, http.StatusOK, []any{map[string]any{"templateID": "base", "node": name}, map[string]any{"templateID": name}})
		default:
			writeError(w, http.StatusNotFound, "no such route on the fake")
		}
	})
}

// reportBuild sets node's status.templates as a node publishes it, and
// waits until the router has seen it.
func reportBuild(t *testing.T, c *fakeDynamic, rt *testRouter, nodeName string, builds ...TemplateStatus) {
	t.Helper()
	res := c.Resource(nodesResource).Namespace("airlock")
	u, err := res.Get(t.Context(), nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var list []any
	for _, b := range builds {
		list = append(list, map[string]any{"name": b.Name, "phase": b.Phase, "message": b.Message, "buildID": b.BuildID, "localBuildID": b.LocalBuildID})
	}
	unstructured.SetNestedSlice(u.Object, list, "status", "templates")
	if _, err := res.Update(t.Context(), u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		// Seen once the router's view has these reports (a node that
		// reported before has as many already).
		for _, n := range rt.nodes.live() {
			if n.Name == nodeName && len(n.Templates) == len(builds) && sameBuilds(n.Templates, builds) {
				return
			}
		}
		if i > 500 {
			t.Fatalf("the router did not see %s's builds", nodeName)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func sameBuilds(got map[string]TemplateStatus, want []TemplateStatus) bool {
	for _, w := range want {
		if g, ok := got[w.Name]; !ok || g.Phase != w.Phase || g.BuildID != w.BuildID {
			return false
		}
	}
	return true
}

// TestRouterBuilds: a build through the router is an AirlockTemplate,
// its status the nodes' reports, its log one node's; a COPY's files go
// to every node; tags and deletes are objects too.
func TestRouterBuilds(t *testing.T) {
	a, b := buildNode(t, "node-a"), buildNode(t, "node-b")
	now := time.Now()
	client := fakeClient(append(registered("node-a", a.srv.URL, 0, nil, now), registered("node-b", b.srv.URL, 0, nil, now)...)...)
	rt := newTestRouter(t, client)
	objects := client.Resource(templatesResource).Namespace("airlock")
	jsonOf := func(s string) map[string]any {
		var m map[string]any
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			t.Fatalf("%v: %s", err, s)
		}
		return m
	}

	// Refused, naming what is wrong, and nothing written.
	for _, tc := range []struct{ path, body, want string }{
		{"/v3/templates", `{"name":"Bad Name"}`, "template name"},
		{"/v3/templates", `{"name":"hello","tags":["a","b"]}`, "one tag of a template at a time"},
		{"/v3/templates", `{"name":"hello","volumes":[]}`, `field \"volumes\" is not supported`},
		{"/v3/templates", `{"name":"hello","memoryMB":-1}`, "must not be negative"},
	} {
		if code, _, body := rt.do(t, "POST", tc.path, routerKey, tc.body, nil); code != http.StatusBadRequest || !strings.Contains(body, tc.want) {
			t.Errorf("POST %s %s: %d %s, want 400 with %q", tc.path, tc.body, code, body, tc.want)
		}
	}

	code, _, body := rt.do(t, "POST", "/v3/templates", routerKey, `{"name":"hello","cpuCount":2,"memoryMB":1024}`, nil)
	if code != http.StatusAccepted {
		t.Fatalf("request a build: %d %s", code, body)
	}
	made := jsonOf(body)
	buildID, _ := made["buildID"].(string)
	if made["templateID"] != "hello" || buildID == "" {
		t.Fatalf("request a build: %s", body)
	}
	start := "/v2/templates/hello/builds/" + buildID
	hash := strings.Repeat("ab", 32)
	for _, tc := range []struct{ path, body, want string }{
		{start, `{"fromImage":"img","fromImageRegistry":{"type":"registry","password":"p"}}`, "registry credentials"},
		{start, `{"fromImage":"img","fromTemplate":"base"}`, "exactly one of fromImage and fromTemplate"},
		{start, `{"fromImage":"img","steps":[{"type":"RUN","shell":"x"}]}`, `steps[0].shell`},
	} {
		if code, _, body := rt.do(t, "POST", tc.path, routerKey, tc.body, nil); code != http.StatusBadRequest || !strings.Contains(body, tc.want) {
			t.Errorf("POST %s %s: %d %s, want 400 with %q", tc.path, tc.body, code, body, tc.want)
		}
	}
	if code, _, _ := rt.do(t, "POST", "/v2/templates/hello/builds/not-a-build", routerKey, `{"fromImage":"img"}`, nil); code != http.StatusNotFound {
		t.Errorf("a build id that the router never made: %d", code)
	}
	if list, _ := objects.List(t.Context(), metav1.ListOptions{}); len(list.Items) != 0 {
		t.Fatalf("refused builds wrote %d AirlockTemplates", len(list.Items))
	}

	// Started: the AirlockTemplate that every node builds.
	code, _, body = rt.do(t, "POST", start, routerKey, fmt.Sprintf(`{"fromImage":"img","steps":[{"type":"COPY","args":["a","/b"],"filesHash":%q,"forceUpload":true},{"type":"RUN","args":["make"]}],"startCmd":"serve"}`, hash), nil)
	if code != http.StatusAccepted {
		t.Fatalf("start the build: %d %s", code, body)
	}
	obj, err := objects.Get(t.Context(), objectName("hello"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := json.Marshal(obj.Object["spec"])
	want := fmt.Sprintf(`{"buildID":%q,"cpuCount":2,"fromImage":"img","memoryMB":1024,"name":"hello","startCmd":"serve","steps":[{"args":["a","/b"],"filesHash":%q,"type":"COPY"},{"args":["make"],"type":"RUN"}]}`, buildID, hash)
	if string(spec) != want {
		t.Errorf("the AirlockTemplate's spec:\n got %s\nwant %s", spec, want)
	}

	status := func(id string) map[string]any {
		t.Helper()
		code, _, body := rt.do(t, "GET", "/templates/hello/builds/"+id+"/status?logsOffset=0", routerKey, "", nil)
		if code != http.StatusOK {
			t.Fatalf("status: %d %s", code, body)
		}
		return jsonOf(body)
	}
	if st := status(buildID); st["status"] != "waiting" {
		t.Errorf("before any node took the build up: %v", st)
	}
	reportBuild(t, client, rt, "node-b", TemplateStatus{Name: "hello", Phase: "building", BuildID: buildID, LocalBuildID: "local-node-b"})
	reportBuild(t, client, rt, "node-a", TemplateStatus{Name: "hello", Phase: "ready", BuildID: buildID, LocalBuildID: "local-node-a"},
		TemplateStatus{Name: "other", Phase: "error", Message: "not ours"})
	if st := status(buildID); st["status"] != "building" || fmt.Sprint(st["logs"]) != "[step 1 on node-a]" {
		t.Errorf("one node ready, one building: %v", st)
	}
	reportBuild(t, client, rt, "node-b", TemplateStatus{Name: "hello", Phase: "ready", BuildID: buildID, LocalBuildID: "local-node-b"})
	if st := status(buildID); st["status"] != "ready" || st["reason"] != nil {
		t.Errorf("ready on every node: %v", st)
	}

	// A second build of the template takes its place; the first says so.
	_, _, body = rt.do(t, "POST", "/v3/templates", routerKey, `{"name":"hello"}`, nil)
	second, _ := jsonOf(body)["buildID"].(string)
	if code, _, body := rt.do(t, "POST", "/v2/templates/hello/builds/"+second, routerKey, `{"fromTemplate":"base"}`, nil); code != http.StatusAccepted {
		t.Fatalf("a second build: %d %s", code, body)
	}
	if list, _ := objects.List(t.Context(), metav1.ListOptions{}); len(list.Items) != 1 {
		t.Errorf("a second build made a second AirlockTemplate: %d", len(list.Items))
	}
	if st := status(buildID); st["status"] != "error" || !strings.Contains(fmt.Sprint(st["reason"]), "a newer build") {
		t.Errorf("the replaced build: %v", st)
	}
	reportBuild(t, client, rt, "node-b", TemplateStatus{Name: "hello", Phase: "error", Message: "RUN failed", BuildID: second})
	if st := status(second); st["status"] != "error" || !strings.Contains(fmt.Sprint(st["reason"]), "node node-b: RUN failed") {
		t.Errorf("a node's build failed: %v", st)
	}

	// A COPY's files: present only if every node has them; the router's
	// signed URL puts them on each node, through each node's own.
	code, _, body = rt.do(t, "GET", "/templates/hello/files/"+hash, routerKey, "", nil)
	link := jsonOf(body)
	if code != http.StatusCreated || link["present"] != false {
		t.Fatalf("files link: %d %s", code, body)
	}
	u, err := url.Parse(link["url"].(string))
	if err != nil || !strings.HasPrefix(u.Path, "/templates/hello/files/") {
		t.Fatalf("files link: %s", body)
	}
	if code, _, body := rt.do(t, "PUT", u.Path+"?"+u.RawQuery+"x", "", "tar", nil); code != http.StatusForbidden {
		t.Errorf("a forged upload: %d %s", code, body)
	}
	if code, _, body := rt.do(t, "PUT", u.Path+"?"+u.RawQuery, "", "tar bytes", nil); code != http.StatusOK {
		t.Fatalf("upload: %d %s", code, body)
	}
	// node-a says it has them: only node-b gets them.
	if seen := b.requests(); seen[len(seen)-1].method != "PUT" || seen[len(seen)-1].uri != "/templates/hello/files/"+hash+"?token=tok-node-b" || seen[len(seen)-1].body != "tar bytes" {
		t.Errorf("node-b got %+v", seen[len(seen)-1])
	}
	for _, r := range a.requests() {
		if r.method == "PUT" {
			t.Errorf("node-a, which has the files, got them again: %+v", r)
		}
	}

	// The list: every node's templates, once each.
	if _, _, body := rt.do(t, "GET", "/v2/templates?limit=2", routerKey, "", nil); !strings.Contains(body, `"templateID":"base"`) || !strings.Contains(body, `"templateID":"node-a"`) || strings.Contains(body, "node-b") {
		t.Errorf("template list: %s", body)
	}

	// Tags: an AirlockTemplate each; deletes remove the objects.
	if code, _, body := rt.do(t, "POST", "/templates/tags", routerKey, `{"target":"hello","tags":["v2"]}`, nil); code != http.StatusCreated {
		t.Fatalf("assign a tag: %d %s", code, body)
	}
	tagged, err := objects.Get(t.Context(), objectName("hello:v2"), metav1.GetOptions{})
	if err != nil || fmt.Sprint(tagged.Object["spec"]) != "map[fromTemplate:hello name:hello:v2]" {
		t.Fatalf("the tag's AirlockTemplate: %v %v", err, tagged)
	}
	for _, tc := range []struct{ method, body, want string }{
		{"POST", `{"target":"hello","tags":[]}`, "give the tags to assign"},
		{"POST", `{"target":"hello","tags":["Bad Tag"]}`, "Bad Tag\\\": use up to 64"},
		{"DELETE", `{"name":"hello"}`, "give the tags to remove"},
	} {
		if code, _, body := rt.do(t, tc.method, "/templates/tags", routerKey, tc.body, nil); code != http.StatusBadRequest || !strings.Contains(body, tc.want) {
			t.Errorf("%s /templates/tags %s: %d %s", tc.method, tc.body, code, body)
		}
	}
	if code, _, _ := rt.do(t, "POST", "/templates/tags", routerKey, `{"target":"nothing","tags":["v2"]}`, nil); code != http.StatusNotFound {
		t.Errorf("tag a template the cluster does not build: %d", code)
	}
	if code, _, _ := rt.do(t, "POST", "/templates/tags", routerKey, `{"target":"hello","tags":["default","v3"]}`, nil); code != http.StatusCreated {
		t.Errorf("assign the target's own tag and another: %d", code)
	}
	if got, _ := objects.Get(t.Context(), objectName("hello"), metav1.GetOptions{}); got.Object["spec"].(map[string]any)["fromTemplate"] != "base" {
		t.Errorf("assigning a template its own tag rewrote it: %v", got.Object["spec"])
	}
	if code, _, _ := rt.do(t, "DELETE", "/templates/tags", routerKey, `{"name":"hello","tags":["v2"]}`, nil); code != http.StatusNoContent {
		t.Errorf("remove a tag: %d", code)
	}
	if code, _, _ := rt.do(t, "DELETE", "/templates/hello:v3", routerKey, "", nil); code != http.StatusNoContent {
		t.Errorf("delete one tag: %d", code)
	}
	if _, err := objects.Get(t.Context(), objectName("hello"), metav1.GetOptions{}); err != nil {
		t.Errorf("deleting a tag deleted the template's other: %v", err)
	}

	// What an operator declared, the API does not change.
	declared := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": Group + "/" + Version, "kind": "AirlockTemplate",
		"metadata": map[string]any{"name": "ops-tools", "namespace": "airlock"},
		"spec":     map[string]any{"name": "ops", "fromImage": "img"},
	}}
	if _, err := objects.Create(t.Context(), declared, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, _, body = rt.do(t, "POST", "/v3/templates", routerKey, `{"name":"ops"}`, nil)
	opsBuild, _ := jsonOf(body)["buildID"].(string)
	if code, _, body := rt.do(t, "POST", "/v2/templates/ops/builds/"+opsBuild, routerKey, `{"fromTemplate":"base"}`, nil); code != http.StatusConflict || !strings.Contains(body, `declared by AirlockTemplate \"ops-tools\"`) {
		t.Errorf("a build over a declared template: %d %s", code, body)
	}
	if code, _, _ := rt.do(t, "DELETE", "/templates/ops", routerKey, "", nil); code != http.StatusConflict {
		t.Errorf("a delete of a declared template: %d", code)
	}
	if err := objects.Delete(t.Context(), "ops-tools", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := rt.do(t, "DELETE", "/templates/hello", routerKey, "", nil); code != http.StatusNoContent {
		t.Errorf("delete: %d", code)
	}
	if list, _ := objects.List(t.Context(), metav1.ListOptions{}); len(list.Items) != 0 {
		t.Errorf("%d AirlockTemplates outlived their deletes", len(list.Items))
	}
	if code, _, _ := rt.do(t, "DELETE", "/templates/hello", routerKey, "", nil); code != http.StatusNotFound {
		t.Errorf("delete again: %d", code)
	}
}
