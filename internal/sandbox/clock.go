package sandbox

import "time"

// Clock is the manager's time: when a sandbox's time to live ends, when
// pools retry and sandboxes are measured. Production runs on the real
// clock; tests give a fake one, so that an hour to live passes at once
// and a test never waits on the wall clock. Bounds on calls to a box
// (context timeouts) are not schedule: they stay on the real clock.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has passed.
	AfterFunc(d time.Duration, f func()) Timer
	// NewTicker ticks every d until stopped.
	NewTicker(d time.Duration) Ticker
}

// Timer is a pending AfterFunc, as *time.Timer's.
type Timer interface {
	Stop() bool
	Reset(d time.Duration) bool
}

// Ticker is a NewTicker's, as *time.Ticker's.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// realClock is the wall clock.
type realClock struct{}

func (realClock) Now() time.Time                            { return time.Now() }
func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
func (realClock) NewTicker(d time.Duration) Ticker          { return realTicker{time.NewTicker(d)} }

type realTicker struct{ t *time.Ticker }

func (t realTicker) C() <-chan time.Time { return t.t.C }
func (t realTicker) Stop()               { t.t.Stop() }
