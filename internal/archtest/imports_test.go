package archtest

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/airlock-sandbox/airlock/"

// allowed lists, for every package of the module, the module packages it
// may import directly. A package missing here fails the test: a new
// package takes its place in the architecture on purpose.
//
// The shape: cmd → daemon, which assembles the edges (httpapi, mcp) →
// sandbox → backend → policy; backends implement backend's contract and
// never import each other, the manager or the edges; the agent, which
// runs inside every sandbox, imports nothing daemon-side; policy,
// agentproto and cgroups are leaves, and config knows only policy.
var allowed = map[string][]string{
	// What runs inside a sandbox, apart from the daemon's packages.
	"cmd/airlock-sandbox": {"internal/agent", "internal/agent/sudo", "internal/agentproto", "internal/backend/namespaces/nsinit"},
	// The commands: airlock serve and airlock mcp are the daemon's; run
	// and template use backends and the image store directly.
	"cmd/airlock": {"internal/daemon", "internal/config", "internal/apikey", "internal/clusterbin",
		"internal/backend", "internal/backend/gvisor", "internal/backend/namespaces", "internal/layout",
		"internal/netpolicy", "internal/policy", "internal/image", "internal/build", "internal/stock",
		"internal/runsock", "internal/agentproto"},
	// A cluster on Kubernetes: the only binary that links client-go.
	"cmd/airlock-cluster": {"internal/cluster", "internal/console", "internal/apikey", "internal/httpserve"},
	"tests/netlab":        {"internal/nettest"},
	"tests/mkimage":       {"internal/image/imagetest"},

	// Whether an API key is strong, and its fingerprint: a leaf.
	"internal/apikey": {},
	// Timeouts and a bound on connections of the daemons' servers.
	"internal/httpserve": {},

	"internal/policy": {},
	// Sandboxes' audit trails: egress decisions and API actions.
	"internal/audit": {"internal/policy"},
	// Secrets for egress rules, encrypted at rest.
	"internal/secret":     {"internal/policy"},
	"internal/agentproto": {},
	"internal/cgroups":    {},
	"internal/layout":     {"internal/policy"},
	"internal/backend":    {"internal/policy"},

	"internal/backend/namespaces": {"internal/backend", "internal/backend/namespaces/nsinit", "internal/cgroups", "internal/layout", "internal/policy", "internal/agentproto", "internal/ocilayer", "internal/sandboxbin", "internal/rangelock"},
	"internal/backend/gvisor":     {"internal/backend", "internal/cgroups", "internal/layout", "internal/policy", "internal/agentproto", "internal/ocilayer", "internal/sandboxbin"},
	// The namespaces sandbox's init, inside it: the sandbox binary's.
	"internal/backend/namespaces/nsinit": {"internal/layout", "internal/policy", "internal/agentproto"},
	// The sandbox binary, embedded, and where it is installed: a leaf.
	"internal/console":    {},
	"internal/sandboxbin": {},
	"internal/clusterbin": {},
	// Byte-range locks of the host's shared files: a leaf.
	"internal/rangelock": {},
	// The router and a node's registration, over the API server and the
	// nodes' own APIs: it knows no other package of the daemon.
	"internal/cluster":             {"internal/sandboxid"},
	"internal/sandboxid":           {},
	"internal/backend/fake":        {"internal/backend", "internal/policy", "internal/agent", "internal/agent/checkpoint", "internal/agent/filestate", "internal/agentproto"},
	"internal/backend/backendtest": {"internal/policy", "internal/backend", "internal/agentproto", "internal/layout"},

	// The agent, which runs in every sandbox: its wiring (New, Handler,
	// Main) imports every service; a service imports what they share and
	// agentproto, and no other service (files reports entries as the
	// filesystem service does, with its metadata).
	"internal/agent": {"internal/agent/environ", "internal/agent/identity", "internal/agent/process",
		"internal/agent/filesystem", "internal/agent/files", "internal/agent/interpreter", "internal/agent/sudo",
		"internal/agent/filestate", "internal/agent/checkpoint", "internal/agent/forward", "internal/agentproto"},
	"internal/agent/process":    {"internal/agent/environ", "internal/agent/identity", "internal/agent/rpc", "internal/agent/tasks", "internal/agentproto"},
	"internal/agent/filesystem": {"internal/agent/identity", "internal/agent/rpc", "internal/agentproto"},
	"internal/agent/files":      {"internal/agent/filesystem", "internal/agent/identity", "internal/agent/rpc", "internal/agentproto"},
	"internal/agent/interpreter": {"internal/agent/environ", "internal/agent/identity", "internal/agent/jupyter", "internal/agent/rpc",
		"internal/agentproto"},
	"internal/agent/jupyter": {"internal/agent/tasks"},
	// sudo's client runs as the sandbox binary's sudo, its server in the
	// agent.
	"internal/agent/sudo": {"internal/agent/identity", "internal/agent/tasks"},
	// The daemon's private endpoints that are no service's.
	"internal/agent/filestate":  {"internal/agentproto"},
	"internal/agent/checkpoint": {"internal/agentproto"},
	"internal/agent/forward":    {"internal/agentproto"},
	// What the services share: the Connect protocol they are served in,
	// whom they act for, the environment and the reserve of tasks of the
	// processes they start.
	"internal/agent/rpc":      {"internal/agentproto"},
	"internal/agent/identity": {"internal/agent/rpc", "internal/agentproto"},
	"internal/agent/environ":  {"internal/agent/identity"},
	"internal/agent/tasks":    {"internal/agentproto"},
	// Calls of rpc's services, for their tests.
	"internal/agent/rpc/rpctest": {"internal/agentproto"},
	// The filesystem service's answers as a client reads them, for the
	// tests of filesystem and files.
	"internal/agent/filesystem/filesystemtest": {"internal/agent/rpc/rpctest"},

	// The network's host side: a peer of the backends, which never see
	// more of it than a namespace to run in.
	"internal/netpolicy": {"internal/layout", "internal/policy", "internal/rangelock", "internal/audit"},
	"internal/nettest":   {},

	// Images templates are made of: a store on the host, for the daemon.
	"internal/image": {"internal/layout", "internal/policy", "internal/ocilayer"},
	// What a sandbox changed of its image's root, as a layer: a leaf.
	"internal/ocilayer":        {},
	"internal/image/imagetest": {},
	// The stock templates' Debian root, made on the host into an image
	// store of its own.
	"internal/stock": {"internal/image", "internal/layout", "internal/ocilayer"},

	// E2B's volumes: file systems on the host that sandboxes mount, a
	// store of the daemon's with their files: a leaf.
	"internal/volume": {},

	"internal/sandbox": {"internal/backend", "internal/policy", "internal/agentproto", "internal/sandboxid", "internal/volume"},
	// The daemon's settings and their precedence: what they become is
	// the daemon package's business.
	"internal/config": {"internal/policy"},
	// The daemon assembled from its config: the one package that knows
	// every part, and that only the command imports.
	"internal/daemon": {"internal/config", "internal/secret", "internal/audit", "internal/apikey", "internal/backend", "internal/backend/gvisor",
		"internal/backend/namespaces", "internal/cgroups", "internal/sandbox", "internal/sandboxid", "internal/policy",
		"internal/agentproto", "internal/netpolicy", "internal/image", "internal/build", "internal/httpapi",
		"internal/httpserve", "internal/mcp", "internal/console", "internal/clusterbin", "internal/stock", "internal/runsock", "internal/volume", "internal/rangelock"},
	// airlock run's way into a local daemon's pool: its socket and
	// protocol, shared by the command and the daemon.
	"internal/runsock": {"internal/backend", "internal/policy"},
	"internal/httpapi": {"internal/sandbox", "internal/agentproto", "internal/policy", "internal/build", "internal/image", "internal/sandboxid", "internal/volume", "internal/secret", "internal/audit", "internal/apikey"},
	// Template builds: steps run through the agent of a sandbox the
	// daemon starts, the result goes to the image store.
	"internal/build":       {"internal/agentproto", "internal/image", "internal/layout", "internal/policy"},
	"internal/mcp":         {"internal/sandbox", "internal/agentproto"},
	"internal/airlocktest": {},
	"internal/archtest":    {},
}

