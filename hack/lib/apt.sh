# shellcheck shell=bash
# apt.sh: Debian packages for kubeclip's scripts (sourced by hack/cluster/cluster.sh,
# hack/docker/docker.sh and hack/cluster/sandbox-image.sh).
#
# go test runs test packages in parallel, and more than one of them may bring up something that
# installs Debian packages (tests/compose and tests/containers both run hack/docker/docker.sh up).
# apt-get and dpkg allow one of them at a time and fail the others at once ("Could not get lock
# /var/lib/apt/lists/lock"), so every apt-get here runs under one machine-wide lock file, and
# apt_install decides what is missing only once it holds the lock: a process that waited for
# another's install finds the packages there and does nothing. apt-get itself also waits (up to
# DPkg::Lock::Timeout) for dpkg's locks, held by an apt-get that is not ours.

# shellcheck source=hack/lib/progress.sh
. "$(dirname "${BASH_SOURCE[0]}")/progress.sh"

KUBECLIP_APT_LOCK=${KUBECLIP_APT_LOCK:-/var/lib/kubeclip/apt.lock}
# How long to wait for the lock: a cold docker.io install on a slow mirror takes minutes.
KUBECLIP_APT_LOCK_WAIT=${KUBECLIP_APT_LOCK_WAIT:-900}
APT_GET=(apt-get -o DPkg::Lock::Timeout=300)

# apt_missing PKG...: prints the packages that are not installed, one a line.
apt_missing() {
  local p
  for p in "$@"; do
    [[ $(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null) == installed ]] || echo "$p"
  done
}

# apt_locked CMD...: runs CMD holding the lock.
apt_locked() {
  mkdir -p "$(dirname "$KUBECLIP_APT_LOCK")"
  flock -w "$KUBECLIP_APT_LOCK_WAIT" "$KUBECLIP_APT_LOCK" "$@"
}

# apt_install PKG...: installs those of PKG that are missing, without recommends, and keeps their
# maintainer scripts from starting daemons (a system containerd, dockerd or etcd): nothing but
# what our scripts start may run on the machine.
apt_install() {
  mkdir -p "$(dirname "$KUBECLIP_APT_LOCK")"
  (
    flock -w "$KUBECLIP_APT_LOCK_WAIT" 9 || {
      echo "apt_install: waited ${KUBECLIP_APT_LOCK_WAIT}s for $KUBECLIP_APT_LOCK" >&2
      exit 1
    }
    local missing policy=/usr/sbin/policy-rc.d
    mapfile -t missing < <(apt_missing "$@" | sort -u)
    ((${#missing[@]} > 0)) || exit 0
    echo "$(date +%T) [apt] installing Debian packages: ${missing[*]}" >&2
    if [[ ! -e $policy ]]; then
      printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy"
      trap 'rm -f "$policy"' EXIT
    fi
    export DEBIAN_FRONTEND=noninteractive
    with_heartbeat "[apt] apt-get update" "${APT_GET[@]}" update -qq
    with_heartbeat "[apt] installing ${missing[*]}" "${APT_GET[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  ) 9>"$KUBECLIP_APT_LOCK"
}
