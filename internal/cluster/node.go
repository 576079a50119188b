package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
)

// NodeConfig is what a node daemon tells the cluster about itself.
type NodeConfig struct {
	Name      string
	Namespace string
	// Address is the URL at which routers reach the node's API.
	Address  string
	Backends []string
	// Capacity is the most sandboxes the node runs at once.
	Capacity int
	// Local is the node daemon's own API, which the registration reads
	// the node's load from and sets pool sizes through.
	Local *LocalAPI
	Log   *slog.Logger
}

// NodeStatus is an AirlockNode's status: what a router places creates by,
// and how the node's builds of AirlockTemplates stand.
type NodeStatus struct {
	Sandboxes int              `json:"sandboxes"`
	Pools     []PoolStatus     `json:"pools"`
	Templates []TemplateStatus `json:"templates"`
}

// PoolStatus is one template's pool on a node.
type PoolStatus struct {
	Template string `json:"template"`
	Size     int    `json:"size"`
	Ready    int    `json:"ready"`
}

// Node is a node daemon's registration: its Lease, renewed while it
// lives, its AirlockNode with its load, and the AirlockPools it obeys.
type Node struct {
	cfg    NodeConfig
	client dynamic.Interface
	// applied: the pool sizes that AirlockPools set on the node, by
	// template, as the node last accepted them.
	applied map[string]int
	// written: the resourceVersion of the node's last write of its Lease
	// and its AirlockNode (by kind), so that it deletes them only if no
	// other process has written them since: a daemon restarted on the
	// same node must not lose its registration to its dying predecessor.
	written map[string]string
	// templates: the node's builds of AirlockTemplates; templateStatus
	// writes the status of AirlockTemplates (why one is not built).
	templates      templates
	templateStatus patcher
}

// patcher writes an object's status: the dynamic client's, or a test's.
type patcher interface {
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*unstructured.Unstructured, error)
}

// Register makes the node known to the cluster: it fails, changing
// nothing, if the API server cannot be reached, lacks Airlock's
// resources, or a live node of another name has the same IDPrefix.
func Register(ctx context.Context, client dynamic.Interface, cfg NodeConfig) (*Node, error) {
	n := &Node{cfg: cfg, client: client, applied: map[string]int{}, written: map[string]string{},
		templates:      newTemplates(),
		templateStatus: client.Resource(templatesResource).Namespace(cfg.Namespace)}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := n.checkPrefix(ctx); err != nil {
		return nil, err
	}
	if err := n.upsert(ctx, n.nodes(), "AirlockNode", n.spec()); err != nil {
		return nil, fmt.Errorf("register node %s: %w", cfg.Name, err)
	}
	if err := n.renew(ctx); err != nil {
		return nil, fmt.Errorf("lease of node %s: %w", cfg.Name, err)
	}
	return n, nil
}

// spec is the node's AirlockNode spec, in the JSON types an unstructured
// object holds (a []string or an int there cannot be deep-copied).
func (n *Node) spec() map[string]any {
	var backends []any // nil stays null, as it was
	if n.cfg.Backends != nil {
		backends = make([]any, 0, len(n.cfg.Backends))
	}
	for _, b := range n.cfg.Backends {
		backends = append(backends, b)
	}
	return map[string]any{
		"address":  n.cfg.Address,
		"idPrefix": IDPrefix(n.cfg.Name),
		"backends": backends,
		"capacity": int64(n.cfg.Capacity),
	}
}

func (n *Node) nodes() dynamic.ResourceInterface {
	return n.client.Resource(nodesResource).Namespace(n.cfg.Namespace)
}

func (n *Node) leases() dynamic.ResourceInterface {
	return n.client.Resource(leasesResource).Namespace(n.cfg.Namespace)
}

// checkPrefix refuses a name whose IDPrefix a live node of another name
// has: the routers could not tell their sandboxes apart.
func (n *Node) checkPrefix(ctx context.Context) error {
	list, err := n.nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list AirlockNodes (are Airlock's CRDs installed?): %w", err)
	}
	mine := IDPrefix(n.cfg.Name)
	for _, other := range list.Items {
		// As routers do: from the name, whatever its record says.
		if other.GetName() == n.cfg.Name || IDPrefix(other.GetName()) != mine {
			continue
		}
		lease, err := n.leases().Get(ctx, other.GetName(), metav1.GetOptions{})
		if err == nil && leaseExpiry(lease).After(time.Now()) {
			return fmt.Errorf("node name %q gives sandbox ids the prefix %s, as live node %q does: choose another name", n.cfg.Name, mine, other.GetName())
		}
	}
	return nil
}

// upsert creates the object of the node's name with spec, or merges
// spec into it.
func (n *Node) upsert(ctx context.Context, r dynamic.ResourceInterface, kind string, spec map[string]any) error {
	apiVersion := Group + "/" + Version
	if kind == "Lease" {
		apiVersion = "coordination.k8s.io/v1"
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": apiVersion, "kind": kind,
		"metadata": map[string]any{"name": n.cfg.Name, "namespace": n.cfg.Namespace,
			"labels": map[string]any{"app.kubernetes.io/name": "airlock", "app.kubernetes.io/component": "node"}},
		"spec": spec,
	}}
	got, err := r.Create(ctx, obj, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		patch, _ := json.Marshal(map[string]any{"spec": spec})
		got, err = r.Patch(ctx, n.cfg.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	}
	if err == nil {
		n.written[kind] = got.GetResourceVersion()
	}
	return err
}

// renew writes the Lease anew: the node is alive for LeaseDuration more.
func (n *Node) renew(ctx context.Context) error {
	now := microTime(time.Now())
	return n.upsert(ctx, n.leases(), "Lease", map[string]any{
		"holderIdentity":       n.cfg.Name,
		"leaseDurationSeconds": int64(LeaseDuration / time.Second),
		"renewTime":            now,
	})
}

