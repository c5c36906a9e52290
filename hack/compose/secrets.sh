#!/usr/bin/env bash
# secrets.sh: the local stack's secrets (docker-compose.yaml), random and made once per directory:
#
#   secrets.sh DIR     DIR/secrets.env   the NATS users' passwords and KUBECLIP_COMPOSE_SANDBOX_KEY,
#                                        for `docker compose --env-file DIR/secrets.env ...`
#                      DIR/sandbox-key   the sandbox master key (64 hex digits), readable by the
#                                        images' uid 65532 (owned by it when run as root)
#                      DIR/broker/       the credential broker's ca.crt and ca.key (an installation
#                                        CA made by `credential-broker ca`: kubeclip's own code, the
#                                        built-in bindings' hosts) and sealing.key (32 random
#                                        bytes), readable by uid 65532 likewise
#
# Existing files are kept, so the stack keeps its passwords and keys across `up` and `down`; a
# NATS user's password missing from an existing secrets.env (a user added since: status) is added,
# and so is the broker's directory. KUBECLIP_CREDENTIAL_BROKER names a credential-broker binary
# to make the CA with (default: built from this checkout with go).
# Nothing secret is printed. These are for a developer's machine; an installation's secrets are
# its operator's (README, Deploy).
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
[[ $# -eq 1 ]] || { echo "usage: $0 DIR" >&2; exit 2; }
mkdir -p "$1"
DIR=$(cd "$1" && pwd)
chmod 0700 "$DIR"
umask 077

log() { printf '%s [compose-secrets] %s\n' "$(date +%T)" "$*" >&2; }
hex() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }

# readable: a secret file (or directory) bind-mounted into the containers, which run as the
# images' uid 65532: owned by it and readable by it alone when this runs as root; else readable
# by anyone, and DIR (0700) keeps other users out (a bind mount needs no path to it).
readable() {
  if [[ $(id -u) -eq 0 ]]; then
    chown 65532:65532 "$1"
    if [[ -d $1 ]]; then chmod 0500 "$1"; else chmod 0400 "$1"; fi
  elif [[ -d $1 ]]; then
    chmod 0755 "$1"
  else
    chmod 0444 "$1"
  fi
}

key=$DIR/sandbox-key
if [[ ! -s $key ]]; then
  hex 32 >"$key.tmp"
  readable "$key.tmp"
  mv "$key.tmp" "$key"
  log "made $key"
fi

# The credential broker's CA and sealing key, made together (a new CA must be trusted again by
# every brokered pod, a new sealing key loses every grant): the directory appears complete or
# not at all.
broker=$DIR/broker
if [[ ! -d $broker ]]; then
  rm -rf "$broker.tmp"
  mkdir "$broker.tmp"
  bin=${KUBECLIP_CREDENTIAL_BROKER:-}
  if [[ -z $bin ]]; then
    (cd "$ROOT" && go build -o "$broker.tmp/.credential-broker" ./cmd/credential-broker)
    bin=$broker.tmp/.credential-broker
  fi
  "$bin" ca --out-cert "$broker.tmp/ca.crt" --out-key "$broker.tmp/ca.key"
  rm -f "$broker.tmp/.credential-broker"
  head -c 32 /dev/urandom >"$broker.tmp/sealing.key"
  for f in ca.crt ca.key sealing.key; do readable "$broker.tmp/$f"; done
  readable "$broker.tmp"
  mv "$broker.tmp" "$broker"
  log "made $broker"
fi

# The NATS users' password variables (KUBECLIP_NATS_PASSWORD_<v>) nats-auth.conf reads.
users=(WORKERS EXEC_WORKER BROKER PAPERCLIP CLI STATUS)

env=$DIR/secrets.env
if [[ ! -s $env ]]; then
  {
    # A letter first: nats-server would read an all-digit password as a number.
    for v in "${users[@]}"; do printf 'KUBECLIP_NATS_PASSWORD_%s=p%s\n' "$v" "$(hex 24)"; done
    printf 'KUBECLIP_COMPOSE_SANDBOX_KEY=%s\n' "$key"
    printf 'KUBECLIP_COMPOSE_BROKER_DIR=%s\n' "$broker"
  } >"$env.tmp"
  mv "$env.tmp" "$env"
  log "made $env"
else
  for v in "${users[@]}"; do
    if ! grep -q "^KUBECLIP_NATS_PASSWORD_$v=" "$env"; then
      printf 'KUBECLIP_NATS_PASSWORD_%s=p%s\n' "$v" "$(hex 24)" >>"$env"
      log "added KUBECLIP_NATS_PASSWORD_$v to $env"
    fi
  done
  if ! grep -q "^KUBECLIP_COMPOSE_BROKER_DIR=" "$env"; then
    printf 'KUBECLIP_COMPOSE_BROKER_DIR=%s\n' "$broker" >>"$env"
    log "added KUBECLIP_COMPOSE_BROKER_DIR to $env"
  fi
fi
