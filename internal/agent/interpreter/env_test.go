package interpreter

import (
	"testing"
	"time"

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

// TestExportEnvDuringStart: a claim does not wait for a kernel still
// starting (a pool's late one), and that kernel, whose process took the
// environment of before, is told the envs once it runs.
func TestExportEnvDuringStart(t *testing.T) {
	needKernel(t, "python")
	s, url, _ := newService(t)
	// A default kernel's start holds starting: ExportEnv must not wait
	// for it.
	s.starting.Lock()
	vars := map[string]string{"AIRLOCK_EXPORTED": "late"}
	done := make(chan struct{})
	go func() { s.ExportEnv(t.Context(), vars); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("ExportEnv waited for a kernel's start")
	}
	s.starting.Unlock()

	// A kernel that began its start before another ExportEnv, with the
	// agent's environment of then.
	s.mu.Lock()
	before := s.exports
	s.mu.Unlock()
	lang, _ := languageOf("python")
	c := &codeContext{ID: newID(), Language: lang.name, lang: lang, Cwd: s.users.Home, created: time.Now()}
	c.mu.Lock()
	if err := s.startKernel(t.Context(), c); err != nil {
		t.Fatal(err)
	}
	s.ExportEnv(t.Context(), vars) // it is no context yet: not told here
	s.mu.Lock()
	s.contexts[c.ID] = c
	s.mu.Unlock()
	s.exportMissed(t.Context(), c, before)
	c.mu.Unlock()
	code := "import os\nprint(os.environ.get('AIRLOCK_EXPORTED'))"
	if out, _ := text(execute(t, url, agentproto.ExecuteRequest{Code: code, ContextID: c.ID})); out != "late\n" {
		t.Errorf("a kernel started before the envs were exported: %q, want them", out)
	}
}
