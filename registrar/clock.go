package registrar

import "time"

// Clock is the time the registrar's loops run on. The scheduling rules
// themselves are pure (package core's planners take the time as an
// argument); the loops ask the clock what time it is and to be woken, so a
// test can run them on a clock of its own.
type Clock interface {
	Now() time.Time
	// NewTimer fires once, after d.
	NewTimer(d time.Duration) Timer
	// NewTicker fires every d.
	NewTicker(d time.Duration) Ticker
}

// Timer is a Clock's one-shot timer.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
}

// Ticker is a Clock's periodic timer.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// wallClock is the real clock, the default.
type wallClock struct{}

func (wallClock) Now() time.Time                   { return time.Now() }
func (wallClock) NewTimer(d time.Duration) Timer   { return wallTimer{time.NewTimer(d)} }
func (wallClock) NewTicker(d time.Duration) Ticker { return wallTicker{time.NewTicker(d)} }

type wallTimer struct{ t *time.Timer }

func (t wallTimer) C() <-chan time.Time { return t.t.C }
func (t wallTimer) Stop() bool          { return t.t.Stop() }

type wallTicker struct{ t *time.Ticker }

func (t wallTicker) C() <-chan time.Time { return t.t.C }
func (t wallTicker) Stop()               { t.t.Stop() }
