package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// TestListTools: every tool is listed with a description and the
// arguments it requires, and a call without them is refused in one line
// that names them.
func TestListTools(t *testing.T) {
	h := newHarness(t, sandbox.Config{})
	cs := h.connect("s", nil)
	if got := cs.InitializeResult().Instructions; !strings.Contains(got, "run_code keeps state") {
		t.Errorf("instructions: %q", got)
	}
	res, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	required := map[string][]string{}
	for _, tool := range res.Tools {
		if tool.Description == "" {
			t.Errorf("%s has no description", tool.Name)
		}
		schema, _ := tool.InputSchema.(map[string]any)
		for _, r := range asSlice(schema["required"]) {
			required[tool.Name] = append(required[tool.Name], r.(string))
		}
		if _, ok := required[tool.Name]; !ok {
			required[tool.Name] = []string{}
		}
	}
	want := map[string][]string{
		"run_code": {"code"}, "run_command": {"command"}, "read_file": {"path"},
		"write_file": {"path", "content"}, "list_files": {"path"},
		"create_sandbox": {}, "kill_sandbox": {}, "list_sandboxes": {},
	}
	for name, args := range want {
		got, ok := required[name]
		slices.Sort(got)
		slices.Sort(args)
		if !ok || !slices.Equal(got, args) {
			t.Errorf("tool %s requires %v (listed: %v), want %v", name, got, ok, args)
		}
	}
	if len(required) != len(want) {
		t.Errorf("tools listed: %v, want those of %v", required, want)
	}
	text, isErr := call(t, cs, "write_file", map[string]any{"path": "a"})
	if !isErr || !strings.Contains(text, "content") || strings.Contains(text, "\n") {
		t.Errorf("write_file without content: %v %q, want one line naming it", isErr, text)
	}
	if n := len(h.m.List(nil)); n != 0 {
		t.Errorf("listing tools and a refused call started %d sandboxes", n)
	}
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}

func TestRunCommand(t *testing.T) {
	h := newHarness(t, sandbox.Config{})
	cs := h.connect("s", nil)
	for _, tc := range []struct {
		args  map[string]any
		want  string
		isErr bool
	}{
		{map[string]any{"command": "echo out; echo err >&2"}, "exit code 0\nstdout:\nout\n\nstderr:\nerr\n", false},
		{map[string]any{"command": "echo x; exit 3"}, "exit code 3\nstdout:\nx\n\nstderr:\n", true},
		{map[string]any{"command": "kill -9 $$"}, "exit code -1 (signal: killed; the sandbox's memory limit is the usual cause)\nstdout:\n\nstderr:\n", true},
		{map[string]any{"command": "kill -TERM $$"}, "exit code -1 (signal: terminated)\nstdout:\n\nstderr:\n", true},
		{map[string]any{"command": ""}, "command is empty", true},
		{map[string]any{"command": "true", "timeout_seconds": -1}, "timeout_seconds must be between 1 and 86400", true},
		{map[string]any{"command": "true", "timeout_seconds": 86401}, "timeout_seconds must be between 1 and 86400", true},
	} {
		text, isErr := call(t, cs, "run_command", tc.args)
		if text != tc.want || isErr != tc.isErr {
			t.Errorf("run_command %v: %v %q, want %v %q", tc.args, isErr, text, tc.isErr, tc.want)
		}
	}
	// Commands run in the sandbox user's home, one sandbox for them all.
	home := h.b.Instances()[0].Home()
	if got := mustCall(t, cs, "run_command", map[string]any{"command": "pwd"}); got != "exit code 0\nstdout:\n"+home+"\n\nstderr:\n" {
		t.Errorf("pwd: %q, want %s", got, home)
	}
	if n := h.b.Starts(); n != 1 {
		t.Errorf("%d sandboxes started for one session, want 1", n)
	}
}

// TestRunCommandBackground: a background command is still running when
// the call returns with its pid.
func TestRunCommandBackground(t *testing.T) {
	h := newHarness(t, sandbox.Config{})
	cs := h.connect("s", nil)
	text := mustCall(t, cs, "run_command", map[string]any{"command": "exec sleep 1000", "background": true})
	var pid int
	if _, err := fmt.Sscanf(text, "started in the background, pid %d", &pid); err != nil || pid <= 0 {
		t.Fatalf("background: %q", text)
	}
	// The fake backend's processes are the test's own: end it here.
	defer syscall.Kill(pid, syscall.SIGKILL)
	if err := syscall.Kill(pid, 0); err != nil {
		t.Errorf("the background command is not running after the call: %v", err)
	}
}

