package sandbox

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// This host's own figures parse, and leave room (the tests run on hosts
// far from their limits).
func TestHostRoomReadsTheHost(t *testing.T) {
	tasks, limit := hostTasks()
	if tasks <= 0 || limit <= 0 || tasks >= limit {
		t.Errorf("host tasks %d of %d", tasks, limit)
	}
	if mem, ok := memAvailable(); !ok || mem <= 0 {
		t.Errorf("MemAvailable %d, %v", mem, ok)
	}
	if err := hostRoom(); err != nil {
		t.Errorf("hostRoom: %v", err)
	}
}

// A full host refuses new boxes, pools included, but a pooled sandbox is
// still handed out: it takes nothing more of the host.
func TestHostFullRefusesNewBoxesOnly(t *testing.T) {
	var full atomic.Bool
	m, b := newManager(t, Config{HostRoom: func() error {
		if full.Load() {
			return &PublicError{Err: ErrHostFull, Cause: errors.New("full")}
		}
		return nil
	}}, 1)
	waitFor(t, m, "the pool holds one", func() bool { return pooled(m) == 1 })
	full.Store(true)
	create(t, m, CreateRequest{}) // the pooled one
	if _, err := m.Create(t.Context(), CreateRequest{TemplateID: "base"}); !errors.Is(err, ErrHostFull) {
		t.Fatalf("a new box on a full host: %v, want ErrHostFull", err)
	}
	// Two ticks: the second is received once the filler has done what
	// the first asked of it.
	clockOf(m).Advance(2 * time.Second)
	if n := b.Starts(); n != 1 {
		t.Errorf("%d boxes started, want 1: the pool refilled a full host", n)
	}
	full.Store(false)
	clockOf(m).Advance(time.Second)
	waitFor(t, m, "the pool refills once the host has room", func() bool { return pooled(m) == 1 })
}
