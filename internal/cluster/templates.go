package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"
)

// TemplateStatus is a node's build of one AirlockTemplate.
type TemplateStatus struct {
	Name       string `json:"name"`
	Generation int64  `json:"generation"`
	Phase      string `json:"phase"` // building, ready or error
	Message    string `json:"message,omitempty"`
}

// templates are the node's builds of AirlockTemplates, by template name.
type templates struct {
	mu     sync.Mutex
	builds map[string]*templateBuild
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

// applyTemplates builds, through the node's own build API, each
// AirlockTemplate in store that the node has not built at its current
// generation, and removes from the node the templates it built for
// objects that are gone.
func (n *Node) applyTemplates(ctx context.Context, store cache.Store) {
	ts := &n.templates
	want := map[string]bool{}
	for _, obj := range store.List() {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		spec, _, _ := unstructured.NestedMap(u.Object, "spec")
		name, _ := spec["name"].(string)
		if name == "" {
			name = u.GetName()
		}
		want[name] = true
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
		b := &templateBuild{key: key, cancel: cancel,
			status: TemplateStatus{Name: name, Generation: u.GetGeneration(), Phase: "building"}}
		ts.builds[name] = b
		ts.mu.Unlock()
		n.cfg.Log.Info("cluster: building template from AirlockTemplate", "template", name, "object", u.GetName(), "generation", u.GetGeneration())
		go func() {
			err := n.cfg.Local.build(bctx, name, spec)
			ts.mu.Lock()
			defer ts.mu.Unlock()
			if ts.builds[name] != b {
				return // replaced by a newer generation, or removed
			}
			if err != nil {
				b.status.Phase, b.status.Message = "error", err.Error()
				n.cfg.Log.Warn("cluster: template build", "template", name, "err", err)
				return
			}
			b.status.Phase = "ready"
		}()
	}
	ts.mu.Lock()
	var gone []string
	for name, b := range ts.builds {
		if !want[name] {
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
}

// build builds template name from spec (an AirlockTemplate's, E2B's
// build request in shape) with the node's build API, as the SDKs' Template
// builder does, and waits for it to end.
func (l *LocalAPI) build(ctx context.Context, name string, spec map[string]any) error {
	req := map[string]any{"name": name}
	for _, k := range []string{"cpuCount", "memoryMB"} {
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
	for _, k := range []string{"fromImage", "fromTemplate", "steps", "startCmd", "readyCmd"} {
		if v, ok := spec[k]; ok {
			start[k] = v
		}
	}
	buildPath := "/v2/templates/" + url.PathEscape(made.TemplateID) + "/builds/" + url.PathEscape(made.BuildID)
	if _, err := l.do(ctx, http.MethodPost, buildPath, start); err != nil {
		return err
	}
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

// removeTemplate removes template name (all its tags) from the node.
func (l *LocalAPI) removeTemplate(ctx context.Context, name string) error {
	id, _, _ := strings.Cut(name, ":")
	_, err := l.do(ctx, http.MethodDelete, "/templates/"+url.PathEscape(id), nil)
	return err
}
