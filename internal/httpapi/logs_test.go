package httpapi

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/build"
	"github.com/airlock-sandbox/airlock/internal/image"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

type sandboxLogs struct {
	Logs []struct {
		Timestamp time.Time `json:"timestamp"`
		Line      string    `json:"line"`
	} `json:"logs"`
	LogEntries []sandboxLogEntry `json:"logEntries"`
}

// TestSandboxLogs: a sandbox's log (E2B's sandbox logs, the CLI's e2b
// sandbox logs) has its lifecycle and the calls to its agent, each also
// as a JSON line with a level, which the CLI parses; the queries pick by
// time, direction, level, text and number.
func TestSandboxLogs(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	c := a.create(nil)
	a.run(c, "echo hi")
	a.call("POST", "/sandboxes/"+c.SandboxID+"/timeout", map[string]any{"timeout": 600})

	code, data := a.call("GET", "/sandboxes/"+c.SandboxID+"/logs", nil)
	var v1 sandboxLogs
	if code != http.StatusOK || json.Unmarshal(data, &v1) != nil {
		t.Fatalf("logs: %d %s", code, data)
	}
	var msgs []string
	for i, e := range v1.LogEntries {
		msgs = append(msgs, e.Message)
		var line map[string]string
		if err := json.Unmarshal([]byte(v1.Logs[i].Line), &line); err != nil {
			t.Fatalf("line %q: %v", v1.Logs[i].Line, err)
		}
		if line["level"] != e.Level || line["message"] != e.Message || line["logger"] != e.Fields["logger"] || !v1.Logs[i].Timestamp.Equal(e.Timestamp) {
			t.Errorf("line %q of entry %+v", v1.Logs[i].Line, e)
		}
	}
	want := []string{"sandbox created", "sandbox running", "Process start", "timeout set"}
	if fmt.Sprint(msgs) != fmt.Sprint(want) {
		t.Fatalf("log %q, want %q", msgs, want)
	}
	if f := v1.LogEntries[2].Fields; f["logger"] != "gateway" || f["method"] != "POST /process.Process/Start" || f["port"] != "49983" {
		t.Errorf("the process start's fields %v", f)
	}
	// ?start= is a time in ms: from it on.
	last := v1.LogEntries[3].Timestamp.UnixMilli()
	code, data = a.call("GET", "/sandboxes/"+c.SandboxID+"/logs?start="+strconv.FormatInt(last, 10), nil)
	var since sandboxLogs
	if json.Unmarshal(data, &since) != nil || code != 200 || len(since.LogEntries) == 0 || since.LogEntries[len(since.LogEntries)-1].Message != "timeout set" || since.LogEntries[0].Timestamp.UnixMilli() < last {
		t.Errorf("logs from %d: %d %s", last, code, data)
	}

	// v2: newest first, unless forward; level, search and limit.
	v2 := func(query string) []string {
		t.Helper()
		code, data := a.call("GET", "/v2/sandboxes/"+c.SandboxID+"/logs?"+query, nil)
		var out struct {
			Logs []sandboxLogEntry `json:"logs"`
		}
		if code != http.StatusOK || json.Unmarshal(data, &out) != nil {
			t.Fatalf("v2 logs ?%s: %d %s", query, code, data)
		}
		var msgs []string
		for _, e := range out.Logs {
			msgs = append(msgs, e.Message)
		}
		return msgs
	}
	for query, want := range map[string][]string{
		"":                           {"timeout set", "Process start", "sandbox running", "sandbox created"},
		"limit=2":                    {"timeout set", "Process start"},
		"direction=forward&limit=1":  {"sandbox created"},
		"search=sandbox":             {"sandbox running", "sandbox created"},
		"level=warn":                 nil,
		"cursor=0":                   nil,
		"cursor=0&direction=forward": {"sandbox created", "sandbox running", "Process start", "timeout set"},
	} {
		if got := v2(query); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("v2 ?%s: %q, want %q", query, got, want)
		}
	}
	for _, query := range []string{"level=fatal", "direction=up", "limit=1001", "cursor=-1"} {
		if code, data := a.call("GET", "/v2/sandboxes/"+c.SandboxID+"/logs?"+query, nil); code != http.StatusBadRequest {
			t.Errorf("v2 ?%s: %d %s, want 400", query, code, data)
		}
	}
	if code, data := a.call("GET", "/sandboxes/inope/logs", nil); code != http.StatusNotFound {
		t.Errorf("logs of no sandbox: %d %s", code, data)
	}
}

