#!/usr/bin/env bash
# secrets.sh: creates kubeclip's two per-installation Secrets with random values, each only when
# it is missing (an existing one is never changed: rotating a key is the operator's decision).
#
#   secrets.sh [NAMESPACE]     default kubeclip; the namespace must exist
#
#   kubeclip-nats-users    keys kubeclip, exec-worker, paperclip, cli: each NATS user's password
#                          (48 hex digits), read by nats-server (nats-auth.conf) and the workers
#   kubeclip-sandbox-key   key "key": the sandbox master key (64 hex digits, 32 bytes), read by
#                          the dispatcher and the exec-worker
#
# The values go through files in a private temporary directory, never on a command line or to
# the output. Paperclip's and the CLI's passwords are read back with
#   kubectl -n NAMESPACE get secret kubeclip-nats-users -o jsonpath='{.data.paperclip}' | base64 -d
# Environment: KUBECTL (default kubectl), KUBECONFIG.
set -Eeuo pipefail

NS=${1:-kubeclip}
KUBECTL=${KUBECTL:-kubectl}

log() { printf '%s [secrets] %s\n' "$(date +%T)" "$*" >&2; }

# hex N: N random bytes as lower-case hex.
hex() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }

exists() { "$KUBECTL" -n "$NS" get secret "$1" -o name >/dev/null 2>&1; }

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
chmod 0700 "$dir"

if exists kubeclip-nats-users; then
  log "kubeclip-nats-users exists in $NS: kept"
else
  mkdir "$dir/nats"
  for user in kubeclip exec-worker paperclip cli; do
    # A letter first: nats-server would read an all-digit value as a number (nats-auth.conf).
    printf 'p%s' "$(hex 24)" >"$dir/nats/$user"
  done
  "$KUBECTL" -n "$NS" create secret generic kubeclip-nats-users --from-file="$dir/nats" >/dev/null
  log "created kubeclip-nats-users in $NS (random passwords for kubeclip, exec-worker, paperclip, cli)"
fi

if exists kubeclip-sandbox-key; then
  log "kubeclip-sandbox-key exists in $NS: kept"
else
  hex 32 >"$dir/key"
  "$KUBECTL" -n "$NS" create secret generic kubeclip-sandbox-key --from-file=key="$dir/key" >/dev/null
  log "created kubeclip-sandbox-key in $NS (a random 32-byte master key)"
fi
