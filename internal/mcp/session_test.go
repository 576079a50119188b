package mcp

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// TestSessionsOwnTheirSandboxes: each session gets a sandbox of its own
// on first use, sees and kills only that one, and takes it with it when
// it ends.
func TestSessionsOwnTheirSandboxes(t *testing.T) {
	h := newHarness(t, sandbox.Config{})
	a, b := h.connect("a", nil), h.connect("b", nil)
	if got := mustCall(t, a, "list_sandboxes", nil); got != "(none: the next tool call starts one)" {
		t.Errorf("before any call: %q", got)
	}
	if n := h.b.Starts(); n != 0 {
		t.Errorf("list_sandboxes started %d sandboxes", n)
	}
	mustCall(t, a, "write_file", map[string]any{"path": "mine", "content": "a"})
	mustCall(t, b, "write_file", map[string]any{"path": "mine", "content": "b"})
	sbs := h.m.List(nil)
	if len(sbs) != 2 {
		t.Fatalf("%d sandboxes for two sessions, want 2", len(sbs))
	}
	for _, sb := range sbs {
		if sb.Metadata["mcp-session"] != "true" || sb.TemplateID != codeTemplate {
			t.Errorf("sandbox %s: template %s, metadata %v", sb.ID, sb.TemplateID, sb.Metadata)
		}
	}
	ida, idb := sandboxOf(t, a), sandboxOf(t, b)
	if ida == idb {
		t.Fatalf("two sessions share sandbox %s", ida)
	}
	if got := mustCall(t, b, "read_file", map[string]any{"path": "mine"}); got != "b" {
		t.Errorf("session b reads %q from its sandbox", got)
	}
	// b kills its own, not a's.
	if got := mustCall(t, b, "kill_sandbox", nil); got != "killed "+idb+"; the next tool call starts a fresh sandbox" {
		t.Errorf("kill_sandbox: %q", got)
	}
	if _, err := h.m.Get(ida); err != nil {
		t.Errorf("a's sandbox after b's kill: %v", err)
	}
	if text, isErr := call(t, b, "kill_sandbox", nil); !isErr || text != "this session has no sandbox" {
		t.Errorf("a second kill_sandbox: %v %q", isErr, text)
	}
	// The next call starts a fresh one, without b's file.
	if text, isErr := call(t, b, "read_file", map[string]any{"path": "mine"}); !isErr || !strings.Contains(text, "does not exist") {
		t.Errorf("read_file in b's fresh sandbox: %v %q", isErr, text)
	}
	// a ends: its sandbox goes with it.
	sba, err := h.m.Get(ida)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	ended(t, sba)
	if n := len(h.m.List(nil)); n != 1 {
		t.Errorf("%d sandboxes after session a ended, want b's", n)
	}
}

// sandboxOf is the id of cs's sandbox, as list_sandboxes shows it.
func sandboxOf(t *testing.T, cs *sdk.ClientSession) string {
	t.Helper()
	id, _, _ := strings.Cut(mustCall(t, cs, "list_sandboxes", nil), "\t")
	return id
}

func TestCreateSandbox(t *testing.T) {
	h := newHarness(t, sandbox.Config{})
	cs := h.connect("s", nil)
	for _, tc := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"template": "nope"}, `create_sandbox: unknown template "nope"`},
		{map[string]any{"memory_mb": 100000}, "create_sandbox: invalid request: memory 100000M is above the template's 512M"},
		{map[string]any{"memory_mb": 1 << 50}, "create_sandbox: invalid request: memory 9223372036854775807 is above the template's 512M"}, // saturated, not wrapped,
		{map[string]any{"cpus": -1}, "create_sandbox: memory_mb, cpus, pids and disk_mb must not be negative"},
		{map[string]any{"timeout_seconds": -5}, "create_sandbox: timeout_seconds must be between 1 and 86400"},
		{map[string]any{"volumes": map[string]any{"/mnt/data": "data"}}, "create_sandbox: invalid request: this server has no volumes"},
		{map[string]any{"timeout_seconds": 7200}, "create_sandbox: invalid request: timeout 2h0m0s is above this server's maximum of 1h0m0s"},
	} {
		text, isErr := call(t, cs, "create_sandbox", tc.args)
		if !isErr || text != tc.want {
			t.Errorf("create_sandbox %v: %v %q, want %q", tc.args, isErr, text, tc.want)
		}
	}
	if n := h.b.Starts(); n != 0 {
		t.Errorf("refused creates started %d sandboxes", n)
	}
	first := mustCall(t, cs, "create_sandbox", nil)
	old := h.only()
	if want := "sandbox " + old.ID + " (" + codeTemplate + ") ready; it ends after 1m0s without a tool call"; first != want {
		t.Errorf("create_sandbox: %q, want %q", first, want)
	}
	// A second replaces the first, with what it asked for.
	got := mustCall(t, cs, "create_sandbox", map[string]any{"template": "base", "memory_mb": 256, "cpus": 0.5, "disk_mb": 100, "timeout_seconds": 600})
	ended(t, old)
	sb := h.only()
	if want := "sandbox " + sb.ID + " (base) ready; it ends after 10m0s without a tool call"; got != want {
		t.Errorf("create_sandbox: %q, want %q", got, want)
	}
	list := mustCall(t, cs, "list_sandboxes", nil)
	if want := fmt.Sprintf("%s\tbase\tuntil %s\tmemory 256 MiB, 0.5 CPUs, disk 100 MiB", sb.ID, sb.EndAt().UTC().Format(time.RFC3339)); list != want {
		t.Errorf("list_sandboxes: %q, want %q", list, want)
	}
	// One that dies is replaced by the next call with the same template,
	// limits and time to live.
	h.b.Instances()[len(h.b.Instances())-1].Die()
	ended(t, sb)
	mustCall(t, cs, "list_files", map[string]any{"path": "."})
	again := h.only()
	if again.ID == sb.ID || again.TemplateID != "base" || again.MemoryMB != 256 || again.CPUs != 0.5 || again.DiskMB != 100 {
		t.Errorf("the replacement: %s %s, %d MiB, %g CPUs, %d MiB of disk", again.ID, again.TemplateID, again.MemoryMB, again.CPUs, again.DiskMB)
	}
	if left := time.Until(again.EndAt()); left < 9*time.Minute {
		t.Errorf("the replacement ends in %s, want the 10 minutes asked for", left)
	}
}

