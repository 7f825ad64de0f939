#!/usr/bin/env bash
# run.sh TARGET: etcd's own conformance suite (go.etcd.io/etcd/tests/v3
# v3.7.3, package tests/common, -tags e2e) against one member of TARGET:
#   etcd    the real etcd (tools/etcd), to prove the harness;
#   aether  `aether edge` (./cmd/aether), through a wrapper named etcd that
#           execs "aether edge" with etcd's flags, as the suite spawns etcd.
# The tests run are the "run" lines of tests.txt; the others are listed there
# with the reason they do not apply to one replica. The suite drives the real
# etcdctl (tools/etcdctl) in both cases.
#
# Binaries and the compiled test are kept in $ETCDTESTS_CACHE (default
# ~/.cache/aether-etcdtests); go's build cache makes a rebuild of unchanged
# source a link. Extra arguments go to the test binary; $ETCDTESTS_RUN, a
# regexp, runs only the "run" tests whose names match it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
target="${1:-}"; shift || true
case "$target" in
etcd | aether) ;;
*) echo "usage: $0 etcd|aether [test binary flags]" >&2; exit 2 ;;
esac
cache="${ETCDTESTS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/aether-etcdtests}"
mkdir -p "$cache/bin-etcd" "$cache/bin-aether"

echo "--- building etcd, etcdctl and the tests/common test binary into $cache"
(cd "$root/tools/etcd" && go build -o "$cache/etcd" .)
(cd "$root/tools/etcdctl" && go build -o "$cache/etcdctl" go.etcd.io/etcd/etcdctl/v3)
(cd "$here" && go test -c -tags e2e -o "$cache/common.test" go.etcd.io/etcd/tests/v3/common)
ln -sf "$cache/etcd" "$cache/bin-etcd/etcd"
ln -sf "$cache/etcdctl" "$cache/bin-etcd/etcdctl"
ln -sf "$cache/etcdctl" "$cache/bin-aether/etcdctl"
if [ "$target" = aether ]; then
  (cd "$root" && go build -o "$cache/aether" ./cmd/aether)
  # The suite runs "<bin-dir>/etcd --name=... --data-dir=... ..."; the
  # wrapper makes that "aether edge --name=... ...".
  printf '#!/bin/sh\nexec %q edge "$@"\n' "$cache/aether" >"$cache/bin-aether/etcd"
  chmod +x "$cache/bin-aether/etcd"
fi
"$cache/bin-$target/etcd" --version | sed -n 1p

# Every test the binary has must be classified in tests.txt.
listed="$("$cache/common.test" -test.list '.*' | grep '^Test' | sort)"
classified="$(awk '$1 == "run" || $1 == "skip" { print $2 }' "$here/tests.txt" | sort)"
unclassified="$(comm -23 <(echo "$listed") <(echo "$classified"))"
if [ -n "$unclassified" ]; then
  echo "tests.txt classifies neither run nor skip:" $unclassified >&2; exit 1
fi
gone="$(comm -13 <(echo "$listed") <(echo "$classified"))"
if [ -n "$gone" ]; then
  echo "tests.txt names tests the suite does not have:" $gone >&2; exit 1
fi

# Each test runs in a process of its own: the suite's leak check skips
# every test after one that left goroutines behind (a failed one does), so
# one failure must not hide the others' results.
pkgdir="$(cd "$here" && go list -m -f '{{.Dir}}' go.etcd.io/etcd/tests/v3)/common"
logdir="$cache/logs-$target"
rm -rf "$logdir" && mkdir -p "$logdir"
echo "--- tests/common against $target (one member; logs in $logdir)"
start=$(date +%s)
failed=()
while read -r status test subs _; do
  [ "$status" = run ] || continue
  if [ -n "${ETCDTESTS_RUN:-}" ] && ! [[ "$test" =~ $ETCDTESTS_RUN ]]; then
    continue
  fi
  pattern="^$test\$"
  [ "$subs" = - ] || pattern="$pattern/^($subs)\$"
  t0=$(date +%s)
  set +e
  # The suite finds its TLS fixtures relative to the package's directory.
  (cd "$pkgdir" && E2E_TEST_MINIMAL=true "$cache/common.test" \
    -test.run "$pattern" -test.v -test.count=1 -test.timeout=5m \
    -bin-dir "$cache/bin-$target" "$@") >"$logdir/$test.log" 2>&1
  rc=$?
  set -e
  verdict=PASS
  if [ $rc -ne 0 ]; then
    verdict=FAIL; failed+=("$test")
  elif ! grep -q -- "^--- PASS: $test " "$logdir/$test.log"; then
    verdict=SKIP # the leak check or the test itself skipped it
  fi
  printf '%-40s %s (%ss)\n' "$test" "$verdict" "$(($(date +%s) - t0))"
  if [ "$verdict" = SKIP ]; then
    grep -E -m3 'SKIP|skip' "$logdir/$test.log" | sed 's/^/    /'
  fi
done <"$here/tests.txt"
echo "tests/common against $target: ${#failed[@]} failed in $(($(date +%s) - start))s"
for test in "${failed[@]}"; do
  # The failures' own text, for the CI log.
  echo "=== $test ($logdir/$test.log)"
  grep -v '^\s*logger.go' "$logdir/$test.log" |
    grep -E -A10 '^\s*--- FAIL|Error Trace|Test failed|panic:' | head -60
done
[ ${#failed[@]} -eq 0 ]
