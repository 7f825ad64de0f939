package wait

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

func TestForReturnsOnceTheConditionHolds(t *testing.T) {
	var n atomic.Int32
	For(t, "third poll", time.Second, func() bool { return n.Add(1) >= 3 })
	if n.Load() != 3 {
		t.Fatalf("polled %d times, want 3", n.Load())
	}
}

func TestForFailsAtTheDeadline(t *testing.T) {
	ft := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		For(ft, "never", 20*time.Millisecond, func() bool { return false })
	}()
	<-done
	if ft.msg != "timed out after 20ms waiting for never" {
		t.Fatalf("failure message %q", ft.msg)
	}
}

// fatalRecorder records Fatalf and ends the goroutine, as testing.T does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestForStateEndsTheFailureWithTheLastState(t *testing.T) {
	ft := &fatalRecorder{TB: t}
	var n atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		ForState(ft, "never", 20*time.Millisecond, func() (bool, string) { return false, fmt.Sprint("poll ", n.Add(1)) })
	}()
	<-done
	if want := fmt.Sprintf("timed out after 20ms waiting for never: poll %d", n.Load()); ft.msg != want {
		t.Fatalf("failure message %q, want %q", ft.msg, want)
	}
}

// A Fatalf that returns, as a recording double's may, still ends the wait.
func TestForEndsWhenFatalfReturns(t *testing.T) {
	rt := &returningFatal{}
	For(rt, "never", 10*time.Millisecond, func() bool { return false })
	if rt.calls != 1 {
		t.Fatalf("Fatalf called %d times, want 1", rt.calls)
	}
}

type returningFatal struct{ calls int }

func (r *returningFatal) Helper()               {}
func (r *returningFatal) Fatalf(string, ...any) { r.calls++ }
