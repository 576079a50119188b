package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

// TemplateStatus is a node's build of one AirlockTemplate.
type TemplateStatus struct {
	Name       string `json:"name"`
	Generation int64  `json:"generation"`
	Phase      string `json:"phase"` // building, ready or error
	Message    string `json:"message,omitempty"`
	// BuildID is the object's spec.buildID: the E2B build, made through
	// a router, that this is a build of. LocalBuildID is the node's own
	// build of it, whose log the router passes on.
	BuildID      string `json:"buildID,omitempty"`
	LocalBuildID string `json:"localBuildID,omitempty"`
}

// maxStatusMessage bounds a status message, as the CRD does.
const maxStatusMessage = 4096

// templates are the node's builds of AirlockTemplates, by template name.
type templates struct {
	mu     sync.Mutex
	builds map[string]*templateBuild

	// Run's own: the NameConflict condition each AirlockTemplate was
	// last logged with (by uid), and when a failed write of one may be
	// tried again.
	logged     map[types.UID]string
	retryAfter map[types.UID]time.Time
}

func newTemplates() templates {
	return templates{builds: map[string]*templateBuild{}, logged: map[types.UID]string{}, retryAfter: map[types.UID]time.Time{}}
}

type templateBuild struct {
	key    string // the object's uid and generation: a new one is built anew
	status TemplateStatus
	cancel context.CancelFunc
}