// TestPausedSandboxResumes: a session's sandbox paused through the E2B
// API is resumed by the session's next call.
func TestPausedSandboxResumes(t *testing.T) {
	h := newHarness(t, sandbox.Config{PauseInMemory: true})
	cs := h.connect("s", nil)
	mustCall(t, cs, "write_file", map[string]any{"path": "kept", "content": "yes"})
	sb := h.only()
	if err := h.m.Pause(t.Context(), sb.ID, true); err != nil {
		t.Fatal(err)
	}
	if !sb.Paused() {
		t.Fatal("not paused")
	}
	if got := mustCall(t, cs, "read_file", map[string]any{"path": "kept"}); got != "yes" {
		t.Errorf("after the pause: %q", got)
	}
	if sb.Paused() || h.only() != sb {
		t.Errorf("the call did not resume the same sandbox (paused %v)", sb.Paused())
	}
}

// TestDaemonErrorsHidden: a failure of the daemon's own reaches the model
// as a summary, never its text (which can name host paths); limits the
// server sets are named.
func TestDaemonErrorsHidden(t *testing.T) {
	h := newHarness(t, sandbox.Config{MaxSandboxes: 1})
	a, b := h.connect("a", nil), h.connect("b", nil)
	mustCall(t, a, "list_files", map[string]any{"path": "."})
	if text, isErr := call(t, b, "list_files", map[string]any{"path": "."}); !isErr || text != "no sandbox: too many sandboxes: the limit is 1" {
		t.Errorf("over the server's limit: %v %q", isErr, text)
	}
	mustCall(t, a, "kill_sandbox", nil)
	h.b.SetStartError(errors.New("mkdir /var/lib/airlock/secret: permission denied"))
	for tool, args := range map[string]map[string]any{"run_command": {"command": "true"}, "create_sandbox": nil} {
		text, isErr := call(t, b, tool, args)
		if !isErr || strings.Contains(text, "/var/lib") || !strings.HasSuffix(text, ": internal error (the server log has the details)") {
			t.Errorf("%s when the backend fails: %v %q", tool, isErr, text)
		}
	}
}

// TestSandboxEndsUnderACall: a call whose sandbox dies under it (the OOM
// killer, a crash) says so, and the next call starts a new one.
func TestSandboxEndsUnderACall(t *testing.T) {
	h := newHarness(t, sandbox.Config{})
	cs := h.connect("s", nil)
	mustCall(t, cs, "list_files", map[string]any{"path": "."})
	sb, inst := h.only(), h.b.Instances()[0]
	fifo := filepath.Join(inst.Home(), "started")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	type result struct {
		text  string
		isErr bool
	}
	done := make(chan result, 1)
	go func() {
		res, err := cs.CallTool(t.Context(), &sdk.CallToolParams{Name: "run_command", Arguments: map[string]any{"command": "echo $$ > started; exec sleep 1000"}})
		if err != nil {
			done <- result{err.Error(), true}
			return
		}
		done <- result{res.Content[0].(*sdk.TextContent).Text, res.IsError}
	}()
	// Opening the FIFO waits for the command to have started.
	pid, err := os.ReadFile(fifo)
	if err != nil {
		t.Fatal(err)
	}
	// The fake backend's processes are the test's own, and outlive it.
	defer func() {
		if n, err := strconv.Atoi(strings.TrimSpace(string(pid))); err == nil {
			syscall.Kill(n, syscall.SIGKILL)
		}
	}()
	inst.Die()
	r := <-done
	if want := "run_command: the sandbox ended under it"; !r.isErr || !strings.HasPrefix(r.text, want) {
		t.Errorf("a call whose sandbox died: %v %q, want %q…", r.isErr, r.text, want)
	}
	ended(t, sb)
	mustCall(t, cs, "list_files", map[string]any{"path": "."})
	if h.only() == sb {
		t.Error("the dead sandbox is still the session's")
	}
}
