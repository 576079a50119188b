package agentproto

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestImportDirection keeps the contract's direction: agentproto is a
// leaf (the standard library only); the agent depends on nothing of the
// daemon's; the daemon reaches the agent only through agentproto, so
// that neither the agent nor its ZeroMQ comes into it.
func TestImportDirection(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list dependencies with")
	}
	const internal = "github.com/airlock-sandbox/airlock/internal/"
	// ours lists the packages of this module that pkg depends on, itself
	// included.
	ours := func(pkg string) []string {
		t.Helper()
		out, err := exec.Command(gobin, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", internal+pkg).Output()
		if err != nil {
			t.Fatalf("go list %s: %v", pkg, err)
		}
		var deps []string
		for _, p := range strings.Fields(string(out)) {
			if p, ok := strings.CutPrefix(p, internal); ok {
				deps = append(deps, p)
			} else if pkg == "agentproto" {
				t.Errorf("agentproto depends on %s: it must stay a leaf of the standard library", p)
			}
		}
		return deps
	}
	if deps := ours("agentproto"); !slices.Equal(deps, []string{"agentproto"}) {
		t.Errorf("agentproto depends on %v", deps)
	}
	for _, p := range ours("agent") {
		if p != "agent" && p != "agentproto" && !strings.HasPrefix(p, "agent/") {
			t.Errorf("the agent depends on %s, on the daemon's side", p)
		}
	}
	for _, pkg := range []string{"sandbox", "httpapi", "mcp"} {
		for _, p := range ours(pkg) {
			if p == "agent" || strings.HasPrefix(p, "agent/") {
				t.Errorf("%s depends on %s: the daemon knows the agent through agentproto only", pkg, p)
			}
		}
	}
}