// stdlibOnly are packages that import nothing outside the standard
// library: the contract with the agent, which runs inside every sandbox,
// the policy, which parses outside input, and the configuration.
var stdlibOnly = []string{"internal/agentproto", "internal/policy", "internal/config"}

// TestImports checks every package's direct imports against allowed.
func TestImports(t *testing.T) {
	graph, external := imports(t)
	for _, pkg := range stdlibOnly {
		if len(external[pkg]) > 0 {
			t.Errorf("%s imports %v: it must use the standard library only", pkg, external[pkg])
		}
	}
	for pkg, deps := range graph {
		ok, known := allowed[pkg]
		if !known {
			t.Errorf("package %s is not in the architecture's table (internal/archtest): add it with what it may import", pkg)
			continue
		}
		for _, d := range deps {
			if !slices.Contains(ok, d) {
				t.Errorf("%s imports %s, which the architecture forbids", pkg, d)
			}
		}
	}
}

// TestAgentIsSelfContained: what runs inside every sandbox reaches nothing
// daemon-side, however indirectly.
func TestAgentIsSelfContained(t *testing.T) {
	graph, _ := imports(t)
	seen := map[string]bool{}
	var walk func(string)
	walk = func(p string) {
		for _, d := range graph[p] {
			if !seen[d] {
				seen[d] = true
				walk(d)
			}
		}
	}
	// Every package of the agent is a root: the sandbox binary imports
	// some of them (sudo) directly.
	for p := range graph {
		if p == "internal/agent" || strings.HasPrefix(p, "internal/agent/") {
			walk(p)
		}
	}
	for d := range seen {
		if d != "internal/agentproto" && !strings.HasPrefix(d, "internal/agent/") {
			t.Errorf("the agent depends on %s", d)
		}
	}
}

