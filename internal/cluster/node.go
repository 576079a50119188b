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
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
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
	Manager  Manager
	Log      *slog.Logger
}

// Manager is what a node needs of its sandbox manager.
type Manager interface {
	SetPoolSize(template string, size int)
	Pools(ctx context.Context) ([]sandbox.PoolStatus, int64)
	Counts() (running, pooled map[string]int)
}

// NodeStatus is an AirlockNode's status: what a router places creates by.
type NodeStatus struct {
	Sandboxes int          `json:"sandboxes"`
	Pools     []PoolStatus `json:"pools"`
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

	mu        sync.Mutex
	overrides map[string]int // pool sizes that AirlockPools set, by template
}

// Register makes the node known to the cluster: it fails, changing
// nothing, if the API server cannot be reached, lacks Airlock's
// resources, or a live node of another name has the same IDPrefix.
func Register(ctx context.Context, client dynamic.Interface, cfg NodeConfig) (*Node, error) {
	n := &Node{cfg: cfg, client: client, overrides: map[string]int{}}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := n.checkPrefix(ctx); err != nil {
		return nil, err
	}
	spec := map[string]any{
		"address":  cfg.Address,
		"idPrefix": IDPrefix(cfg.Name),
		"backends": cfg.Backends,
		"capacity": cfg.Capacity,
	}
	if err := n.upsert(ctx, n.nodes(), "AirlockNode", spec); err != nil {
		return nil, fmt.Errorf("register node %s: %w", cfg.Name, err)
	}
	if err := n.renew(ctx); err != nil {
		return nil, fmt.Errorf("lease of node %s: %w", cfg.Name, err)
	}
	return n, nil
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
		p, _, _ := unstructured.NestedString(other.Object, "spec", "idPrefix")
		if other.GetName() == n.cfg.Name || p != mine {
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
	_, err := r.Create(ctx, obj, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	patch, _ := json.Marshal(map[string]any{"spec": spec})
	_, err = r.Patch(ctx, n.cfg.Name, types.MergePatchType, patch, metav1.PatchOptions{})
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
// publishes the node's load when it changes, and applies AirlockPools.
// Then it removes the node's Lease and AirlockNode, so that routers stop
// sending to it at once rather than when the Lease runs out.
func (n *Node) Run(ctx context.Context) {
	pools := newInformer(n.client.Resource(poolsResource).Namespace(n.cfg.Namespace))
	sync := func(any) { n.applyPools(pools.GetStore()) }
	pools.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: sync, DeleteFunc: sync,
		UpdateFunc: func(_, obj any) { sync(obj) },
	})
	go pools.Run(ctx.Done())

	renew := time.NewTicker(LeaseDuration / 3)
	defer renew.Stop()
	publish := time.NewTicker(time.Second)
	defer publish.Stop()
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
		case <-publish.C:
			st := n.status(ctx)
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
}

func (n *Node) status(ctx context.Context) NodeStatus {
	running, _ := n.cfg.Manager.Counts()
	st := NodeStatus{Pools: []PoolStatus{}}
	for _, c := range running {
		st.Sandboxes += c
	}
	pools, _ := n.cfg.Manager.Pools(ctx)
	for _, p := range pools {
		st.Pools = append(st.Pools, PoolStatus{Template: p.Template, Size: p.Size, Ready: p.Ready})
	}
	return st
}

func (n *Node) publish(ctx context.Context, st NodeStatus) error {
	patch, _ := json.Marshal(map[string]any{"status": st})
	_, err := n.nodes().Patch(ctx, n.cfg.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	if apierrors.IsNotFound(err) {
		// Deleted by an operator while the node lives: register again.
		err = n.upsert(ctx, n.nodes(), "AirlockNode", map[string]any{
			"address": n.cfg.Address, "idPrefix": IDPrefix(n.cfg.Name), "backends": n.cfg.Backends, "capacity": n.cfg.Capacity,
		})
		if err == nil {
			err = errors.New("node object was deleted: made again, status follows")
		}
	}
	return err
}

// applyPools sets each pool's size from the AirlockPools: a template
// named by several gets the largest size; one no longer named goes back
// to the node's own configuration.
func (n *Node) applyPools(store cache.Store) {
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
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, t := range slices.Sorted(maps.Keys(want)) {
		if old, ok := n.overrides[t]; ok && old == want[t] {
			continue
		}
		n.cfg.Manager.SetPoolSize(t, want[t])
		n.overrides[t] = want[t]
		n.cfg.Log.Info("cluster: pool size from AirlockPool", "template", t, "size", want[t])
	}
	for t := range n.overrides {
		if _, ok := want[t]; !ok {
			n.cfg.Manager.SetPoolSize(t, -1)
			delete(n.overrides, t)
			n.cfg.Log.Info("cluster: pool size back to the node's configuration", "template", t)
		}
	}
}

// deregister removes the node's Lease and AirlockNode.
func (n *Node) deregister() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	for _, r := range []dynamic.ResourceInterface{n.leases(), n.nodes()} {
		if err := r.Delete(ctx, n.cfg.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			n.cfg.Log.Warn("cluster: deregister", "err", err)
		}
	}
}

// newInformer watches the objects of r: a list, then a watch, kept in a
// local store that handlers are told about. Built on the dynamic client
// alone, so that the daemon does not link (and initialise) every typed
// Kubernetes API that client-go's informer factories bring.
func newInformer(r dynamic.ResourceInterface) cache.SharedIndexInformer {
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return r.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return r.Watch(ctx, opts)
		},
	}
	return cache.NewSharedIndexInformer(lw, &unstructured.Unstructured{}, 10*time.Minute, cache.Indexers{})
}
