package registrar_test

import (
	"flag"
	"os"
	"runtime"
	"strconv"
	"testing"
)

// waitBoundParallelism is how many parallel tests run at once per CPU
// when -parallel is not given.
//
// go test's default, one per CPU, suits tests that compute. This package's
// tests mostly wait (for etcd's fsyncs, for flush intervals, TTLs and
// backstops that are the behaviour under test, for a stopped etcd to be
// missed): the whole package takes about four times as long as it keeps
// a CPU busy. With one test per CPU the CPUs stay mostly idle; with four,
// they are about busy while the waits overlap. Under the race detector
// the same tests keep the CPUs busy by themselves, and more of them at
// once would only stretch each one's timing, so the default stands there.
// An explicit -parallel always wins.
const waitBoundParallelism = 4

func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set && !raceDetector {
		_ = flag.Set("test.parallel", strconv.Itoa(waitBoundParallelism*runtime.GOMAXPROCS(0)))
	}
	os.Exit(m.Run())
}
