#!/usr/bin/env bash
# node.sh: the Node.js toolchain of the Paperclip plugin (plugins/paperclip), from the npm registry.
#
#   node.sh [bin]          install (once) and print the toolchain's bin dir
#   node.sh env            install and print `export PATH=…` lines for eval
#   node.sh exec CMD ARG…  run CMD with the toolchain first on PATH
#   node.sh version        print the pinned Node version
#
# Why: Paperclip's plugin SDK and server need Node >= 24.11; Debian 12 ships Node 20. The npm
# package node-linux-<arch> carries the official Node build (node, npm, npx), so the system npm can
# install it from the registry with no other download. It goes into
# $KUBECLIP_CACHE/node/<version> (default ~/.cache/kubeclip/node/<version>); npm's download cache
# is $KUBECLIP_CACHE/npm, for this install and for every command run through `exec`.
#
# Idempotent and safe to run concurrently: a lock serialises installs, an install is staged in a
# temporary dir and moved into place only when complete, so a half-done install is never used.
set -Eeuo pipefail

# The version paperclip-plugin-contract.md ran the real Paperclip server with (>= 24.11).
NODE_VERSION=24.21.0

CACHE=${KUBECLIP_CACHE:-${HOME:-/root}/.cache/kubeclip}
NPM_CACHE=$CACHE/npm

case "$(uname -m)" in
x86_64 | amd64) ARCH=x64 ;;
aarch64 | arm64) ARCH=arm64 ;;
*)
	echo "node.sh: unsupported machine $(uname -m) (need x86_64 or aarch64)" >&2
	exit 1
	;;
esac
PKG=node-linux-$ARCH
DIR=$CACHE/node/$NODE_VERSION
BIN=$DIR/node_modules/$PKG/bin

die() {
	echo "node.sh: $*" >&2
	exit 1
}

installed() {
	[[ -x $BIN/node ]] && [[ $("$BIN/node" --version 2>/dev/null) == "v$NODE_VERSION" ]]
}

install() {
	installed && return 0
	command -v npm >/dev/null || die "npm not found: install Debian's npm (apt-get install npm) to bootstrap Node $NODE_VERSION"
	command -v flock >/dev/null || die "flock not found (util-linux)"
	mkdir -p "$CACHE/node" "$NPM_CACHE"
	exec 9>"$CACHE/node/.lock"
	flock 9
	if ! installed; then
		local tmp
		tmp=$(mktemp -d "$CACHE/node/.install.XXXXXX")
		# shellcheck disable=SC2064 # expand now: tmp is local
		trap "rm -rf '$tmp'" EXIT
		echo "node.sh: installing $PKG@$NODE_VERSION into $DIR" >&2
		(
			cd "$tmp"
			echo '{"name":"kubeclip-node-toolchain","private":true}' >package.json
			npm_config_cache=$NPM_CACHE npm install --no-audit --no-fund --no-save --no-package-lock \
				--loglevel=error "$PKG@$NODE_VERSION" >&2
		)
		[[ $("$tmp/node_modules/$PKG/bin/node" --version) == "v$NODE_VERSION" ]] ||
			die "$PKG@$NODE_VERSION did not install a working node"
		rm -rf "$DIR"
		mv "$tmp" "$DIR"
		trap - EXIT
	fi
	exec 9>&-
	installed || die "Node $NODE_VERSION is not usable at $BIN"
}

cmd=${1:-bin}
case "$cmd" in
bin)
	install
	echo "$BIN"
	;;
env)
	install
	# shellcheck disable=SC2016 # $PATH is for the eval, not for now
	printf 'export PATH=%q:"$PATH"\nexport npm_config_cache=%q\n' "$BIN" "$NPM_CACHE"
	;;
exec)
	shift
	[[ $# -gt 0 ]] || die "usage: node.sh exec CMD [ARG...]"
	install
	export PATH=$BIN:$PATH
	export npm_config_cache=$NPM_CACHE
	exec "$@"
	;;
version)
	echo "$NODE_VERSION"
	;;
*)
	die "unknown command $cmd (bin, env, exec, version)"
	;;
esac
