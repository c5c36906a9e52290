#!/usr/bin/env bash
# secrets.sh: the local stack's secrets (docker-compose.yaml), random and made once per directory:
#
#   secrets.sh DIR     DIR/secrets.env   the NATS users' passwords and KUBECLIP_COMPOSE_SANDBOX_KEY,
#                                        for `docker compose --env-file DIR/secrets.env ...`
#                      DIR/sandbox-key   the sandbox master key (64 hex digits), readable by the
#                                        images' uid 65532 (owned by it when run as root)
#
# Existing files are kept, so the stack keeps its passwords and key across `up` and `down`; a
# NATS user's password missing from an existing secrets.env (a user added since: status) is added.
# Nothing secret is printed. These are for a developer's machine; an installation's secrets are
# its operator's (README, Deploy).
set -Eeuo pipefail

[[ $# -eq 1 ]] || { echo "usage: $0 DIR" >&2; exit 2; }
mkdir -p "$1"
DIR=$(cd "$1" && pwd)
chmod 0700 "$DIR"
umask 077

log() { printf '%s [compose-secrets] %s\n' "$(date +%T)" "$*" >&2; }
hex() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }

key=$DIR/sandbox-key
if [[ ! -s $key ]]; then
  hex 32 >"$key.tmp"
  if [[ $(id -u) -eq 0 ]]; then
    chown 65532:65532 "$key.tmp"
    chmod 0400 "$key.tmp"
  else
    # Bind-mounted into the containers, which run as 65532; DIR (0700) keeps other users out.
    chmod 0444 "$key.tmp"
  fi
  mv "$key.tmp" "$key"
  log "made $key"
fi

# The NATS users' password variables (KUBECLIP_NATS_PASSWORD_<v>) nats-auth.conf reads.
users=(WORKERS EXEC_WORKER BROKER PAPERCLIP CLI STATUS)

env=$DIR/secrets.env
if [[ ! -s $env ]]; then
  {
    # A letter first: nats-server would read an all-digit password as a number.
    for v in "${users[@]}"; do printf 'KUBECLIP_NATS_PASSWORD_%s=p%s\n' "$v" "$(hex 24)"; done
    printf 'KUBECLIP_COMPOSE_SANDBOX_KEY=%s\n' "$key"
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
fi
