package filesystem

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"sync"

	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// Watchers a client polls (CreateWatcher, GetWatcherEvents,
// RemoveWatcher): the events of each are kept until the next poll.

// maxPolledEvents bounds what a polling watcher keeps between two polls.
const maxPolledEvents = 10_000

type polledWatcher struct {
	w      *watcher
	mu     sync.Mutex
	events []filesystemEvent
	// added has a value after an event was kept: for tests, which wait
	// for one rather than poll the clock.
	added chan struct{}
}

func (pw *polledWatcher) add(ev filesystemEvent) {
	pw.mu.Lock()
	if len(pw.events) < maxPolledEvents {
		pw.events = append(pw.events, ev)
	}
	pw.mu.Unlock()
	select {
	case pw.added <- struct{}{}:
	default:
	}
}

// newID is a random id for a watcher.
func newID() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

type createWatcherResponse struct {
	WatcherID string `json:"watcherId"`
}

type watcherRequest struct {
	WatcherID string `json:"watcherId"`
}

type watcherEventsResponse struct {
	Events []filesystemEvent `json:"events"`
}

// CreateWatcher starts a watcher whose events the client polls.
func (s *Service) CreateWatcher(ctx context.Context, r *http.Request, req *watchRequest) (*createWatcherResponse, error) {
	id := newID()
	pw := &polledWatcher{added: make(chan struct{}, 1)}
	w, err := newWatcher(s.users.User().Resolve(req.Path), req, pw.add)
	if err != nil {
		return nil, err
	}
	pw.w = w
	s.mu.Lock()
	s.watchers[id] = pw
	s.mu.Unlock()
	return &createWatcherResponse{WatcherID: id}, nil
}

func (s *Service) polled(id string) (*polledWatcher, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pw, ok := s.watchers[id]
	if !ok {
		return nil, rpc.Errorf(agentproto.CodeNotFound, "watcher %q not found", id)
	}
	return pw, nil
}

// GetWatcherEvents answers the events seen since the last poll.
func (s *Service) GetWatcherEvents(ctx context.Context, r *http.Request, req *watcherRequest) (*watcherEventsResponse, error) {
	pw, err := s.polled(req.WatcherID)
	if err != nil {
		return nil, err
	}
	pw.mu.Lock()
	defer pw.mu.Unlock()
	resp := &watcherEventsResponse{Events: pw.events}
	if resp.Events == nil {
		resp.Events = []filesystemEvent{}
	}
	pw.events = nil
	return resp, nil
}

// RemoveWatcher stops a watcher.
func (s *Service) RemoveWatcher(ctx context.Context, r *http.Request, req *watcherRequest) (*rpc.Empty, error) {
	pw, err := s.polled(req.WatcherID)
	if err != nil {
		return nil, err
	}
	pw.w.Close()
	s.mu.Lock()
	delete(s.watchers, req.WatcherID)
	s.mu.Unlock()
	return &rpc.Empty{}, nil
}
