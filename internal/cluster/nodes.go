package cluster

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
)

// nodeSet is a router's view of the nodes: AirlockNodes and Leases as
// informers keep them (one watch each, no polling), and what the router
// itself saw of each node since.
type nodeSet struct {
	nodes, leases cache.SharedIndexInformer
	// known: every registered node as its objects say, parsed when they
	// change rather than at each request (every request of every sandbox
	// looks its node up). rebuildMu orders the rebuilds of the two
	// informers' events, so that the last stored read the newest objects.
	known     atomic.Pointer[[]known]
	rebuildMu sync.Mutex

	mu sync.Mutex
	// failedAt: when a connection to the node last failed. A node is
	// dead from then until it renews its Lease again.
	failedAt map[string]time.Time
	// sent: creates sent to each node, by template, that its published
	// status may not count yet (it publishes at most once a second). Each
	// is taken to have claimed a ready sandbox: else a burst of creates
	// would all go to the one node whose stale status still shows one.
	sent map[string]map[string]int
}

// node is one live node as a router places and routes by it.
type node struct {
	Name      string         `json:"name"`
	Address   string         `json:"address"`
	Prefix    string         `json:"idPrefix"`
	Capacity  int            `json:"capacity"`
	Sandboxes int            `json:"sandboxes"`
	Ready     map[string]int `json:"ready"` // ready pooled sandboxes by template
}

// known is a registered node with its Lease's times.
type known struct {
	node
	expires, renewed time.Time
}

func newNodeSet(client dynamic.Interface, namespace string) *nodeSet {
	return &nodeSet{
		nodes:    newInformer(client.Resource(nodesResource).Namespace(namespace)),
		leases:   newInformer(client.Resource(leasesResource).Namespace(namespace)),
		failedAt: map[string]time.Time{}, sent: map[string]map[string]int{},
	}
}

// start runs the informers until ctx ends, and waits until they have
// listed what exists.
func (s *nodeSet) start(ctx context.Context) error {
	s.known.Store(&[]known{})
	changed := func(any) { s.rebuild() }
	for _, inf := range []cache.SharedIndexInformer{s.nodes, s.leases} {
		inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: changed, DeleteFunc: changed,
			UpdateFunc: func(_, obj any) { changed(obj) },
		})
		go inf.Run(ctx.Done())
	}
	wait, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if !cache.WaitForCacheSync(wait.Done(), s.nodes.HasSynced, s.leases.HasSynced) {
		return fmt.Errorf("could not list AirlockNodes and Leases from the API server in 30 s (are Airlock's CRDs installed, and may this identity list them?)")
	}
	s.rebuild()
	return nil
}

// rebuild parses the nodes that have an address and a Lease.
func (s *nodeSet) rebuild() {
	s.rebuildMu.Lock()
	defer s.rebuildMu.Unlock()
	var all []known
	for _, obj := range s.nodes.GetStore().List() {
		u := obj.(*unstructured.Unstructured)
		l, ok, _ := s.leases.GetStore().GetByKey(u.GetNamespace() + "/" + u.GetName())
		if !ok {
			continue
		}
		lease := l.(*unstructured.Unstructured)
		k := known{expires: leaseExpiry(lease)}
		renewed, _, _ := unstructured.NestedString(lease.Object, "spec", "renewTime")
		k.renewed, _ = time.Parse(time.RFC3339Nano, renewed)
		n := node{Name: u.GetName(), Ready: map[string]int{}}
		n.Address, _, _ = unstructured.NestedString(u.Object, "spec", "address")
		// The prefix is computed, not read: a node's record cannot claim
		// another's sandboxes.
		n.Prefix = IDPrefix(u.GetName())
		c, _, _ := unstructured.NestedInt64(u.Object, "spec", "capacity")
		sb, _, _ := unstructured.NestedInt64(u.Object, "status", "sandboxes")
		n.Capacity, n.Sandboxes = int(c), int(sb)
		pools, _, _ := unstructured.NestedSlice(u.Object, "status", "pools")
		for _, p := range pools {
			m, _ := p.(map[string]any)
			t, _ := m["template"].(string)
			r, _ := m["ready"].(int64)
			n.Ready[t] = int(r)
		}
		if n.Address != "" {
			k.node = n
			all = append(all, k)
		}
	}
	s.known.Store(&all)
}

// alive reports whether k's Lease runs and no connection to it failed
// since it last renewed it. s.mu is held.
func (s *nodeSet) alive(k *known, now time.Time) bool {
	return k.expires.After(now) && !s.failedAt[k.Name].After(k.renewed)
}

// live lists the live nodes, each with the creates sent to it that its
// status does not count yet: its own copy, for placement to sort.
func (s *nodeSet) live() []node {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []node
	for _, k := range *s.known.Load() {
		if !s.alive(&k, now) {
			continue
		}
		n := k.node
		n.Ready = maps.Clone(k.Ready)
		for t, c := range s.sent[n.Name] {
			n.Sandboxes += c
			n.Ready[t] = max(0, n.Ready[t]-c)
		}
		out = append(out, n)
	}
	return out
}

// byID is the live node that holds sandbox id.
func (s *nodeSet) byID(id string) (node, bool) {
	p := prefixOf(id)
	if p == "" {
		return node{}, false
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range *s.known.Load() {
		if k.Prefix == p && s.alive(&k, now) {
			return k.node, true
		}
	}
	return node{}, false
}

// failed records that a connection to node name failed: it holds no
// sandboxes that anyone can reach until it renews its Lease.
func (s *nodeSet) failed(name string) {
	s.mu.Lock()
	s.failedAt[name] = time.Now()
	s.mu.Unlock()
}

// placed counts a create of template sent to node name for the next two
// seconds, by when its published status includes it.
func (s *nodeSet) placed(name, template string) {
	s.mu.Lock()
	if s.sent[name] == nil {
		s.sent[name] = map[string]int{}
	}
	s.sent[name][template]++
	s.mu.Unlock()
	time.AfterFunc(2*time.Second, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.sent[name][template]--; s.sent[name][template] <= 0 {
			delete(s.sent[name], template)
		}
		if len(s.sent[name]) == 0 {
			delete(s.sent, name)
		}
	})
}