// statuses lists the builds, by name.
func (ts *templates) statuses() []TemplateStatus {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	out := []TemplateStatus{}
	for _, b := range ts.builds {
		out = append(out, b.status)
	}
	slices.SortFunc(out, func(a, b TemplateStatus) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// templateName is the template that AirlockTemplate u makes: its
// spec.name, else its object name, as the build API stores it (E2B's
// "name:default" is "name").
func templateName(u *unstructured.Unstructured) string {
	name, _, _ := unstructured.NestedString(u.Object, "spec", "name")
	if name == "" {
		name = u.GetName()
	}
	return strings.TrimSuffix(name, ":default")
}

// nameConflict is an AirlockTemplate that is not built: an older one
// makes a template of the same name.
type nameConflict struct {
	loser, winner *unstructured.Unstructured
	name          string
}

// chooseTemplates picks the AirlockTemplate that each template name is
// built from. Where several make one name, every node must pick the same
// one, whatever order its informer lists them in, and keep it while they
// all exist: the oldest, then by namespace and name, then uid. Picking
// by order instead made each node cancel and restart the build every
// second, each object's generation undoing the other's.
func chooseTemplates(objs []any) (map[string]*unstructured.Unstructured, []nameConflict) {
	byName := map[string][]*unstructured.Unstructured{}
	for _, obj := range objs {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			byName[templateName(u)] = append(byName[templateName(u)], u)
		}
	}
	chosen := map[string]*unstructured.Unstructured{}
	var losers []nameConflict
	for name, us := range byName {
		slices.SortFunc(us, func(a, b *unstructured.Unstructured) int {
			if c := a.GetCreationTimestamp().Compare(b.GetCreationTimestamp().Time); c != 0 {
				return c
			}
			if c := strings.Compare(a.GetNamespace()+"/"+a.GetName(), b.GetNamespace()+"/"+b.GetName()); c != 0 {
				return c
			}
			return strings.Compare(string(a.GetUID()), string(b.GetUID()))
		})
		chosen[name] = us[0]
		for _, u := range us[1:] {
			losers = append(losers, nameConflict{loser: u, winner: us[0], name: name})
		}
	}
	return chosen, losers
}

// applyTemplates builds, through the node's own build API, each
// template that an AirlockTemplate in store makes and that the node has
// not built at that object's current generation; removes from the node
// the templates it built for objects that are gone; and says in the
// status of each AirlockTemplate that is not built why not.
func (n *Node) applyTemplates(ctx context.Context, store cache.Store) {
	ts := &n.templates
	chosen, losers := chooseTemplates(store.List())
	for _, name := range slices.Sorted(maps.Keys(chosen)) {
		u := chosen[name]
		spec, _, _ := unstructured.NestedMap(u.Object, "spec")
		key := string(u.GetUID()) + "/" + strconv.FormatInt(u.GetGeneration(), 10)
		ts.mu.Lock()
		old := ts.builds[name]
		if old != nil && old.key == key {
			ts.mu.Unlock()
			continue
		}
		if old != nil {
			old.cancel()
		}
		bctx, cancel := context.WithCancel(ctx)
		buildID, _ := spec["buildID"].(string)
		b := &templateBuild{key: key, cancel: cancel,
			status: TemplateStatus{Name: name, Generation: u.GetGeneration(), Phase: "building", BuildID: buildID}}
		ts.builds[name] = b
		ts.mu.Unlock()
		n.cfg.Log.Info("cluster: building template from AirlockTemplate", "template", name, "object", u.GetName(), "generation", u.GetGeneration())
		go func() {
			err := n.cfg.Local.build(bctx, name, spec, func(local string) {
				ts.mu.Lock()
				defer ts.mu.Unlock()
				if ts.builds[name] == b {
					b.status.LocalBuildID = local
				}
			})
			ts.mu.Lock()
			defer ts.mu.Unlock()
			if ts.builds[name] != b {
				return // replaced by a newer generation, or removed
			}
			if err != nil {
				msg := err.Error()
				if len(msg) > maxStatusMessage {
					msg = msg[:maxStatusMessage-3] + "..."
				}
				b.status.Phase, b.status.Message = "error", msg
				n.cfg.Log.Warn("cluster: template build", "template", name, "err", err)
				return
			}
			b.status.Phase = "ready"
		}()
	}
	ts.mu.Lock()
	var gone []string
	for name, b := range ts.builds {
		if chosen[name] == nil {
			b.cancel()
			delete(ts.builds, name)
			gone = append(gone, name)
		}
	}
	ts.mu.Unlock()
	for _, name := range gone {
		if err := n.cfg.Local.removeTemplate(ctx, name); err != nil {
			n.cfg.Log.Warn("cluster: remove template", "template", name, "err", err)
			continue
		}
		n.cfg.Log.Info("cluster: removed template of a deleted AirlockTemplate", "template", name)
	}
	n.reportConflicts(ctx, store.List(), losers)
}

// conflictCondition is the condition an AirlockTemplate that is not
// built carries in its status: the same on every node, so that their
// writes agree and an unchanged one is not written again.
func conflictCondition(c nameConflict) map[string]any {
	return map[string]any{
		"type": "NameConflict", "status": "True", "reason": "OlderTemplateHasName",
		"message": fmt.Sprintf("not built: AirlockTemplate %q, which is older, makes template %q too; rename or delete one of them",
			c.winner.GetName(), c.name),
		"observedGeneration": c.loser.GetGeneration(),
	}
}

// reportConflicts writes the NameConflict condition into the status of
// each AirlockTemplate that is not built, and takes it out of those that
// are built again. Every node writes the same; a write is made only
// where the object says otherwise, and one that failed waits 30 s.
func (n *Node) reportConflicts(ctx context.Context, objs []any, losers []nameConflict) {
	ts := &n.templates
	want := map[types.UID]map[string]any{}
	for _, c := range losers {
		want[c.loser.GetUID()] = conflictCondition(c)
	}
	for _, obj := range objs {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		uid := u.GetUID()
		cond := want[uid]
		msg, _ := cond["message"].(string)
		if ts.logged[uid] != msg {
			if cond != nil {
				n.cfg.Log.Warn("cluster: AirlockTemplate not built", "object", u.GetName(), "reason", msg)
			}
			ts.logged[uid] = msg
		}
		// The other conditions stay as they are (a merge patch replaces
		// the whole list).
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		var have map[string]any
		others := []any{}
		for _, c := range conds {
			if m, _ := c.(map[string]any); m["type"] == "NameConflict" {
				have = m
			} else {
				others = append(others, c)
			}
		}
		if have == nil && cond == nil || reflect.DeepEqual(have, cond) || time.Now().Before(ts.retryAfter[uid]) {
			continue
		}
		if cond != nil {
			others = append(others, cond)
		}
		patch, _ := json.Marshal(map[string]any{"status": map[string]any{"conditions": others}})
		if _, err := n.templateStatus.Patch(ctx, u.GetName(), types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
			if ctx.Err() == nil && !apierrors.IsNotFound(err) {
				n.cfg.Log.Warn("cluster: write an AirlockTemplate's status", "object", u.GetName(), "err", err)
			}
			ts.retryAfter[uid] = time.Now().Add(30 * time.Second)
			continue
		}
		delete(ts.retryAfter, uid)
	}
	// Forget the objects that are gone.
	seen := map[types.UID]bool{}
	for _, obj := range objs {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			seen[u.GetUID()] = true
		}
	}
	for uid := range ts.logged {
		if !seen[uid] {
			delete(ts.logged, uid)
			delete(ts.retryAfter, uid)
		}
	}
}