// TestRunCommandTimeout: a command past its timeout is reported as such.
func TestRunCommandTimeout(t *testing.T) {
	h := newHarness(t, sandbox.Config{})
	cs := h.connect("s", nil)
	text, isErr := call(t, cs, "run_command", map[string]any{"command": "exec sleep 1000", "timeout_seconds": 1})
	if !isErr || text != "the command did not finish within 1s" {
		t.Errorf("past its timeout: %v %q", isErr, text)
	}
}

func TestFiles(t *testing.T) {
	h := newHarness(t, sandbox.Config{})
	cs := h.connect("s", nil)
	if got := mustCall(t, cs, "write_file", map[string]any{"path": "dir/a.txt", "content": "héllo"}); got != "wrote 6 bytes to dir/a.txt" {
		t.Errorf("write_file: %q", got)
	}
	home := h.b.Instances()[0].Home()
	if data, err := os.ReadFile(filepath.Join(home, "dir/a.txt")); err != nil || string(data) != "héllo" {
		t.Errorf("the file written: %q %v", data, err)
	}
	if got := mustCall(t, cs, "read_file", map[string]any{"path": "dir/a.txt"}); got != "héllo" {
		t.Errorf("read_file: %q", got)
	}
	if got := mustCall(t, cs, "list_files", map[string]any{"path": "dir"}); got != "file\t6\t"+home+"/dir/a.txt\n" {
		t.Errorf("list_files: %q", got)
	}
	os.MkdirAll(filepath.Join(home, "dir/sub/deeper"), 0o755)
	if got := mustCall(t, cs, "list_files", map[string]any{"path": "dir", "depth": 2}); !strings.Contains(got, "dir\t") || !strings.Contains(got, "/dir/sub/deeper\n") {
		t.Errorf("list_files to depth 2: %q", got)
	}
	os.Mkdir(filepath.Join(home, "empty"), 0o755)
	if got := mustCall(t, cs, "list_files", map[string]any{"path": "empty"}); got != "(empty)" {
		t.Errorf("an empty directory: %q", got)
	}
	for _, tool := range []string{"read_file", "list_files"} {
		text, isErr := call(t, cs, tool, map[string]any{"path": "nope"})
		if want := tool + ": path '" + home + "/nope' does not exist"; !isErr || text != want {
			t.Errorf("%s of a missing path: %v %q, want %q", tool, isErr, text, want)
		}
	}
}

