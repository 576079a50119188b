package sandbox

import (
	"errors"
	"log/slog"
	"slices"
	"testing"
)

// Every state but Starting is reached from Starting, and every one but
// Gone leads on: the table has no dead ends and nothing unreachable.
func TestTransitionsConnectEveryState(t *testing.T) {
	reached := map[State]bool{Starting: true}
	for changed := true; changed; {
		changed = false
		for _, tr := range transitions {
			if reached[tr.from] && !reached[tr.to] {
				reached[tr.to], changed = true, true
			}
		}
	}
	for s := Starting; s <= Gone; s++ {
		if !reached[s] {
			t.Errorf("%s is unreachable from starting", s)
		}
		leaves := slices.ContainsFunc(transitions, func(e edge) bool { return e.from == s })
		if leaves != (s != Gone) {
			t.Errorf("%s: leads on %v, want %v", s, leaves, s != Gone)
		}
	}
}

// What a client sees, and what the manager's checks read, of each state.
func TestStateKinds(t *testing.T) {
	for _, tc := range []struct {
		s                    State
		e2b                  string
		paused, saved, ended bool
	}{
		{Starting, "running", false, false, false},
		{Running, "running", false, false, false},
		{Pausing, "running", false, false, false},
		{Paused, "paused", true, false, false},
		{Saved, "paused", true, true, false},
		{SavedFiles, "paused", true, true, false},
		{Resuming, "paused", true, false, false},
		{Snapshotting, "running", false, false, false},
		{Killing, "running", false, false, true},
		{Gone, "running", false, false, true},
	} {
		t.Run(tc.s.String(), func(t *testing.T) {
			if got := tc.s.E2B(); got != tc.e2b {
				t.Errorf("E2B() = %q, want %q", got, tc.e2b)
			}
			if tc.s.paused() != tc.paused || tc.s.saved() != tc.saved || tc.s.ended() != tc.ended {
				t.Errorf("paused %v saved %v ended %v, want %v %v %v",
					tc.s.paused(), tc.s.saved(), tc.s.ended(), tc.paused, tc.saved, tc.ended)
			}
		})
	}
	if got := State(200).String(); got != "State(200)" {
		t.Errorf("an unknown state's name: %q", got)
	}
	if got := op(200).String(); got != "op(200)" {
		t.Errorf("an unknown op's name: %q", got)
	}
}

// transition takes only the table's edges, refusing any other with
// ErrConflict and leaving the state as it was; the count of saved
// sandboxes follows the moves into and out of the saved states, and each
// move is heard by whoever waits for a change.
func TestTransition(t *testing.T) {
	m := &Manager{log: slog.New(slog.DiscardHandler)}
	sb := &Sandbox{ID: "i0123"}
	move := func(o op, to State) error {
		t.Helper()
		changed := m.changes.wait()
		err := m.transition(sb, o, to)
		select {
		case <-changed:
			if err != nil {
				t.Errorf("%s to %s refused, yet heard as a change", o, to)
			}
		default:
			if err == nil {
				t.Errorf("%s to %s not heard as a change", o, to)
			}
		}
		return err
	}
	steps := []struct {
		op    op
		to    State
		ok    bool
		saved int64 // m.saved after the step
	}{
		{opPause, Pausing, false, 0}, // not registered yet
		{opCreate, Running, true, 0},
		{opCreate, Running, false, 0},
		{opResume, Resuming, false, 0}, // not paused
		{opPause, Pausing, true, 0},
		{opPause, Saved, true, 1},
		{opPause, Pausing, false, 1}, // already paused
		{opSnapshot, Snapshotting, false, 1},
		{opResume, Resuming, true, 0},
		{opResume, Saved, true, 1}, // the restore failed
		{opResume, Resuming, true, 0},
		{opResume, Running, true, 0},
		{opSnapshot, Snapshotting, true, 0},
		{opKill, Killing, false, 0}, // not while a snapshot holds it
		{opSnapshot, Running, true, 0},
		{opPause, Pausing, true, 0},
		{opPause, SavedFiles, true, 1},
		{opKill, Killing, true, 0},
		{opPause, Pausing, false, 0},
		{opResume, Resuming, false, 0},
		{opKill, Gone, true, 0},
		{opKill, Killing, false, 0},
	}
	for i, st := range steps {
		before := sb.state
		err := move(st.op, st.to)
		if (err == nil) != st.ok {
			t.Fatalf("step %d: %s from %s to %s: %v, want ok %v", i, st.op, before, st.to, err, st.ok)
		}
		if err != nil && (!errors.Is(err, ErrConflict) || sb.state != before) {
			t.Errorf("step %d: refused with %v, state %s; want ErrConflict, state %s", i, err, sb.state, before)
		}
		if got := m.saved.Load(); got != st.saved {
			t.Errorf("step %d: %d saved, want %d", i, got, st.saved)
		}
	}
}