// failingBuild is a build whose image no registry has: it ends at once,
// failed, with a log.
func failingBuild(t *testing.T, a *api) *build.Build {
	t.Helper()
	dir := t.TempDir()
	store, err := image.Open(filepath.Join(dir, "images"), image.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	files, err := build.OpenFiles(filepath.Join(dir, "uploads"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	svc := &build.Service{Builder: &build.Builder{Store: store, Registries: noRegistry{}},
		Log: slog.New(slog.DiscardHandler), Timeout: 10 * time.Second, Parallel: 1}
	t.Cleanup(svc.Shutdown)
	a.s.HandleTemplates(&Templates{Builds: svc, Store: store, Files: files})
	b, err := svc.Request("app", []string{"default"}, image.Resources{})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Start(b, &build.Request{FromImage: "registry.test/app:1"}); err != nil {
		t.Fatal(err)
	}
	for b.Status(0).Status != "error" {
		select {
		case <-t.Context().Done():
			t.Fatal("the build never failed")
		case <-time.After(10 * time.Millisecond):
		}
	}
	return b
}

// TestBuildLogs: a build's status pages its log (limit, level, offset
// counting what the level keeps), and its logs route picks by direction
// and level, as E2B's.
func TestBuildLogs(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	b := failingBuild(t, a)
	all := b.Log()
	if len(all) < 2 || all[len(all)-1].Level != "error" {
		t.Fatalf("the build's log %+v: want entries, an error last", all)
	}
	status := func(query string) build.Status {
		t.Helper()
		code, data := a.call("GET", "/templates/app/builds/"+b.BuildID+"/status?"+query, nil)
		var st build.Status
		if code != http.StatusOK || json.Unmarshal(data, &st) != nil {
			t.Fatalf("status ?%s: %d %s", query, code, data)
		}
		if len(st.Logs) != len(st.LogEntries) {
			t.Errorf("status ?%s: %d lines for %d entries", query, len(st.Logs), len(st.LogEntries))
		}
		return st
	}
	if st := status(""); len(st.LogEntries) != len(all) || st.Status != "error" || st.Reason == nil {
		t.Errorf("status: %+v, want the whole log and why it failed", st)
	}
	if st := status("limit=1&logsOffset=1"); len(st.LogEntries) != 1 || st.LogEntries[0] != all[1] {
		t.Errorf("status from 1, 1 entry: %+v", st.LogEntries)
	}
	if st := status("level=error"); len(st.LogEntries) != 1 || st.LogEntries[0] != all[len(all)-1] {
		t.Errorf("status of errors: %+v", st.LogEntries)
	}
	if st := status("level=error&logsOffset=1"); len(st.LogEntries) != 0 {
		t.Errorf("status of errors from the second: %+v", st.LogEntries)
	}
	for _, q := range []string{"limit=101", "level=trace", "logsOffset=-1"} {
		if code, data := a.call("GET", "/templates/app/builds/"+b.BuildID+"/status?"+q, nil); code != http.StatusBadRequest {
			t.Errorf("status ?%s: %d %s, want 400", q, code, data)
		}
	}

	logs := func(query string) []build.LogEntry {
		t.Helper()
		code, data := a.call("GET", "/templates/app/builds/"+b.BuildID+"/logs?"+query, nil)
		var out struct {
			Logs []build.LogEntry `json:"logs"`
		}
		if code != http.StatusOK || json.Unmarshal(data, &out) != nil {
			t.Fatalf("logs ?%s: %d %s", query, code, data)
		}
		return out.Logs
	}
	if got := logs("source=persistent"); fmt.Sprint(got) != fmt.Sprint(all) {
		t.Errorf("logs: %+v, want %+v", got, all)
	}
	if got := logs("direction=backward&limit=1"); len(got) != 1 || got[0] != all[len(all)-1] {
		t.Errorf("the last entry: %+v", got)
	}
	end := all[len(all)-1].Timestamp.UnixMilli()
	if got := logs("cursor=" + strconv.FormatInt(end+1, 10)); len(got) != 0 {
		t.Errorf("logs after the last: %+v", got)
	}
	if code, _ := a.call("GET", "/templates/app/builds/nope/logs", nil); code != http.StatusNotFound {
		t.Errorf("logs of no build: %d, want 404", code)
	}
	if code, _ := a.call("GET", "/templates/app/builds/"+b.BuildID+"/logs?source=elsewhere", nil); code != http.StatusBadRequest {
		t.Errorf("logs of an unknown source: %d, want 400", code)
	}
}
