#!/usr/bin/env bash
# kwok.sh build: builds kwok's controller (sigs.k8s.io/kwok, from the Go module proxy) into the
# cache once per version and prints the binary's path. `make bench-scale` runs it against the
# local cluster's API server (tests/scale starts and stops it, and creates and deletes its fake
# nodes), so a simulated fleet holds thousands of pods that no kubelet runs. Its stages
# (stages.yaml) are kwok's "fast" ones with two changes, said there. The fleet's kubelet port for
# container logs is the bench's own (tests/scale/kubelet.go), not kwok's server: why is said there.
#
#   KUBECLIP_CACHE   cache of built tools (default ~/.cache/kubeclip)
set -euo pipefail
# shellcheck source=hack/lib/progress.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/progress.sh"

KWOK_VERSION=v0.8.0
CACHE=${KUBECLIP_CACHE:-${HOME:-/root}/.cache/kubeclip}
BIN=$CACHE/kwok/$KWOK_VERSION/kwok

build() {
  if [[ ! -x $BIN ]]; then
    mkdir -p "$(dirname "$BIN")"
    local tmp
    tmp=$(mktemp -d "$(dirname "$BIN")/build.XXXXXX")
    # kwok's go.mod has no replace directives: `go install module@version` builds it as
    # published, outside the project's module graph. Cold: about 3.5 min on 2 cores.
    echo "building kwok $KWOK_VERSION into $BIN" >&2
    GOBIN=$tmp CGO_ENABLED=0 go_progress "building kwok $KWOK_VERSION" . -- \
      go install -v -trimpath -ldflags='-s -w' "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
    mv "$tmp/kwok" "$BIN"
    rmdir "$tmp"
  fi
  echo "$BIN"
}

case ${1:-} in
  build) build ;;
  *) echo "usage: $0 build" >&2; exit 2 ;;
esac
