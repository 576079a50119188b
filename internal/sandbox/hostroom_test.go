package sandbox

import (
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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

// A daemon near its limit on open files has no room: it refuses before
// a create fails midway on EMFILE.
func TestHostRoomCountsOpenFiles(t *testing.T) {
	for range 20 {
		f, err := os.Open(os.DevNull)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
	}
	used, limit := openFiles()
	if used < 3 || limit <= used {
		t.Fatalf("open files %d of %d", used, limit)
	}
	var saved unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &saved); err != nil {
		t.Fatal(err)
	}
	lowered := saved
	lowered.Cur = uint64(used) + 1 // 90 % of it is below what is open
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lowered); err != nil {
		t.Fatal(err)
	}
	err := hostRoom()
	unix.Setrlimit(unix.RLIMIT_NOFILE, &saved)
	if !errors.Is(err, ErrHostFull) {
		t.Errorf("hostRoom with %d of %d files open: %v, want ErrHostFull", used, used+1, err)
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