// TestDaemonLinksNoKubernetes: Kubernetes' client packages cost every
// process that links them ~2 ms at start; only the cluster binary
// (cmd/airlock-cluster) may, never airlock, which runs every airlock run.
func TestDaemonLinksNoKubernetes(t *testing.T) {
	graph, external := imports(t)
	seen := map[string]bool{"cmd/airlock": true}
	queue := []string{"cmd/airlock"}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, e := range external[p] {
			if strings.HasPrefix(e, "k8s.io/") || strings.HasPrefix(e, "sigs.k8s.io/") {
				t.Errorf("airlock links %s (through %s): keep Kubernetes in cmd/airlock-cluster", e, p)
			}
		}
		for _, d := range graph[p] {
			if !seen[d] {
				seen[d] = true
				queue = append(queue, d)
			}
		}
	}
}

// imports parses the module's non-test Go files and returns, for each
// package directory, the module packages it imports and the packages
// outside the standard library and the module.
func imports(t *testing.T) (graph, external map[string][]string) {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	graph, external = map[string][]string{}, map[string][]string{}
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules" || name == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		if _, ok := graph[rel]; !ok {
			graph[rel] = nil
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			first, _, _ := strings.Cut(p, "/")
			if dep, ok := strings.CutPrefix(p, module); ok && !slices.Contains(graph[rel], dep) {
				graph[rel] = append(graph[rel], dep)
			} else if !ok && strings.Contains(first, ".") {
				external[rel] = append(external[rel], p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(graph) < 10 {
		t.Fatalf("found only %d packages under %s", len(graph), root)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatal(err)
	}
	return graph, external
}
