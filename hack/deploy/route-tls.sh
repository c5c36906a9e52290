#!/usr/bin/env bash
# route-tls.sh: a new CA and the one certificate every NATS server of a cluster presents on its
# routes (the production overlay's nats.conf: tls verify_and_map, authorization user
# "CN=kubeclip-nats-route"), written as the keys of the Secret kubeclip-nats-routes:
#
#   route-tls.sh DIR NAME...   DIR/ca.crt    the CA a route peer's certificate must chain to
#                              DIR/tls.crt   common name kubeclip-nats-route, for each NAME (a DNS
#                                            name, a wildcard, or an IPv4 address) as a server and
#                                            as a client: a route is both
#                              DIR/tls.key   its private key (P-256)
#
# The CA's key is made in a private temporary directory and removed at the end: nothing can sign
# another route certificate for this CA, so a peer that is not one of these servers never routes.
# A new CA per call: a rotation starts with one (docs/operators.md, Route authentication).
# hack/deploy/secrets.sh calls it with the StatefulSet's names; tests/natscluster with loopback's.
# Needs openssl (3.0 or later: Debian 12's).
set -Eeuo pipefail

[[ $# -ge 2 ]] || { echo "usage: $0 DIR NAME..." >&2; exit 2; }
command -v openssl >/dev/null || { echo "route-tls.sh: openssl is missing (apt-get install openssl)" >&2; exit 1; }
out=$1
shift
# Ten years, as hack/cluster/cluster.sh's CA; rotating is the operator's (docs/operators.md, A 3-node NATS cluster).
days=3650

sans=()
for name in "$@"; do
  [[ $name =~ ^[A-Za-z0-9*.-]+$ ]] || { echo "route-tls.sh: $name is no DNS name, wildcard or IPv4 address" >&2; exit 2; }
  if [[ $name =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]]; then sans+=("IP:$name"); else sans+=("DNS:$name"); fi
done
san=$(IFS=,; echo "${sans[*]}")

umask 077
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# ossl: openssl, its chatter kept unless it fails.
ossl() { openssl "$@" 2>"$tmp/err" || { cat "$tmp/err" >&2; return 1; }; }

ec=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -noenc)
ossl req -x509 "${ec[@]}" -days "$days" -subj "/CN=kubeclip NATS route CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign" \
  -keyout "$tmp/ca.key" -out "$tmp/ca.crt"
ossl req -new "${ec[@]}" -subj "/CN=kubeclip-nats-route" -keyout "$tmp/tls.key" -out "$tmp/tls.csr"
printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" \
  "extendedKeyUsage=serverAuth,clientAuth" "subjectAltName=$san" >"$tmp/ext"
ossl x509 -req -in "$tmp/tls.csr" -CA "$tmp/ca.crt" -CAkey "$tmp/ca.key" -set_serial "0x$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')" \
  -days "$days" -extfile "$tmp/ext" -out "$tmp/tls.crt"
ossl verify -CAfile "$tmp/ca.crt" -purpose sslserver "$tmp/tls.crt" >/dev/null
ossl verify -CAfile "$tmp/ca.crt" -purpose sslclient "$tmp/tls.crt" >/dev/null
mv "$tmp/ca.crt" "$tmp/tls.crt" "$tmp/tls.key" "$out/"
