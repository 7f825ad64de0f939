#!/usr/bin/env bash
# build.sh: builds Kubernetes' own kube-apiserver and kubectl (v1.37.2, from
# the Go module proxy; go.mod pins the version and replaces every k8s.io
# staging module with its published v0.37.2) for the kubernetes backend's
# and the deployment manifests' tests, and prints the directory holding
# both. The binaries are cached in $AETHER_KUBE_CACHE (default
# ~/.cache/aether-kube) under a key of this module's go.sum and sources, so
# a machine builds them once (about 4 minutes and 2.4 GB of memory for the
# API server on an idle 2-core machine) and a later run only checks the key.
#
# internal/testutil/kubeapi finds them as $AETHER_KUBE_BIN, then in that
# cache, so .ci/run runs this before the tests.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${AETHER_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/aether-kube}"
version=v1.37.2
key=$(cat "$here/go.mod" "$here/go.sum" "$here/main.go" "$here/kubectl/main.go" | sha256sum | cut -c1-16)
dir="$cache/$version-$key"
if [ ! -x "$dir/kube-apiserver" ] || [ ! -x "$dir/kubectl" ]; then
  mkdir -p "$dir.tmp"
  # Without these the binaries report v0.0.0-master, which client-go's and
  # kubectl's version checks read as a skew.
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37 -X k8s.io/component-base/version.gitTreeState=clean"
  (cd "$here" && go build -trimpath -ldflags "$ldflags" -o "$dir.tmp/kube-apiserver" .) >&2
  (cd "$here" && go build -trimpath -ldflags "$ldflags" -o "$dir.tmp/kubectl" ./kubectl) >&2
  rm -rf "$dir" && mv "$dir.tmp" "$dir"
fi
echo "$dir"
