package sandbox

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// fakeClock is a Clock that moves only when a test advances it. Timers
// and ticks due by then come in the order of their times, each in the
// advancing goroutine: a timer's function has returned, a tick has been
// received, by the time Advance returns. A timer due at once (d <= 0)
// fires at the next Advance, Advance(0) included, never by itself.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	timers  []*fakeTimer
	tickers []*fakeTicker
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) Timer {
	t := &fakeTimer{c: c, f: f}
	t.Reset(d)
	return t
}

func (c *fakeClock) NewTicker(d time.Duration) Ticker {
	if d <= 0 {
		panic("non-positive interval for NewTicker")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTicker{clock: c, c: make(chan time.Time), stopped: make(chan struct{}), every: d, next: c.now.Add(d)}
	c.tickers = append(c.tickers, t)
	return t
}

// Advance moves the clock d on, firing what falls due on the way.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	c.mu.Unlock()
	for c.step(end) {
	}
}

// step fires the earliest timer or tick due by end and reports whether
// there was one; if not, the clock stands at end.
func (c *fakeClock) step(end time.Time) bool {
	c.mu.Lock()
	var timer *fakeTimer
	var ticker *fakeTicker
	at := end.Add(1)
	for _, t := range c.timers {
		if t.at.Before(at) {
			timer, at = t, t.at
		}
	}
	for _, t := range c.tickers {
		if t.next.Before(at) {
			timer, ticker, at = nil, t, t.next
		}
	}
	if timer == nil && ticker == nil {
		c.now = end
		c.mu.Unlock()
		return false
	}
	c.now = maxTime(c.now, at)
	now := c.now
	if timer != nil {
		c.timers = slices.DeleteFunc(c.timers, func(t *fakeTimer) bool { return t == timer })
	} else {
		ticker.next = ticker.next.Add(ticker.every)
	}
	c.mu.Unlock()
	if timer != nil {
		timer.f()
		return true
	}
	select { // received, or the ticker's owner stopped it meanwhile
	case ticker.c <- now:
	case <-ticker.stopped:
	}
	return true
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Pending counts the timers not yet fired nor stopped.
func (c *fakeClock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

type fakeTimer struct {
	c  *fakeClock
	f  func()
	at time.Time
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	n := len(t.c.timers)
	t.c.timers = slices.DeleteFunc(t.c.timers, func(x *fakeTimer) bool { return x == t })
	return len(t.c.timers) < n
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	pending := t.Stop()
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	t.at = t.c.now.Add(d)
	t.c.timers = append(t.c.timers, t)
	return pending
}

type fakeTicker struct {
	clock   *fakeClock
	c       chan time.Time
	stopped chan struct{}
	once    sync.Once
	every   time.Duration
	next    time.Time // guarded by the clock's mu
}

func (t *fakeTicker) C() <-chan time.Time { return t.c }

func (t *fakeTicker) Stop() {
	t.once.Do(func() {
		close(t.stopped)
		t.clock.mu.Lock()
		defer t.clock.mu.Unlock()
		t.clock.tickers = slices.DeleteFunc(t.clock.tickers, func(x *fakeTicker) bool { return x == t })
	})
}

// The fake clock keeps time as the tests rely on: timers fire in order at
// their times, stopped ones never, a reset one at its new time.
func TestFakeClock(t *testing.T) {
	c := newFakeClock()
	start := c.Now()
	var fired []string
	at := map[string]time.Time{}
	timer := func(name string, d time.Duration) Timer {
		return c.AfterFunc(d, func() { fired = append(fired, name); at[name] = c.Now() })
	}
	timer("b", 2*time.Second)
	timer("a", time.Second)
	stopped := timer("stopped", time.Second)
	reset := timer("reset", time.Second)
	if !stopped.Stop() || stopped.Stop() {
		t.Error("Stop of a pending timer, then of a stopped one: want true, then false")
	}
	reset.Reset(3 * time.Second)
	c.Advance(1500 * time.Millisecond)
	if !slices.Equal(fired, []string{"a"}) {
		t.Fatalf("fired %v after 1.5s, want [a]", fired)
	}
	c.Advance(10 * time.Second)
	if !slices.Equal(fired, []string{"a", "b", "reset"}) {
		t.Fatalf("fired %v, want [a b reset]", fired)
	}
	if got := at["b"].Sub(start); got != 2*time.Second {
		t.Errorf("b fired at +%v, want +2s", got)
	}
	if got := c.Now().Sub(start); got != 11500*time.Millisecond {
		t.Errorf("clock at +%v, want +11.5s", got)
	}
	if c.Pending() != 0 {
		t.Errorf("%d timers pending", c.Pending())
	}
	// Due at once: at the next Advance, not before.
	now := timer("now", 0)
	if len(fired) != 3 {
		t.Fatal("a timer due at once fired without an Advance")
	}
	c.Advance(0)
	if fired[len(fired)-1] != "now" || now.Stop() {
		t.Errorf("fired %v, want now last and no longer pending", fired)
	}
	// A timer that re-arms itself from its function fires again within
	// the same Advance when its new time falls inside it.
	n := 0
	var self Timer
	self = c.AfterFunc(time.Second, func() { n++; self.Reset(time.Second) })
	c.Advance(3 * time.Second)
	if n != 3 {
		t.Errorf("a self-resetting timer fired %d times in 3s, want 3", n)
	}
	self.Stop()
}

func TestFakeTicker(t *testing.T) {
	c := newFakeClock()
	tk := c.NewTicker(time.Second)
	got := make(chan time.Time, 2)
	go func() {
		got <- <-tk.C()
		got <- <-tk.C()
	}()
	advanced := make(chan struct{})
	go func() { c.Advance(2 * time.Second); close(advanced) }()
	first, second := <-got, <-got
	if d := second.Sub(first); d != time.Second {
		t.Errorf("ticks %v apart, want 1s", d)
	}
	<-advanced
	tk.Stop()
	c.Advance(5 * time.Second) // a stopped ticker's ticks go nowhere, and do not block
	select {
	case at := <-got:
		t.Errorf("a tick at %v after Stop", at)
	default:
	}
}

func TestRealClock(t *testing.T) {
	var c Clock = realClock{}
	fired := make(chan struct{})
	timer := c.AfterFunc(0, func() { close(fired) })
	<-fired
	if timer.Stop() {
		t.Error("Stop of a fired timer reports it pending")
	}
	tk := c.NewTicker(time.Millisecond)
	<-tk.C()
	tk.Stop()
	if c.Now().IsZero() {
		t.Error("Now is zero")
	}
}
