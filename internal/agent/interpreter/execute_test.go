package interpreter

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agent/jupyter"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// TestExecuteRefused: what is not an execution the interpreter can run
// is refused before any kernel starts.
func TestExecuteRefused(t *testing.T) {
	_, url, _ := newService(t)
	for _, tc := range []struct {
		name string
		body string
		want int
	}{
		{"not JSON", "{", http.StatusBadRequest},
		{"both a context and a language", `{"code":"1","context_id":"x","language":"python"}`, http.StatusBadRequest},
		{"an unknown context", `{"code":"1","context_id":"nope"}`, http.StatusNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := http.Post(url+agentproto.ExecutePath, "application/json", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var e struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if json.NewDecoder(resp.Body).Decode(&e); resp.StatusCode != tc.want || e.Code != tc.want || e.Message == "" {
				t.Errorf("got %d %+v, want %d with {code, message}", resp.StatusCode, e, tc.want)
			}
		})
	}
}

// TestExecuteWithoutAKernel: a language unknown, or without a kernel
// here, is the execution's error, in the stream (the SDKs show an HTTP
// error's status, not its message).
func TestExecuteWithoutAKernel(t *testing.T) {
	_, url, _ := newService(t)
	for language, want := range map[string]string{
		"cobol": `unknown language "cobol": bash, java, javascript, python, r, typescript`,
		"java":  "no Jupyter kernel for java is installed",
	} {
		if language == "java" {
			if _, err := jupyter.FindSpec(languages["java"].kernels...); err == nil {
				continue // installed here
			}
		}
		lines := execute(t, url, agentproto.ExecuteRequest{Code: "1", Language: language})
		if !slices.Equal(kinds(lines), []string{"error", "end_of_execution"}) || lines[0].Name != "KernelError" || lines[0].Value != want {
			t.Errorf("%s: %+v, want the KernelError %q", language, lines, want)
		}
	}
}

// TestExecute: a cell's stdout, its number, its value, a display and an
// error, in the order the kernel produced them, then the end.
func TestExecute(t *testing.T) {
	needKernel(t, "python")
	_, url, _ := newService(t)
	lines := execute(t, url, agentproto.ExecuteRequest{Code: "print('héllo')\n6*7"})
	if got := kinds(lines); !slices.Equal(got, []string{"number_of_executions", "stdout", "result", "end_of_execution"}) {
		t.Fatalf("lines %v", got)
	}
	if out, res := text(lines); out != "héllo\n" || res != "42" || lines[0].ExecutionCount != 1 {
		t.Errorf("stdout %q, result %q, count %d", out, res, lines[0].ExecutionCount)
	}
	// The default context keeps its state.
	lines = execute(t, url, agentproto.ExecuteRequest{Code: "x = 5\nfrom IPython.display import display, HTML\ndisplay(HTML('<b>x</b>'))\nx", Language: "python"})
	var display *agentproto.ExecuteLine
	for i := range lines {
		if lines[i].Type == "result" && !lines[i].IsMainResult {
			display = &lines[i]
		}
	}
	if display == nil || display.HTML != "<b>x</b>" {
		t.Errorf("the display: %+v", lines)
	}
	if _, res := text(lines); res != "5" {
		t.Errorf("result %q, want 5", res)
	}
	lines = execute(t, url, agentproto.ExecuteRequest{Code: "1/0\n1/0"})
	e := errorOf(lines)
	if e == nil || e.Name != "ZeroDivisionError" || !strings.Contains(e.Traceback, "ZeroDivisionError") || kinds(lines)[len(lines)-1] != "end_of_execution" {
		t.Errorf("an error: %+v", lines)
	}
}

// TestExecuteEnvVars: an execution's envs are the kernel's for that
// execution only; an unsupported one is refused.
func TestExecuteEnvVars(t *testing.T) {
	needKernel(t, "python")
	_, url, _ := newService(t)
	code := "import os\nprint(os.environ.get('AIRLOCK_T', 'unset'))"
	lines := execute(t, url, agentproto.ExecuteRequest{Code: code, EnvVars: map[string]string{"AIRLOCK_T": "it's \"set\"\n"}})
	if out, _ := text(lines); out != "it's \"set\"\n\n" {
		t.Errorf("with envs: %q", out)
	}
	if out, _ := text(execute(t, url, agentproto.ExecuteRequest{Code: code})); out != "unset\n" {
		t.Errorf("after: %q, want the env gone", out)
	}
}