// TestReadFileKinds: text as text (cut at a limit, and never in the
// middle of a character), images as images, other binary files only
// described.
func TestReadFileKinds(t *testing.T) {
	h := newHarness(t, sandbox.Config{})
	cs := h.connect("s", nil)
	mustCall(t, cs, "list_files", map[string]any{"path": "."}) // starts the sandbox
	home := h.b.Instances()[0].Home()
	png := onePixelPNG(t)
	long := strings.Repeat("a", maxFile-1) + "€ and more"
	for name, data := range map[string][]byte{"img.png": png, "blob.bin": {0x80, 0x81, 0x82, 0x00}, "long.txt": []byte(long)} {
		if err := os.WriteFile(filepath.Join(home, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	res := callResult(t, cs, "read_file", map[string]any{"path": "img.png"})
	if img, ok := res.Content[0].(*sdk.ImageContent); !ok || img.MIMEType != "image/png" || !bytes.Equal(img.Data, png) {
		t.Errorf("an image: %#v", res.Content[0])
	}
	if got := mustCall(t, cs, "read_file", map[string]any{"path": "blob.bin"}); got != "blob.bin is a binary file (application/octet-stream): not shown. Inspect it with run_code or run_command." {
		t.Errorf("a binary file: %q", got)
	}
	got := mustCall(t, cs, "read_file", map[string]any{"path": "long.txt"})
	if want := strings.Repeat("a", maxFile-1) + fmt.Sprintf("\n[file truncated at %d bytes]", maxFile); got != want {
		t.Errorf("a long file: %d bytes ending %q", len(got), got[max(0, len(got)-40):])
	}
}

// onePixelPNG is a valid 1×1 PNG.
func onePixelPNG(t *testing.T) []byte {
	t.Helper()
	data, err := base64.StdEncoding.DecodeString("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// requiresKernel skips t where the code interpreter's Python kernel is
// missing: the fake backend's agent starts it on the host.
func requiresKernel(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/usr/share/jupyter/kernels/python3/kernel.json"); err != nil {
		t.Skip("no Python Jupyter kernel on this host (make deps installs python3-ipykernel)")
	}
}

func TestRunCode(t *testing.T) {
	requiresKernel(t)
	h := newHarness(t, sandbox.Config{})
	cs := h.connect("s", nil)
	res := callResult(t, cs, "run_code", map[string]any{"code": fmt.Sprintf(
		"from IPython.display import Image\nImage(data=__import__('base64').b64decode(%q))", base64.StdEncoding.EncodeToString(onePixelPNG(t)))})
	if len(res.Content) != 1 {
		t.Fatalf("an image result: %d blocks", len(res.Content))
	}
	if img, ok := res.Content[0].(*sdk.ImageContent); !ok || img.MIMEType != "image/png" || !bytes.Equal(img.Data, onePixelPNG(t)) {
		t.Errorf("an image result: %#v", res.Content[0])
	}
	// The error last: ipykernel aborts the executions it receives just
	// after one that failed.
	for _, tc := range []struct {
		args  map[string]any
		want  string
		isErr bool
	}{
		// State is kept between calls: a Jupyter kernel.
		{map[string]any{"code": "x = 21"}, "(no output)", false},
		{map[string]any{"code": "print(x * 2)\nx"}, "stdout:\n42\n\n21", false},
		{map[string]any{"code": "import sys; print('e', file=sys.stderr)"}, "stderr:\ne\n", false},
		{map[string]any{"code": "from IPython.display import HTML, Markdown\ndisplay(Markdown('*m*'))\nHTML('<b>h</b>')"}, "*m*\n<b>h</b>", false},
		// Tracebacks come without ANSI colours.
		{map[string]any{"code": "1/0"}, "ZeroDivisionError: division by zero\n", true},
		{map[string]any{"code": "1", "language": "cobol"}, `KernelError: unknown language "cobol": bash, java, javascript, python, r, typescript` + "\n", true},
		{map[string]any{"code": "1", "timeout_seconds": -1}, "timeout_seconds must be between 1 and 86400", true},
	} {
		text, isErr := call(t, cs, "run_code", tc.args)
		if isErr != tc.isErr || !strings.HasPrefix(text, tc.want) || strings.Contains(text, "\x1b[") {
			t.Errorf("run_code %v: %v %q, want %v %q", tc.args, isErr, text, tc.isErr, tc.want)
		}
	}
}

// TestRunCodeTimeout: a cell past its timeout is interrupted; what it
// printed is shown, and the kernel keeps its state.
func TestRunCodeTimeout(t *testing.T) {
	requiresKernel(t)
	h := newHarness(t, sandbox.Config{})
	cs := h.connect("s", nil)
	// The kernel's start is not the cell's time.
	mustCall(t, cs, "run_code", map[string]any{"code": "y = 7"})
	text, isErr := call(t, cs, "run_code", map[string]any{"code": "print('before', flush=True)\nimport time\ntime.sleep(1000)", "timeout_seconds": 1})
	if want := "stdout:\nbefore\n\nthe cell did not finish within 1s and was interrupted; variables defined before are kept"; !isErr || text != want {
		t.Errorf("past its timeout: %v %q, want %q", isErr, text, want)
	}
	if got := mustCall(t, cs, "run_code", map[string]any{"code": "y"}); got != "7" {
		t.Errorf("after the interrupt: %q, want 7", got)
	}
}

// TestRunCodeProgress: a client that asks for progress sees the cell's
// output before its result.
func TestRunCodeProgress(t *testing.T) {
	requiresKernel(t)
	h := newHarness(t, sandbox.Config{})
	got := make(chan string, 16)
	cs := h.connect("s", &sdk.ClientOptions{ProgressNotificationHandler: func(_ context.Context, req *sdk.ProgressNotificationClientRequest) {
		if req.Params.ProgressToken == "tok" {
			got <- req.Params.Message
		}
	}})
	params := &sdk.CallToolParams{Name: "run_code", Arguments: map[string]any{"code": "print('working')"}}
	params.SetProgressToken("tok")
	if _, err := cs.CallTool(t.Context(), params); err != nil {
		t.Fatal(err)
	}
	select {
	case msg := <-got:
		if msg != "working\n" {
			t.Errorf("progress message %q, want the cell's output", msg)
		}
	case <-t.Context().Done():
		t.Fatal("no progress notification")
	}
}
