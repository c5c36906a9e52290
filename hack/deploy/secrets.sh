#!/usr/bin/env bash
# secrets.sh: creates kubeclip's four per-installation Secrets with random values, each only when
# it is missing (an existing value is never changed: rotating a key is the operator's decision).
# A NATS user added since the Secret was made (status) gets its key added, since nats-server does
# not start without every user's password.
#
#   secrets.sh [NAMESPACE]     default kubeclip; the namespace must exist
#
#   kubeclip-nats-users    keys kubeclip, exec-worker, broker, paperclip, cli, status: each NATS user's password
#                          (48 hex digits), read by nats-server (nats-auth.conf) and the workers
#   kubeclip-sandbox-key   key "key": the sandbox master key (64 hex digits, 32 bytes), read by
#                          the dispatcher and the exec-worker
#   kubeclip-nats-routes   keys ca.crt, tls.crt, tls.key: the NATS cluster's route CA and the
#                          certificate its servers present to each other (hack/deploy/route-tls.sh,
#                          for the StatefulSet's names in NAMESPACE), read by the production
#                          overlay's nats-server; the CA's key is not kept. One missing a key is
#                          refused: delete it and run this again (docs/operators.md, rotation)
#   kubeclip-broker        keys ca.crt, ca.key: the installation CA, name-constrained to the bound
#                          hosts (made by `credential-broker ca`, kubeclip's own code: the built-in
#                          bindings' hosts, or those of the file KUBECLIP_BROKER_BINDINGS names);
#                          sealing.key: 32 random bytes the grants' values are sealed with. Read by
#                          the credential broker. One missing a key is refused, as above: a new CA
#                          means every brokered pod must trust it, a new sealing key loses every
#                          grant
#
# The values go through files in a private temporary directory, never on a command line or to
# the output. Paperclip's, the CLI's and the status user's passwords are read back with
#   kubectl -n NAMESPACE get secret kubeclip-nats-users -o jsonpath='{.data.paperclip}' | base64 -d
# Environment: KUBECTL (default kubectl), KUBECONFIG; KUBECLIP_CREDENTIAL_BROKER, a credential-broker
# binary to make the CA with (default: built here from this checkout with go). Needs openssl for
# the route certificate.
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
NS=${1:-kubeclip}
KUBECTL=${KUBECTL:-kubectl}

log() { printf '%s [secrets] %s\n' "$(date +%T)" "$*" >&2; }

# hex N: N random bytes as lower-case hex.
hex() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }

exists() { "$KUBECTL" -n "$NS" get secret "$1" -o name >/dev/null 2>&1; }

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
chmod 0700 "$dir"

# The NATS users of nats-auth.conf, each a key of kubeclip-nats-users.
users=(kubeclip exec-worker broker paperclip cli status)

# password: a random NATS password. A letter first: nats-server would read an all-digit value as a
# number (nats-auth.conf).
password() { printf 'p%s' "$(hex 24)"; }

if exists kubeclip-nats-users; then
  have=$("$KUBECTL" -n "$NS" get secret kubeclip-nats-users -o go-template='{{range $k, $v := .data}}{{$k}} {{end}}')
  added=()
  for user in "${users[@]}"; do
    [[ " $have " == *" $user "* ]] && continue
    printf '{"data":{"%s":"%s"}}' "$user" "$(password | base64 -w0)" >"$dir/patch.json"
    "$KUBECTL" -n "$NS" patch secret kubeclip-nats-users --type merge --patch-file "$dir/patch.json" >/dev/null
    added+=("$user")
  done
  if ((${#added[@]})); then
    log "kubeclip-nats-users exists in $NS: kept, added random passwords for ${added[*]}"
  else
    log "kubeclip-nats-users exists in $NS: kept"
  fi
else
  mkdir "$dir/nats"
  for user in "${users[@]}"; do
    password >"$dir/nats/$user"
  done
  "$KUBECTL" -n "$NS" create secret generic kubeclip-nats-users --from-file="$dir/nats" >/dev/null
  log "created kubeclip-nats-users in $NS (random passwords for ${users[*]})"
fi

if exists kubeclip-sandbox-key; then
  log "kubeclip-sandbox-key exists in $NS: kept"
else
  hex 32 >"$dir/key"
  "$KUBECTL" -n "$NS" create secret generic kubeclip-sandbox-key --from-file=key="$dir/key" >/dev/null
  log "created kubeclip-sandbox-key in $NS (a random 32-byte master key)"
fi

# The route certificate names every server of the StatefulSet nats (its headless Service
# nats-headless) as the routes in the production overlay's nats.conf reach it, and by its
# namespace-qualified names.
route_names=("*.nats-headless" "*.nats-headless.$NS.svc" "*.nats-headless.$NS.svc.cluster.local")
route_keys=(ca.crt tls.crt tls.key)
if exists kubeclip-nats-routes; then
  have=$("$KUBECTL" -n "$NS" get secret kubeclip-nats-routes -o go-template='{{range $k, $v := .data}}{{$k}} {{end}}')
  for key in "${route_keys[@]}"; do
    if [[ " $have " != *" $key "* ]]; then
      # A certificate is not made for a CA whose key is gone: the three keys go together.
      log "kubeclip-nats-routes in $NS has no $key: delete it and run this again for a new CA and certificate"
      exit 1
    fi
  done
  log "kubeclip-nats-routes exists in $NS: kept"
else
  bash "$(dirname "${BASH_SOURCE[0]}")/route-tls.sh" "$dir/routes" "${route_names[@]}"
  "$KUBECTL" -n "$NS" create secret generic kubeclip-nats-routes --from-file="$dir/routes" >/dev/null
  log "created kubeclip-nats-routes in $NS (a new route CA and certificate for ${route_names[*]})"
fi

# The broker's CA and sealing key go together, like the route CA and its certificate.
broker_keys=(ca.crt ca.key sealing.key)
if exists kubeclip-broker; then
  have=$("$KUBECTL" -n "$NS" get secret kubeclip-broker -o go-template='{{range $k, $v := .data}}{{$k}} {{end}}')
  for key in "${broker_keys[@]}"; do
    if [[ " $have " != *" $key "* ]]; then
      log "kubeclip-broker in $NS has no $key: delete it and run this again for a new CA and sealing key"
      exit 1
    fi
  done
  log "kubeclip-broker exists in $NS: kept"
else
  broker=${KUBECLIP_CREDENTIAL_BROKER:-}
  if [[ -z $broker ]]; then
    (cd "$ROOT" && go build -o "$dir/credential-broker" ./cmd/credential-broker)
    broker=$dir/credential-broker
  fi
  mkdir "$dir/broker"
  # The CA by kubeclip's own code (pkg/broker/ca), so its name constraints are the ones the
  # broker checks at start; it prints the hosts and never the key.
  "$broker" ca --out-cert "$dir/broker/ca.crt" --out-key "$dir/broker/ca.key"
  head -c 32 /dev/urandom >"$dir/broker/sealing.key"
  "$KUBECTL" -n "$NS" create secret generic kubeclip-broker --from-file="$dir/broker" >/dev/null
  log "created kubeclip-broker in $NS (a new installation CA and a random 32-byte sealing key)"
fi
