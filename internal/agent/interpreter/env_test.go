package interpreter

import (
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// TestExportEnv: a kernel running before the sandbox's envs were set
// (a pool's prestarted one) is given them; one started after finds them
// in the agent's environment.
func TestExportEnv(t *testing.T) {
	needKernel(t, "python")
	s, url, _ := newService(t)
	code := "import os\nprint(os.environ.get('AIRLOCK_EXPORTED'))"
	if out, _ := text(execute(t, url, agentproto.ExecuteRequest{Code: code})); out != "None\n" {
		t.Fatalf("before: %q", out)
	}
	vars := map[string]string{"AIRLOCK_EXPORTED": "x y"}
	s.env.Set(vars)
	s.ExportEnv(t.Context(), vars)
	if out, _ := text(execute(t, url, agentproto.ExecuteRequest{Code: code})); out != "x y\n" {
		t.Errorf("a running kernel: %q, want the exported value", out)
	}
}
