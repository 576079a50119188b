package sandbox

import (
	"fmt"
	"sync"
)

// A sandbox's lifecycle is one State. It changes only through
// Manager.transition, with the sandbox's lock held, and only along the
// edges of the transitions table: an operation that finds its sandbox in
// a state it cannot leave that way fails instead of acting on it (a
// pause of what is being killed would freeze a dying box).
//
//	Starting ──create──► Running
//	Starting ──load────► Saved | SavedFiles (found at a start: saved.go)
//	Starting ──adopt───► Running | Paused (left running by a daemon: live.go)
//	Running ──pause────► Pausing ──► Paused | Saved | SavedFiles
//	                             └─► Running (it failed)
//	Paused | Saved | SavedFiles ──resume──► Resuming ──► Running
//	                                                 └─► back (it failed)
//	Running ──snapshot──► Snapshotting ──► Running
//	Running | Paused | Saved | SavedFiles ──kill──► Killing ──► Gone
//	  (a kill, the end of its time to live, its box's death, Shutdown)
//
// Pausing, Resuming and Snapshotting last while their operation holds
// the sandbox's lock, so no other operation finds a sandbox in one; they
// are there so that the table says what each operation may do, and so
// that one that fails goes back by an edge of its own. Killing lasts
// while the box is removed, out of the registry already; every operation
// then finds the sandbox gone. A box pooled but not handed out is no
// sandbox yet: its pool keeps it (pool.go).

// State is where a sandbox is in its lifecycle.
type State uint8

const (
	// Starting: its box is started and its agent set up; it is not
	// registered yet, so no client sees it.
	Starting State = iota
	// Running: handed out, its box running.
	Running
	// Pausing: a pause is under way (freezing it, or saving it).
	Pausing
	// Paused: frozen in memory; its box holds its processes.
	Paused
	// Saved: saved whole (memory, processes, files) to disk by its
	// backend (a backend.Checkpointer); no box, no memory used.
	Saved
	// SavedFiles: only its files saved (savedfiles.go); no box.
	SavedFiles
	// Resuming: a resume (a thaw, or a restore from disk) is under way.
	Resuming
	// Snapshotting: a copy of it is being saved; it runs on after.
	Snapshotting
	// Killing: removed from the registry, its box being killed.
	Killing
	// Gone: ended, its box removed.
	Gone
)

var stateNames = [...]string{"starting", "running", "pausing", "paused", "saved", "saved-files", "resuming", "snapshotting", "killing", "gone"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", s)
}

// E2B is the state as E2B's API shows it (a list's and getInfo's
// "state"): "paused" from the moment a pause has succeeded until a
// resume has, else "running".
func (s State) E2B() string {
	if s.paused() {
		return "paused"
	}
	return "running"
}

// paused: every process stopped, its time to live stopped, whatever
// keeps it. A resume under way counts: it is not running yet.
func (s State) paused() bool {
	return s == Paused || s == Saved || s == SavedFiles || s == Resuming
}

// saved: it has no box; what it was is on disk.
func (s State) saved() bool { return s == Saved || s == SavedFiles }

// ended: it is being killed or gone; nothing may be done to it.
func (s State) ended() bool { return s == Killing || s == Gone }

// op is an operation that moves a sandbox from one state to another.
type op uint8

const (
	opCreate   op = iota // registers a started sandbox
	opLoad               // registers one an earlier daemon saved (saved.go)
	opPause              // freezes it, or saves it to disk, or its files
	opResume             // thaws it, or restores it
	opSnapshot           // saves a copy of it (snapshot.go)
	opKill               // ends it
	opAdopt              // registers one an earlier daemon left running (live.go)
)

var opNames = [...]string{"create", "load", "pause", "resume", "snapshot", "kill", "adopt"}

func (o op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", o)
}

// edge is a move an operation may make.
type edge struct {
	op       op
	from, to State
}

// transitions is every move an operation may make. A move back (Pausing
// to Running, Resuming to where it came from, Snapshotting to Running)
// is the operation failing, or, for a snapshot, done: the sandbox is as
// it was.
var transitions = []edge{
	{opCreate, Starting, Running},

	{opLoad, Starting, Saved},
	{opLoad, Starting, SavedFiles},

	{opAdopt, Starting, Running},
	{opAdopt, Starting, Paused},

	{opPause, Running, Pausing},
	{opPause, Pausing, Paused},
	{opPause, Pausing, Saved},
	{opPause, Pausing, SavedFiles},
	{opPause, Pausing, Running},

	{opResume, Paused, Resuming},
	{opResume, Saved, Resuming},
	{opResume, SavedFiles, Resuming},
	{opResume, Resuming, Running},
	{opResume, Resuming, Paused},
	{opResume, Resuming, Saved},
	{opResume, Resuming, SavedFiles},

	{opSnapshot, Running, Snapshotting},
	{opSnapshot, Snapshotting, Running},

	{opKill, Running, Killing},
	{opKill, Paused, Killing},
	{opKill, Saved, Killing},
	{opKill, SavedFiles, Killing},
	{opKill, Killing, Gone},
}

// allowed reports whether o may move a sandbox from one state to another.
func allowed(o op, from, to State) bool {
	for _, t := range transitions {
		if t.op == o && t.from == from && t.to == to {
			return true
		}
	}
	return false
}

// transition moves sb to next by o, where the table allows it; sb.mu is
// held. The count of saved sandboxes, which count against no limit,
// follows, and whoever waits for a change hears of it.
func (m *Manager) transition(sb *Sandbox, o op, next State) error {
	from := sb.state
	if !allowed(o, from, next) {
		return fmt.Errorf("%w: sandbox %s is %s: a %s cannot make it %s", ErrConflict, sb.ID, from, o, next)
	}
	sb.state = next
	sb.Log("info", "sandbox", "sandbox "+next.String(), "operation", o.String(), "from", from.String())
	switch {
	case !from.saved() && next.saved():
		m.saved.Add(1)
	case from.saved() && !next.saved():
		m.saved.Add(-1)
	}
	m.changes.notify()
	return nil
}

// broadcast tells everyone waiting that something changed: a sandbox's
// state, or what a pool holds. Tests wait on it rather than on the
// clock.
type broadcast struct {
	mu sync.Mutex
	ch chan struct{}
}

// wait returns a channel closed at the next change.
func (b *broadcast) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

func (b *broadcast) notify() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
}
