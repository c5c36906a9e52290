#!/usr/bin/env bash
# docker.sh: a Docker engine for the compose test, on a machine without systemd.
#
#   docker.sh up      install Debian's docker.io and docker-compose if missing, then start dockerd
#                     in the background (unless a Docker engine already answers); both under
#                     one lock, so that concurrent `up`s install and start exactly once
#   docker.sh down    stop the dockerd that `up` started (nothing else)
#   docker.sh status
#
# dockerd runs with its own data root, exec root and pidfile under $STATE, and starts its own
# containerd (its socket under the exec root), apart from the local cluster's containerd, which
# listens on /var/lib/kubeclip/cluster/run/containerd.sock and never on the system default
# /run/containerd/containerd.sock that dockerd would otherwise reuse.
set -Eeuo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=hack/lib/apt.sh
. "$HERE/../lib/apt.sh"

STATE=${KUBECLIP_DOCKER_DIR:-/var/lib/kubeclip/docker}
EXEC_ROOT=/run/kubeclip-docker
PIDFILE=$STATE/dockerd.pid
SOCK=/var/run/docker.sock
LOG=$STATE/dockerd.log

log() { printf '%s [docker] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

engine_answers() { timeout 5 docker -H "unix://$SOCK" info >/dev/null 2>&1; }

# ensure_packages installs docker.io and docker-compose when missing (apt_install keeps their
# maintainer scripts from starting a dockerd of their own).
ensure_packages() {
  local missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1 || missing+=(docker-compose)
  ((${#missing[@]} == 0)) && return 0
  apt_install "${missing[@]}"
}

ours_running() {
  local pid
  pid=$(cat "$PIDFILE" 2>/dev/null) && [[ -n $pid && -d /proc/$pid ]] && grep -q dockerd "/proc/$pid/cmdline" 2>/dev/null
}

cmd_up() {
  [[ $EUID -eq 0 ]] || die "up needs root"
  mkdir -p "$STATE"
  # One `up` at a time, from the package check to a dockerd that answers: go test runs
  # tests/compose and tests/containers in parallel and both bring the engine up. The one that
  # waited here finds the packages installed and the engine answering, and starts nothing.
  exec 9>"$STATE/.lock"
  flock -w 900 9 || die "waited 15 min for $STATE/.lock (another docker.sh up?)"
  ensure_packages
  if engine_answers; then
    log "a Docker engine already answers on $SOCK"
    return 0
  fi
  [[ ! -S /run/containerd/containerd.sock ]] ||
    log "warning: /run/containerd/containerd.sock exists: dockerd will use that containerd"
  log "starting dockerd (data root $STATE/data, log $LOG)"
  (
    for fd in /proc/"$BASHPID"/fd/*; do
      fd=${fd##*/}
      if ((fd > 2)); then eval "exec $fd>&-"; fi
    done
    exec setsid dockerd --host "unix://$SOCK" --pidfile "$PIDFILE" --data-root "$STATE/data" \
      --exec-root "$EXEC_ROOT" >"$LOG" 2>&1 </dev/null
  ) &
  local _
  for _ in $(seq 1 150); do
    engine_answers && { log "dockerd ready"; return 0; }
    sleep 0.2
  done
  tail -n 30 "$LOG" >&2 || true
  die "dockerd did not answer within 30s"
}

cmd_down() {
  mkdir -p "$STATE"
  exec 9>"$STATE/.lock"
  flock 9
  ours_running || { log "no dockerd of ours is running"; return 0; }
  local pid _
  pid=$(<"$PIDFILE")
  log "stopping dockerd (pid $pid)"
  kill -TERM "$pid"
  for _ in $(seq 1 150); do
    [[ -d /proc/$pid ]] || { log "dockerd stopped"; return 0; }
    sleep 0.2
  done
  kill -KILL "$pid" 2>/dev/null || true
}

cmd_status() {
  if ours_running; then echo "dockerd (ours) pid $(<"$PIDFILE")"; elif engine_answers; then echo "a Docker engine answers on $SOCK"; else echo "no Docker engine"; fi
}

case ${1:-} in
up) cmd_up ;;
down) cmd_down ;;
status) cmd_status ;;
*)
  echo "usage: $0 up|down|status" >&2
  exit 2
  ;;
esac
