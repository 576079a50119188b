package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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
	// bad: why each node left out of known was, as last logged (under
	// rebuildMu): a Lease renewal must not log it again.
	bad map[string]string
	log *slog.Logger

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
	// Templates: its builds of AirlockTemplates, by template name.
	Templates map[string]TemplateStatus `json:"-"`
	// target is Address parsed: where the proxy sends requests.
	target *url.URL
}

// known is a registered node with its Lease's times.
type known struct {
	node
	expires, renewed time.Time
}

// newNodeSet watches the AirlockNodes and Leases that nodes and leases
// list (one namespace's, of the API server).
func newNodeSet(nodes, leases listWatcher, log *slog.Logger) *nodeSet {
	return &nodeSet{
		nodes: newInformer(nodes), leases: newInformer(leases), log: log,
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

// rebuild parses the nodes that have a Lease. A record that cannot be
// routed to is left out, and logged once for each address it gives.
func (s *nodeSet) rebuild() {
	s.rebuildMu.Lock()
	defer s.rebuildMu.Unlock()
	var all []known
	bad := map[string]string{}
	for _, obj := range s.nodes.GetStore().List() {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		l, ok, _ := s.leases.GetStore().GetByKey(u.GetNamespace() + "/" + u.GetName())
		if !ok {
			continue
		}
		lease, ok := l.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		k, err := parseNode(u, lease)
		if err != nil {
			bad[u.GetName()] = err.Error()
			if s.bad[u.GetName()] != err.Error() {
				s.log.Warn("router: AirlockNode left out", "node", u.GetName(), "err", err)
			}
			continue
		}
		all = append(all, k)
	}
	// In the order of their names: the informers' stores list in no
	// order, and a signed URL asks node after node.
	slices.SortFunc(all, func(a, b known) int { return strings.Compare(a.Name, b.Name) })
	s.bad = bad
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
	return s.byPrefix(p)
}

// byPrefix is the live node whose id prefix is p.
func (s *nodeSet) byPrefix(p string) (node, bool) {
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
