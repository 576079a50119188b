// Package audit keeps each sandbox's audit trail: every egress decision
// its network's proxy and resolver made (what it asked for, what it was
// told, by which rule, how much went each way) and every action of the
// API on it (who, what, result). A trail is a file of JSON lines in the
// store's directory, written as events happen, kept while its sandbox
// lives and for a retention time after; it is bounded, so a sandbox that
// opens connections without end fills its own trail and then only counts
// what it could not write.
package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Event is one line of a trail. Kind says which fields it has.
type Event struct {
	Time time.Time `json:"time"`
	// Kind: "connection" (a TCP connection the proxy decided), "request"
	// (an HTTP request on one, plain or intercepted), "dns" (a lookup
	// the resolver decided), "api" (an action of the API), "budget" (the
	// sandbox's egress ended by its budget), "dropped" (events the full
	// trail could not hold; only when read).
	Kind string `json:"kind"`

	// Egress: the protocol (tcp, http, https, dns), the name the sandbox
	// asked for (a DNS question, a TLS server name or an HTTP Host),
	// where it went, and the decision with the rule that made it.
	Proto       string `json:"proto,omitempty"`
	Name        string `json:"name,omitempty"`
	Addr        string `json:"addr,omitempty"`
	Port        uint16 `json:"port,omitempty"`
	Decision    string `json:"decision,omitempty"` // allowed, denied
	Rule        string `json:"rule,omitempty"`
	Intercepted bool   `json:"intercepted,omitempty"` // the request rules applied
	// Sent and Received count what went out of the sandbox and came
	// back, in bytes; Millis is how long the connection or request took.
	Sent     int64   `json:"sent,omitempty"`
	Received int64   `json:"received,omitempty"`
	Millis   float64 `json:"ms,omitempty"`
	Status   int     `json:"status,omitempty"` // an HTTP request's or the API's answer
	// Answers are the addresses a DNS lookup was answered with.
	Answers []string `json:"answers,omitempty"`

	// API: who (the key's fingerprint and the client's address) did
	// what (the route) with which result (Status).
	Actor  string `json:"actor,omitempty"`
	Action string `json:"action,omitempty"`

	Count int64 `json:"count,omitempty"` // "dropped": how many
}

// Store is the trails of a daemon's sandboxes.
type Store struct {
	dir       string
	maxBytes  int64
	retention time.Duration
	log       *slog.Logger

	mu     sync.Mutex
	trails map[string]*trail
}

// trail is one sandbox's, while this process writes it.
type trail struct {
	mu      sync.Mutex
	size    int64 // of its file
	dropped int64
}

// Defaults: a trail of 4 MiB holds some 20,000 events; one is kept a day
// after its sandbox ends.
const (
	DefaultMaxBytes  = 4 << 20
	DefaultRetention = 24 * time.Hour
)

// Open returns the store of dir (made 0700), whose trails hold at most
// maxBytes each and are kept retention after they were last written,
// once their sandbox is gone (Sweep).
func Open(dir string, maxBytes int64, retention time.Duration, log *slog.Logger) (*Store, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	if retention <= 0 {
		retention = DefaultRetention
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit trails: %w", err)
	}
	return &Store{dir: dir, maxBytes: maxBytes, retention: retention, log: log, trails: map[string]*trail{}}, nil
}

// validID: a trail's id becomes a file name.
func validID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

func (s *Store) path(id string) string { return filepath.Join(s.dir, id+".jsonl") }

func (s *Store) trail(id string) *trail {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.trails[id]
	if !ok {
		t = &trail{}
		if fi, err := os.Stat(s.path(id)); err == nil {
			t.size = fi.Size() // a trail an earlier daemon began
		}
		s.trails[id] = t
	}
	return t
}

// Record appends e to sandbox id's trail, stamped now if it has no time.
// A full trail counts it as dropped.
func (s *Store) Record(id string, e Event) {
	if s == nil || !validID(id) {
		return
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	e.Time = e.Time.UTC()
	line, err := json.Marshal(e)
	if err != nil {
		return
	}
	line = append(line, '\n')
	t := s.trail(id)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.size+int64(len(line)) > s.maxBytes {
		t.dropped++
		return
	}
	// O_NOFOLLOW: the directory is the daemon's, but a trail is never
	// anything but the regular file this made.
	f, err := os.OpenFile(s.path(id), os.O_WRONLY|os.O_APPEND|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		s.log.Warn("audit trail", "sandbox", id, "err", err)
		return
	}
	defer f.Close()
	n, err := f.Write(line)
	t.size += int64(n)
	if err != nil {
		s.log.Warn("audit trail", "sandbox", id, "err", err)
	}
}

// ErrNotFound: no trail of that id (never written, or swept).
var ErrNotFound = errors.New("no audit trail for that sandbox")

// Read returns sandbox id's trail, ending with a "dropped" event if the
// full trail could not hold some.
func (s *Store) Read(id string) ([]Event, error) {
	if !validID(id) {
		return nil, ErrNotFound
	}
	f, err := os.OpenFile(s.path(id), os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if os.IsNotExist(err) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var events []Event
	r := bufio.NewReader(io.LimitReader(f, s.maxBytes+1))
	for {
		line, err := r.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 && err == nil {
			var e Event
			if json.Unmarshal(line, &e) == nil {
				events = append(events, e)
			}
		}
		if err != nil {
			break // a last line cut short by a crash is left out
		}
	}
	s.mu.Lock()
	t := s.trails[id]
	s.mu.Unlock()
	if t != nil {
		t.mu.Lock()
		if t.dropped > 0 {
			events = append(events, Event{Time: time.Now().UTC(), Kind: "dropped", Count: t.dropped})
		}
		t.mu.Unlock()
	}
	return events, nil
}

// Sweep removes the trails last written more than the retention time
// ago whose sandbox alive does not know: an ended sandbox's trail is kept
// that long, a living one's as long as it lives.
func (s *Store) Sweep(alive func(id string) bool) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".jsonl")
		if !ok || !validID(id) {
			continue
		}
		fi, err := e.Info()
		if err != nil || time.Since(fi.ModTime()) < s.retention || alive(id) {
			continue
		}
		s.mu.Lock()
		delete(s.trails, id)
		s.mu.Unlock()
		if err := os.Remove(s.path(id)); err != nil && !os.IsNotExist(err) {
			s.log.Warn("audit trail sweep", "sandbox", id, "err", err)
		}
	}
}

// Retention is how long a trail outlives its sandbox.
func (s *Store) Retention() time.Duration { return s.retention }
