#!/usr/bin/env bash
# demo.sh: kubeclip under the real Paperclip server, on the local cluster (`make demo-paperclip`).
#
#   demo.sh BIN NATS_SERVER KUBECONFIG
#
# Starts a JetStream server (the nats-server kubeclip pins, on a free port), kubeclip's worker
# binaries from BIN (tenant-worker, dispatcher, run-watcher, two exec-workers, sharing a fresh
# sandbox key), the real Paperclip server from npm (paperclip.sh) with the plugin installed from
# this checkout, a `kubernetes` environment on the cluster's sandbox image, and one agent run
# whose live log `paperclipai heartbeat run` prints here. Then it prints Paperclip's address and
# keeps everything running until Ctrl-C (KUBECLIP_DEMO_EXIT=1: stop right after the run, as a
# script would). Everything it started is stopped on exit and the tenant namespace deleted.
#
# Needs root (Paperclip's embedded PostgreSQL runs as the user paperclip.sh creates), curl, and
# the cluster up (make cluster-up); `make demo-paperclip` prepares BIN, NATS_SERVER and the
# plugin's dependencies.
set -Eeuo pipefail

BIN=${1:?usage: demo.sh BIN NATS_SERVER KUBECONFIG}
NATS_SERVER=${2:?usage: demo.sh BIN NATS_SERVER KUBECONFIG}
KUBECONFIG_FILE=${3:?usage: demo.sh BIN NATS_SERVER KUBECONFIG}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PAPERCLIP_SH=$ROOT/hack/paperclip/paperclip.sh
NODE_SH=$ROOT/hack/node/node.sh
SANDBOX_IMAGE=kubeclip.local/sandbox:dev

DIR=$(mktemp -d /tmp/kubeclip-demo-paperclip.XXXXXX)
chmod 0755 "$DIR"
export KUBECLIP_PAPERCLIP_STATE=$DIR/paperclip
PIDS=()
COMPANY=""

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
die() {
	echo "demo.sh: $*" >&2
	exit 1
}