// Run keeps the registration true until ctx ends: it renews the Lease,
// makes the node's pools what the AirlockPools say, builds the
// AirlockTemplates, and publishes the node's load and builds when they
// change. Then it removes the node's Lease and
// AirlockNode, so that routers stop sending to it at once rather than
// when the Lease runs out.
func (n *Node) Run(ctx context.Context) {
	pools := newInformer(n.client.Resource(poolsResource).Namespace(n.cfg.Namespace))
	changed := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	tmpls := newInformer(n.client.Resource(templatesResource).Namespace(n.cfg.Namespace))
	for _, inf := range []cache.SharedIndexInformer{pools, tmpls} {
		inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: poke, DeleteFunc: poke,
			UpdateFunc: func(_, obj any) { poke(obj) },
		})
		go inf.Run(ctx.Done())
	}

	renew := time.NewTicker(LeaseDuration / 3)
	defer renew.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var published *NodeStatus
	for {
		select {
		case <-ctx.Done():
			n.deregister()
			return
		case <-renew.C:
			if err := n.renew(ctx); err != nil && ctx.Err() == nil {
				n.cfg.Log.Warn("cluster: renew lease", "err", err)
			}
			continue
		case <-changed:
		case <-tick.C:
		}
		// Each second, and at once when an AirlockPool changed: a size
		// the node did not take is tried again.
		n.applyPools(ctx, wantedPools(pools.GetStore()))
		// Only once the informer has listed them: an empty store before
		// that would remove every template built for an AirlockTemplate.
		if tmpls.HasSynced() {
			n.applyTemplates(ctx, tmpls.GetStore())
		}
		st, err := n.cfg.Local.status(ctx)
		if err != nil {
			if ctx.Err() == nil {
				n.cfg.Log.Warn("cluster: read the node's load", "err", err)
			}
			continue
		}
		st.Templates = n.templates.statuses()
		if published != nil && reflect.DeepEqual(*published, st) {
			continue
		}
		if err := n.publish(ctx, st); err != nil {
			if ctx.Err() == nil {
				n.cfg.Log.Warn("cluster: publish node status", "err", err)
			}
			continue
		}
		published = &st
	}
}

func (n *Node) publish(ctx context.Context, st NodeStatus) error {
	patch, _ := json.Marshal(map[string]any{"status": st})
	got, err := n.nodes().Patch(ctx, n.cfg.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	if err == nil {
		n.written["AirlockNode"] = got.GetResourceVersion()
	}
	if apierrors.IsNotFound(err) {
		// Deleted by an operator while the node lives: register again.
		err = n.upsert(ctx, n.nodes(), "AirlockNode", n.spec())
		if err == nil {
			err = errors.New("node object was deleted: made again, status follows")
		}
	}
	return err
}

// wantedPools are the pool sizes the AirlockPools in store ask for: a
// template named by several gets the largest size.
func wantedPools(store cache.Store) map[string]int {
	want := map[string]int{}
	for _, obj := range store.List() {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		t, _, _ := unstructured.NestedString(u.Object, "spec", "template")
		size, found, _ := unstructured.NestedInt64(u.Object, "spec", "size")
		if t == "" || !found || size < 0 {
			continue // the CRD's validation refuses these; an old object may not
		}
		want[t] = max(want[t], int(size))
	}
	return want
}

// applyPools sets the node's pools to want; a template no longer named
// goes back to the node's own configuration.
func (n *Node) applyPools(ctx context.Context, want map[string]int) {
	for _, t := range slices.Sorted(maps.Keys(want)) {
		if old, ok := n.applied[t]; ok && old == want[t] {
			continue
		}
		if err := n.cfg.Local.setPoolSize(ctx, t, want[t]); err != nil {
			n.cfg.Log.Warn("cluster: set pool size", "template", t, "err", err)
			continue
		}
		n.applied[t] = want[t]
		n.cfg.Log.Info("cluster: pool size from AirlockPool", "template", t, "size", want[t])
	}
	for _, t := range slices.Sorted(maps.Keys(n.applied)) {
		if _, ok := want[t]; ok {
			continue
		}
		if err := n.cfg.Local.setPoolSize(ctx, t, -1); err != nil {
			n.cfg.Log.Warn("cluster: reset pool size", "template", t, "err", err)
			continue
		}
		delete(n.applied, t)
		n.cfg.Log.Info("cluster: pool size back to the node's configuration", "template", t)
	}
}

// deregister removes the node's Lease and AirlockNode, unless another
// process wrote them after this one did.
func (n *Node) deregister() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	for kind, r := range map[string]dynamic.ResourceInterface{"Lease": n.leases(), "AirlockNode": n.nodes()} {
		rv := n.written[kind]
		err := r.Delete(ctx, n.cfg.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			n.cfg.Log.Warn("cluster: deregister", "kind", kind, "err", err)
		}
	}
}

// listWatcher is what an informer needs of a resource: the dynamic
// client's, or a test's objects.
type listWatcher interface {
	List(ctx context.Context, opts metav1.ListOptions) (*unstructured.UnstructuredList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// newInformer watches the objects of r: a list, then a watch, kept in a
// local store that handlers are told about. Built on the dynamic client
// alone, so that the cluster binary does not link (and initialise) every
// typed Kubernetes API that client-go's informer factories bring.
func newInformer(r listWatcher) cache.SharedIndexInformer {
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return r.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return r.Watch(ctx, opts)
		},
	}
	// The API server streams the list as watch events; a test's objects
	// say if they cannot (IsWatchListSemanticsUnSupported).
	return cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, r), &unstructured.Unstructured{}, 10*time.Minute, cache.Indexers{})
}
