package audit

import (
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestTrailIsBoundedAndCountsWhatItDrops(t *testing.T) {
	s, err := Open(t.TempDir(), 1000, time.Hour, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		s.Record("box-1", Event{Kind: "connection", Addr: "203.0.113.10", Port: uint16(i)})
	}
	events, err := s.Read("box-1")
	if err != nil {
		t.Fatal(err)
	}
	last := events[len(events)-1]
	if last.Kind != "dropped" || int(last.Count)+len(events)-1 != 100 {
		t.Fatalf("%d events, last %+v: want the rest counted as dropped", len(events), last)
	}
	fi, _ := os.Stat(filepath.Join(s.dir, "box-1.jsonl"))
	if fi.Size() > 1000 {
		t.Errorf("the trail grew to %d bytes past its bound", fi.Size())
	}
	// A new store on the same directory (a restart) goes on counting.
	again, _ := Open(s.dir, 1000, time.Hour, slog.New(slog.DiscardHandler))
	for range 10 {
		again.Record("box-1", Event{Kind: "api"})
	}
	if fi2, _ := os.Stat(filepath.Join(s.dir, "box-1.jsonl")); fi2.Size() > 1000 {
		t.Errorf("a restart wrote past the bound: %d bytes", fi2.Size())
	}
}

func TestTrailIDsAreNames(t *testing.T) {
	s, _ := Open(t.TempDir(), 0, 0, slog.New(slog.DiscardHandler))
	for _, id := range []string{"", "../x", "a/b", "A", strings.Repeat("a", 200)} {
		s.Record(id, Event{Kind: "api"})
		if _, err := s.Read(id); err != ErrNotFound {
			t.Errorf("id %q: %v, want ErrNotFound", id, err)
		}
	}
	if entries, _ := os.ReadDir(filepath.Dir(s.dir)); len(entries) != 1 {
		t.Errorf("files outside the store: %v", entries)
	}
}

func TestSweepKeepsLivingAndRecentTrails(t *testing.T) {
	s, _ := Open(t.TempDir(), 0, time.Hour, slog.New(slog.DiscardHandler))
	for _, id := range []string{"ended-old", "alive-old", "ended-new"} {
		s.Record(id, Event{Kind: "api"})
	}
	old := time.Now().Add(-2 * time.Hour)
	for _, id := range []string{"ended-old", "alive-old"} {
		os.Chtimes(filepath.Join(s.dir, id+".jsonl"), old, old)
	}
	s.Sweep(func(id string) bool { return id == "alive-old" })
	for id, want := range map[string]bool{"ended-old": false, "alive-old": true, "ended-new": true} {
		if _, err := s.Read(id); (err == nil) != want {
			t.Errorf("%s: kept %v, want %v", id, err == nil, want)
		}
	}
}

func TestProposeNamesWhatWasReached(t *testing.T) {
	events := []Event{
		{Kind: "dns", Name: "pypi.org", Decision: "allowed", Answers: []string{"203.0.113.10"}},
		{Kind: "connection", Addr: "203.0.113.10", Port: 443, Decision: "allowed"},             // named by its lookup
		{Kind: "connection", Name: "files.example", Addr: "203.0.113.11", Decision: "allowed"}, // by its server name
		{Kind: "connection", Addr: "198.51.100.7", Port: 7000, Decision: "allowed"},            // by address
		{Kind: "connection", Addr: "169.254.169.254", Port: 80, Decision: "denied"},            // never proposed
		{Kind: "request", Name: "denied.example", Addr: "203.0.113.20", Decision: "denied"},
		{Kind: "dns", Name: "unused.example", Decision: "allowed", Answers: []string{"203.0.113.99"}}, // looked up only
	}
	got := Propose(events)
	want := Allowlist{AllowOut: []string{"198.51.100.7", "denied.example", "files.example", "pypi.org"}, Denied: []string{"denied.example"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Propose = %+v, want %+v", got, want)
	}
}

func TestOTLPHasARecordAnEvent(t *testing.T) {
	events := []Event{{Time: time.Unix(1, 5), Kind: "connection", Decision: "denied", Port: 443, Rule: "x"}, {Time: time.Unix(2, 0), Kind: "api", Status: 201}}
	logs := OTLP("box", events).(otlpLogs)
	recs := logs.ResourceLogs[0].ScopeLogs[0].LogRecords
	if len(recs) != 2 || recs[0].TimeUnixNano != "1000000005" || recs[0].SeverityText != "WARN" || recs[1].SeverityText != "INFO" {
		t.Fatalf("records %+v", recs)
	}
}