cleanup() {
	set +e
	say "stopping"
	bash "$PAPERCLIP_SH" stop >/dev/null 2>&1
	# The workers drain on SIGTERM; the JetStream server goes last.
	for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do kill -TERM "${PIDS[i]}" 2>/dev/null && wait "${PIDS[i]}" 2>/dev/null; done
	if [[ -n $COMPANY ]]; then
		# The tenant namespace kubeclip made for Paperclip's company (kubectl from PATH or the
		# cluster harness's build of it).
		local kubectl
		kubectl=$(command -v kubectl || find "${KUBECLIP_CACHE:-$HOME/.cache/kubeclip}/k8s" -path "*/bin/kubectl" 2>/dev/null | head -1)
		if [[ -z $kubectl ]] || ! "$kubectl" --kubeconfig "$KUBECONFIG_FILE" delete namespace "paperclip-$COMPANY" --wait=false >/dev/null 2>&1; then
			echo "delete the tenant namespace paperclip-$COMPANY when done"
		fi
	fi
	echo "logs: $DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for b in tenant-worker dispatcher run-watcher exec-worker; do [[ -x $BIN/$b ]] || die "$BIN/$b missing (make build)"; done
command -v curl >/dev/null || die "curl is needed"

# json EXPR: evaluates EXPR on the JSON object d read from stdin (Node 24 from hack/node/node.sh).
json() {
	"$NODE_SH" exec node -e 'let s="";process.stdin.on("data",c=>s+=c).on("end",()=>{const d=JSON.parse(s);const v=('"$1"');if(v===undefined||v===null)process.exit(1);console.log(typeof v==="string"?v:JSON.stringify(v))})'
}

api() { # METHOD PATH [BODY]
	local out body=()
	[[ -z ${3:-} ]] || body=(-d "$3")
	out=$(curl -sS -X "$1" -H 'content-type: application/json' "${body[@]}" -w '\n%{http_code}' "$PAPERCLIP_URL/api$2") || die "$1 $2 failed"
	local code=${out##*$'\n'}
	[[ $code == 2* ]] || die "$1 $2: HTTP $code: ${out%$'\n'*}"
	printf '%s' "${out%$'\n'*}"
}

say "kubeclip: JetStream and the workers (logs in $DIR)"
PORT=$("$NODE_SH" exec node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
NATS_URL=nats://127.0.0.1:$PORT
"$NATS_SERVER" -js -a 127.0.0.1 -p "$PORT" -sd "$DIR/jetstream" -n kubeclip-demo >"$DIR/nats-server.log" 2>&1 &
PIDS+=($!)
head -c 32 /dev/urandom | od -An -v -tx1 | tr -d ' \n' >"$DIR/sandbox.key"
chmod 0600 "$DIR/sandbox.key"
common=(--nats-url "$NATS_URL" --kubeconfig "$KUBECONFIG_FILE")
start_worker() { # NAME BINARY ARGS…
	local name=$1 bin=$2
	shift 2
	"$BIN/$bin" "${common[@]}" "$@" >"$DIR/$name.log" 2>&1 &
	PIDS+=($!)
}
for ((i = 0; i < 50; i++)); do
	grep -q "Server is ready" "$DIR/nats-server.log" 2>/dev/null && break
	sleep 0.1
done
start_worker tenant-worker tenant-worker
start_worker dispatcher dispatcher --sandbox-key-file "$DIR/sandbox.key"
start_worker run-watcher run-watcher --replica-id run-watcher-1
start_worker exec-worker-1 exec-worker --sandbox-key-file "$DIR/sandbox.key" --replica-id exec-worker-1
start_worker exec-worker-2 exec-worker --sandbox-key-file "$DIR/sandbox.key" --replica-id exec-worker-2
echo "JetStream at $NATS_URL; tenant-worker, dispatcher, run-watcher, exec-worker ×2"

say "Paperclip: the real server from npm, the plugin from this checkout"
bash "$PAPERCLIP_SH" install
bash "$PAPERCLIP_SH" start >"$DIR/paperclip.env"
# shellcheck disable=SC1091
. "$DIR/paperclip.env"
COMPANY=$PAPERCLIP_COMPANY_ID
bash "$PAPERCLIP_SH" plugin-install "$ROOT/plugins/paperclip" >/dev/null
# kubeclip's connection is the operator's: the plugin's settings, never an environment's config.
api POST "/plugins/kubeclip.paperclip-sandbox-provider/config" "{\"companyId\":\"$COMPANY\",\"configJson\":{\"natsUrl\":\"$NATS_URL\"}}" >/dev/null

say "an environment on kubeclip, and the agent on it"
config=$(
	cat <<EOF
{"name": "kubeclip", "driver": "sandbox", "config": {
  "provider": "kubernetes", "backend": "pod", "streamRunLogs": false,
  "podActivityDeadlineSec": 900,
  "adapters": [{"adapterType": "claude_local", "runtimeImage": "$SANDBOX_IMAGE",
                "envKeys": ["ANTHROPIC_API_KEY"], "allowFqdns": ["api.anthropic.com"]}],
  "defaultResources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}}}}
EOF
)
ENV_ID=$(api POST "/companies/$COMPANY/environments" "$config" | json 'd.id')
adapter=$(api GET "/agents/$PAPERCLIP_AGENT_ID" | json '({...d.adapterConfig, engine: "cli"})')
api PATCH "/agents/$PAPERCLIP_AGENT_ID" "{\"defaultEnvironmentId\":\"$ENV_ID\",\"adapterConfig\":$adapter}" >/dev/null
echo "environment $ENV_ID (provider kubernetes = the kubeclip plugin), agent $PAPERCLIP_AGENT_ID (claude_local, the sandbox's stub claude)"

say "one agent run, its live log as Paperclip records it"
bash "$PAPERCLIP_SH" cli heartbeat run -a "$PAPERCLIP_AGENT_ID" --timeout-ms 300000

say "what kubeclip recorded"
run=$(api GET "/companies/$COMPANY/heartbeat-runs?limit=1" | json 'd[0].id')
# Paperclip records the release just after the run: wait for the lease to leave "active".
for ((i = 0; i < 60; i++)); do
	lease=$(api GET "/environments/$ENV_ID/leases" | json 'd.find(l => l.heartbeatRunId === "'"$run"'")')
	[[ $(json 'd.status' <<<"$lease") == active ]] || break
	sleep 0.5
done
printf 'lease %s: %s, receipt %s\n' "$(json 'd.providerLeaseId' <<<"$lease")" "$(json 'd.status' <<<"$lease")" \
	"$(json 'd.metadata.remoteExecutionTermination.state' <<<"$lease" || echo none)"
"$BIN/kubeclip" runs replay "$run" --company "$COMPANY" --nats-url "$NATS_URL" 2>&1 | tail -n 12 || true

say "Paperclip's UI: $PAPERCLIP_URL   (company $COMPANY, agent $PAPERCLIP_AGENT_ID, run $run)"
if [[ ${KUBECLIP_DEMO_EXIT:-0} == 1 ]]; then exit 0; fi
echo "Paperclip, the plugin and kubeclip keep running: start more runs from the UI. Ctrl-C stops everything."
while sleep 3600; do :; done
