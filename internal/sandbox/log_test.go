package sandbox

import (
	"fmt"
	"testing"
	"time"
)

// TestSandboxLog: a sandbox's log has its lifecycle, each entry with the
// operation that made it, in order (the fake backend saves a paused
// sandbox to disk); it keeps the latest entries.
func TestSandboxLog(t *testing.T) {
	m, _ := newManager(t, Config{}, 0)
	sb := create(t, m, CreateRequest{TemplateID: "base"})
	if err := m.SetTTL(sb.ID, 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := m.Pause(t.Context(), sb.ID, true); err != nil {
		t.Fatal(err)
	}
	if err := m.Resume(t.Context(), sb.ID, 0); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range sb.Logs() {
		if e.Level != "info" || e.Logger != "sandbox" || e.At.IsZero() {
			t.Errorf("entry %+v: want an info of the sandbox's, timed", e)
		}
		got = append(got, e.Message+" ("+e.Fields["operation"]+")")
	}
	want := []string{"sandbox created ()", "sandbox running (create)", "timeout set ()", "sandbox pausing (pause)",
		"sandbox saved (pause)", "sandbox resuming (resume)", "sandbox running (resume)"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("log %q, want %q", got, want)
	}
	if l := sb.Logs(); l[0].Fields["template"] != "base" || l[0].Fields["backend"] != "fake" {
		t.Errorf("the create's entry %+v: want its template and backend", l[0])
	}

	// The log keeps its latest maxLogEntries entries.
	for i := range maxLogEntries + 5 {
		sb.Log("debug", "gateway", fmt.Sprint(i))
	}
	l := sb.Logs()
	if len(l) != maxLogEntries || l[0].Message != "5" || l[len(l)-1].Message != fmt.Sprint(maxLogEntries+4) {
		t.Errorf("%d entries from %q to %q, want the last %d", len(l), l[0].Message, l[len(l)-1].Message, maxLogEntries)
	}
	// What Logs returns is a copy.
	l[0].Fields["x"] = "y"
	if sb.Logs()[0].Fields["x"] != "" {
		t.Error("Logs shares its fields with the log")
	}
}
