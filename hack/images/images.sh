#!/usr/bin/env bash
# images.sh: kubeclip's production images, built from local Go sources with no Docker and no
# registry (hack/mkimage writes `docker save` tarballs).
#
#   images.sh build    static binaries, then one FROM-scratch image per binary in $OUT
#   images.sh import   build, then import into the local cluster's containerd (k8s.io namespace)
#   images.sh load     build, then `docker load` into a Docker engine
#   images.sh tags     print the image references
#
# Images (all: static binary, no shell, uid/gid 65532, CA bundle of the build host):
#   $REPO/tenant-worker:$TAG  $REPO/dispatcher:$TAG  $REPO/run-watcher:$TAG  $REPO/exec-worker:$TAG
#   $REPO/credential-broker:$TAG  swaps brokered pods' placeholders for the real keys (issue 27);
#                             also `credential-broker ca`, which makes its installation CA
#   $REPO/kubeclip:$TAG       the CLI
#   $REPO/sandboxd:$TAG       the exec daemon; exec-capable pods' init container copies it out
#   $REPO/nats:$TAG           nats-server built from the github.com/nats-io/nats-server/v2 module
#                             this repository pins (go.mod), JetStream configured by deploy/
#
# Environment: KUBECLIP_IMAGE_REPO (default kubeclip.local), KUBECLIP_IMAGE_TAG (default dev),
# KUBECLIP_IMAGES_DIR (default $ROOT/bin/images), KUBECLIP_CLUSTER_DIR (the local cluster's state,
# for import). Users with Docker and internet use the Dockerfile instead (see README, Deploy).
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
REPO=${KUBECLIP_IMAGE_REPO:-kubeclip.local}
TAG=${KUBECLIP_IMAGE_TAG:-dev}
OUT=${KUBECLIP_IMAGES_DIR:-$ROOT/bin/images}
STATE=${KUBECLIP_CLUSTER_DIR:-/var/lib/kubeclip/cluster}
# The non-root user every image runs as (distroless' "nonroot"); the manifests use the same.
UID_GID=65532:65532
WORKERS=(tenant-worker dispatcher run-watcher exec-worker credential-broker kubeclip sandboxd)
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt

log() { printf '%s [images] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

build() {
  mkdir -p "$OUT/bin" "$OUT/data" # data: Dockerfile.local's empty /data
  # $OUT is also Dockerfile.local's build context: keep the tarballs out of it.
  printf '*.tar\nbin/mkimage\n' >"$OUT/.dockerignore"
  # One lock per output dir: two test packages building at once must not interleave.
  exec 8>"$OUT/.lock"
  flock 8
  log "building static binaries into $OUT/bin"
  (cd "$ROOT" && go build -o "$OUT/bin/mkimage" ./hack/mkimage)
  local pkgs=() b
  for b in "${WORKERS[@]}"; do pkgs+=("./cmd/$b"); done
  (cd "$ROOT" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$OUT/bin/" "${pkgs[@]}")
  (cd "$ROOT" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$OUT/bin/nats-server" github.com/nats-io/nats-server/v2)

  local extra=()
  [[ -r $CA_BUNDLE ]] && extra+=("$CA_BUNDLE:$CA_BUNDLE")
  for b in "${WORKERS[@]}"; do
    "$OUT/bin/mkimage" --tag "$REPO/$b:$TAG" --out "$OUT/$b.tar" --user "$UID_GID" \
      --entrypoint "/usr/local/bin/$b" "$OUT/bin/$b:/usr/local/bin/$b" "${extra[@]}"
  done
  # /data: JetStream's store, owned by the non-root user so that a Docker named volume mounted
  # there starts writable (in Kubernetes, fsGroup does that for the PersistentVolume).
  "$OUT/bin/mkimage" --tag "$REPO/nats:$TAG" --out "$OUT/nats.tar" --user "$UID_GID" \
    --dir "/data:${UID_GID}:0700" --entrypoint /usr/local/bin/nats-server "$OUT/bin/nats-server:/usr/local/bin/nats-server" "${extra[@]}"
  flock -u 8
  log "built $(tags | tr '\n' ' ')in $OUT"
}

tags() {
  local b
  for b in "${WORKERS[@]}" nats; do echo "$REPO/$b:$TAG"; done
}

import_cluster() {
  local sock=$STATE/run/containerd.sock snap
  [[ -S $sock ]] || die "no containerd socket at $sock: is the local cluster up (make cluster-up)? For another cluster, load $OUT/*.tar with its runtime's tools"
  snap=$(sed -n 's/^ *snapshotter = "\(.*\)"/\1/p' "$STATE/containerd/config.toml")
  local b
  for b in "${WORKERS[@]}" nats; do
    ctr --address "$sock" --namespace k8s.io images import --snapshotter "${snap:-overlayfs}" "$OUT/$b.tar" >/dev/null
  done
  log "imported into the local cluster's containerd"
}

docker_load() {
  local b
  for b in "${WORKERS[@]}" nats; do docker load -i "$OUT/$b.tar" >/dev/null; done
  log "loaded into Docker"
}

case ${1:-} in
build) build ;;
import) build && import_cluster ;;
load) build && docker_load ;;
tags) tags ;;
*)
  echo "usage: $0 build|import|load|tags" >&2
  exit 2
  ;;
esac