// TestExecuteKernelDied: a kernel that dies mid-cell is reported, and the
// next execution has a new one.
func TestExecuteKernelDied(t *testing.T) {
	needKernel(t, "python")
	_, url, _ := newService(t)
	execute(t, url, agentproto.ExecuteRequest{Code: "x = 1"})
	lines := execute(t, url, agentproto.ExecuteRequest{Code: "import os\nos._exit(1)"})
	if e := errorOf(lines); e == nil || e.Name != "KernelDied" || kinds(lines)[len(lines)-1] != "end_of_execution" {
		t.Fatalf("got %+v, want KernelDied", lines)
	}
	lines = execute(t, url, agentproto.ExecuteRequest{Code: "'x' in globals()"})
	if _, res := text(lines); res != "False" {
		t.Errorf("after a new kernel: %+v, want its state fresh", lines)
	}
}

// TestExecuteInterrupted: a client that gives up stops its cell (an
// interrupt), and the context runs the next one; a kernel that ignores
// interrupts is replaced, which the next execution reports.
func TestExecuteInterrupted(t *testing.T) {
	needKernel(t, "python")
	_, url, _ := newService(t)
	execute(t, url, agentproto.ExecuteRequest{Code: "kept = 1"})
	giveUp := func(code string) {
		t.Helper()
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		body, _ := json.Marshal(agentproto.ExecuteRequest{Code: code})
		req, _ := http.NewRequestWithContext(ctx, "POST", url+agentproto.ExecutePath, bytes.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		// Given up once the cell runs: an interrupt as it starts is
		// ipykernel's to ignore.
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() && !strings.Contains(sc.Text(), "running") {
		}
	}
	giveUp("import time\nprint('running', flush=True)\ntime.sleep(60)")
	if _, res := text(execute(t, url, agentproto.ExecuteRequest{Code: "kept"})); res != "1" {
		t.Errorf("after an interrupt, the state: %q, want it kept", res)
	}
	giveUp("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('running', flush=True)\ntime.sleep(60)")
	lines := execute(t, url, agentproto.ExecuteRequest{Code: "'kept' in globals()"})
	if len(lines) == 0 || lines[0].Type != "stderr" || !strings.Contains(lines[0].Text, "its state is lost") {
		t.Errorf("after a replaced kernel: %+v, want the loss reported first", kinds(lines))
	}
	if _, res := text(lines); res != "False" {
		t.Errorf("after a replaced kernel, the state: %q", res)
	}
}

// TestLinesOneError: only an execution's first error is written.
func TestLinesOneError(t *testing.T) {
	w := httptest.NewRecorder()
	l := newLines(w)
	l.write(map[string]any{"type": "error", "name": "A"})
	l.write(map[string]any{"type": "stdout", "text": "x"})
	l.write(map[string]any{"type": "error", "name": "B"})
	if got := strings.Count(w.Body.String(), `"error"`); got != 1 || !strings.Contains(w.Body.String(), `"A"`) {
		t.Errorf("got %s, want A's error alone", w.Body)
	}
}

// TestLinesReplyErrorLast: a reply's error that names nothing does not
// stand for the error the kernel publishes after it (sockets apart: in
// either order); it is written at the end if none came.
func TestLinesReplyErrorLast(t *testing.T) {
	reply := jupyter.Output{Type: "execute_reply", Content: json.RawMessage(`{"status":"error"}`)}
	published := jupyter.Output{Type: "error", Content: json.RawMessage(`{"ename":"TypeError","evalue":"boom","traceback":["TypeError: boom"]}`)}
	for _, order := range [][]jupyter.Output{{reply, published}, {published, reply}, {reply}} {
		w := httptest.NewRecorder()
		l := newLines(w)
		for _, o := range order {
			l.output(o)
		}
		l.end()
		body := w.Body.String()
		want := `"name":"TypeError"`
		if len(order) == 1 {
			want = `"name":""`
		}
		if strings.Count(body, `"type":"error"`) != 1 || !strings.Contains(body, want) || !strings.HasSuffix(body, `{"type":"end_of_execution"}`+"\n") {
			t.Errorf("%d outputs: got %s, want one error with %s, then the end", len(order), body, want)
		}
	}
}

// TestLinesKeepalive: a keepalive every interval until stopped.
func TestLinesKeepalive(t *testing.T) {
	w := httptest.NewRecorder()
	l := newLines(w)
	l.interval = time.Millisecond
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { l.keepalive(stop); close(done) }()
	for {
		l.mu.Lock()
		n := strings.Count(w.Body.String(), "keepalive")
		l.mu.Unlock()
		if n >= 2 {
			break
		}
	}
	close(stop)
	<-done
}
