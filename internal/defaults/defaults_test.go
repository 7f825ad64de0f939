package defaults

import (
	"testing"
	"time"
)

func TestSetFillsOnlyZero(t *testing.T) {
	var s string
	d := time.Duration(0)
	n := 7
	Set(&s, "x")
	Set(&d, time.Second)
	Set(&n, 9)
	if s != "x" || d != time.Second || n != 7 {
		t.Fatalf("got %q %v %d; want x 1s 7 (a set field is kept)", s, d, n)
	}
}