// build builds template name from spec (an AirlockTemplate's, E2B's
// build request in shape) with the node's build API, as the SDKs' Template
// builder does, tells started the node's id of the build, and waits for
// it to end.
func (l *LocalAPI) build(ctx context.Context, name string, spec map[string]any, started func(buildID string)) error {
	req := map[string]any{"name": name}
	for _, k := range []string{"cpuCount", "memoryMB", "minFreeDiskMb"} {
		if v, ok := spec[k]; ok {
			req[k] = v
		}
	}
	data, err := l.do(ctx, http.MethodPost, "/v3/templates", req)
	if err != nil {
		return err
	}
	var made struct {
		TemplateID string `json:"templateID"`
		BuildID    string `json:"buildID"`
	}
	if err := json.Unmarshal(data, &made); err != nil {
		return fmt.Errorf("build request: %v", err)
	}
	start := map[string]any{}
	for _, k := range []string{"fromImage", "fromTemplate", "steps", "startCmd", "readyCmd", "force"} {
		if v, ok := spec[k]; ok {
			start[k] = v
		}
	}
	buildPath := "/v2/templates/" + url.PathEscape(made.TemplateID) + "/builds/" + url.PathEscape(made.BuildID)
	if _, err := l.do(ctx, http.MethodPost, buildPath, start); err != nil {
		return err
	}
	started(made.BuildID)
	statusPath := "/templates/" + url.PathEscape(made.TemplateID) + "/builds/" + url.PathEscape(made.BuildID) + "/status?logsOffset=1000000000"
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
		data, err := l.do(ctx, http.MethodGet, statusPath, nil)
		if err != nil {
			return err
		}
		var st struct {
			Status string `json:"status"`
			Reason *struct {
				Message string `json:"message"`
			} `json:"reason"`
		}
		if err := json.Unmarshal(data, &st); err != nil {
			return fmt.Errorf("build status: %v", err)
		}
		switch st.Status {
		case "ready":
			return nil
		case "error":
			if st.Reason != nil {
				return fmt.Errorf("build failed: %s", st.Reason.Message)
			}
			return fmt.Errorf("build failed")
		}
	}
}

// removeTemplate removes template name ("id" or "id:tag") from the
// node: that tag alone, for another AirlockTemplate (or a client of the
// node) may have built another tag of the same id.
func (l *LocalAPI) removeTemplate(ctx context.Context, name string) error {
	id, tag, ok := strings.Cut(name, ":")
	if !ok {
		tag = "default"
	}
	_, err := l.do(ctx, http.MethodDelete, "/templates/tags", map[string]any{"name": id, "tags": []string{tag}})
	return err
}
