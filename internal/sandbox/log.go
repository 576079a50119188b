package sandbox

import (
	"maps"
	"slices"
	"sync"
	"time"
)

// A sandbox's log is what E2B's sandbox logs are for its users (there,
// envd's log): what happened to the sandbox and what its agent was asked,
// one entry each, for the client that owns it (GET
// /sandboxes/{id}/logs). It never holds what the sandbox's processes
// wrote, nor request bodies: those are the client's to read through the
// agent. It lives as long as the sandbox and keeps its last maxLogEntries
// entries.

// LogEntry is one entry of a sandbox's log.
type LogEntry struct {
	At      time.Time
	Level   string // debug, info, warn or error, as E2B's levels
	Logger  string // what wrote it: "sandbox" (its lifecycle) or "gateway" (requests to its agent)
	Message string
	Fields  map[string]string
}

// maxLogEntries bounds a sandbox's log; older entries give way.
const maxLogEntries = 1000

// eventLog is a sandbox's log: a ring of its latest entries, with a lock
// of its own, as entries are added with the sandbox's lock held
// (transition) and without it (the gateway).
type eventLog struct {
	mu      sync.Mutex
	entries []LogEntry // oldest first
}

func (l *eventLog) add(e LogEntry) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.entries) >= maxLogEntries {
		l.entries = slices.Delete(l.entries, 0, len(l.entries)-maxLogEntries+1)
	}
	l.entries = append(l.entries, e)
}

// Log adds an entry to s's log, with fields given as key, value pairs.
func (s *Sandbox) Log(level, logger, msg string, kv ...string) {
	now := time.Now()
	if s.clock != nil {
		now = s.clock.Now()
	}
	e := LogEntry{At: now.UTC(), Level: level, Logger: logger, Message: msg, Fields: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		e.Fields[kv[i]] = kv[i+1]
	}
	s.log.add(e)
}

// Logs returns s's log, oldest first.
func (s *Sandbox) Logs() []LogEntry {
	s.log.mu.Lock()
	defer s.log.mu.Unlock()
	out := slices.Clone(s.log.entries)
	for i := range out {
		out[i].Fields = maps.Clone(out[i].Fields)
	}
	return out
}
