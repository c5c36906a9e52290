#!/usr/bin/env bash
# node.sh: the Node.js toolchain of the Paperclip plugin (plugins/paperclip) and of Paperclip's
# server (hack/paperclip/paperclip.sh), from the npm registry.
#
#   node.sh [bin]          install (once) and print the toolchain's bin dir
#   node.sh env            install and print `export PATH=…` lines for eval
#   node.sh exec CMD ARG…  run CMD with the toolchain first on PATH
#   node.sh version        print the pinned Node version
#
# Why: Paperclip's plugin SDK and server need Node >= 24.11; Debian 12 ships Node 18 (and a
# machine may have another, or none). The npm package node-linux-<arch> carries the official Node
# binary, and the package npm carries npm itself; both are fetched from the registry with curl as
# plain tarballs, checked against the integrity pinned here, and unpacked into
# $KUBECLIP_CACHE/node/<node>-npm<npm> (default ~/.cache/kubeclip): bin/node, bin/npm, bin/npx,
# the layout of Node's own distribution. Nothing of the machine's own Node or npm is used, so a
# fresh machine needs only curl (installed when missing, as root). npm's download cache is
# $KUBECLIP_CACHE/npm, for every command run through `exec`; the tarballs stay in
# $KUBECLIP_CACHE/node (the sandbox image takes its node from the same file).
#
# Idempotent and safe to run concurrently: a lock serialises installs, an install is staged in a
# temporary dir and moved into place only when complete, so a half-done install is never used.
set -Eeuo pipefail

# The version paperclip-plugin-contract.md ran the real Paperclip server with (>= 24.11), and an
# npm of the same months (the plugin's lockfile is npm 11's).
NODE_VERSION=24.21.0
NPM_VERSION=11.19.1
# `npm view <package>@<version> dist.integrity`
NODE_INTEGRITY_x64=sha512-3nULszZ5X0fciYpG0t6TrdApJzAn8+FlINP6OiMX7V8HrvpATPN936U1LlReOJriLRa4e8yEqQBYCnLyPNAs7Q==
NODE_INTEGRITY_arm64=sha512-FpJRPEz2OvvTLfjIOlNGFY9JLPMKgl5m+d4oGYBLg24kJ1mmvN1Zl/HPJgF4HDaJ51ISev1l1cRZ/DM+keXW5g==
NPM_INTEGRITY=sha512-ztsxKxt/kkIaAs+2i0GU6I+DRmUdrNasxTZKJe9TCdSjKxlhah/4r/hl5ygMD6XAg1qZ9c2TNomR4qgOydp10g==

CACHE=${KUBECLIP_CACHE:-${HOME:-/root}/.cache/kubeclip}
NPM_CACHE=$CACHE/npm
REGISTRY=${npm_config_registry:-https://registry.npmjs.org}
REGISTRY=${REGISTRY%/}

case "$(uname -m)" in
x86_64 | amd64) ARCH=x64 NODE_INTEGRITY=$NODE_INTEGRITY_x64 ;;
aarch64 | arm64) ARCH=arm64 NODE_INTEGRITY=$NODE_INTEGRITY_arm64 ;;
*)
	echo "node.sh: unsupported machine $(uname -m) (need x86_64 or aarch64)" >&2
	exit 1
	;;
esac
PKG=node-linux-$ARCH
DIR=$CACHE/node/$NODE_VERSION-npm$NPM_VERSION
BIN=$DIR/bin

die() {
	echo "node.sh: $*" >&2
	exit 1
}

installed() {
	[[ -x $BIN/node && -e $BIN/npm ]] && [[ $("$BIN/node" --version 2>/dev/null) == "v$NODE_VERSION" ]]
}

# integrity_ok FILE SRI: the file's sha512 is the Subresource Integrity string's.
integrity_ok() {
	local want
	want=$(base64 -d <<<"${2#sha512-}" | od -An -v -tx1 | tr -d ' \n')
	[[ $(sha512sum "$1" | cut -d' ' -f1) == "$want" ]]
}

# ensure_curl: curl, installed from Debian's packages when missing (root only).
ensure_curl() {
	command -v curl >/dev/null && return 0
	local apt
	apt=$(dirname "${BASH_SOURCE[0]}")/../lib/apt.sh
	[[ $(id -u) -eq 0 && -f $apt ]] || die "curl not found: install it (apt-get install curl)"
	# shellcheck source=hack/lib/apt.sh disable=SC1091
	. "$apt"
	apt_install curl ca-certificates
}

# fetch NAME VERSION SRI: the package's registry tarball in $CACHE/node, checked (a cached file
# was checked before it was moved there).
fetch() {
	local name=$1 version=$2 sri=$3 out=$CACHE/node/$1-$2.tgz
	if [[ ! -f $out ]]; then
		ensure_curl
		echo "node.sh: downloading $name@$version" >&2
		local tmp
		tmp=$(mktemp "$out.XXXXXX")
		curl -fsSL --retry 3 -o "$tmp" "$REGISTRY/$name/-/$name-$version.tgz" || {
			rm -f "$tmp"
			die "downloading $REGISTRY/$name/-/$name-$version.tgz failed"
		}
		integrity_ok "$tmp" "$sri" || {
			rm -f "$tmp"
			die "$name@$version does not match its pinned integrity"
		}
		chmod 0644 "$tmp"
		mv -f "$tmp" "$out"
	fi
	echo "$out"
}

install() {
	installed && return 0
	command -v flock >/dev/null || die "flock not found (util-linux)"
	mkdir -p "$CACHE/node" "$NPM_CACHE"
	exec 9>"$CACHE/node/.lock"
	flock 9
	if ! installed; then
		local node_tgz npm_tgz tmp
		node_tgz=$(fetch "$PKG" "$NODE_VERSION" "$NODE_INTEGRITY")
		npm_tgz=$(fetch npm "$NPM_VERSION" "$NPM_INTEGRITY")
		tmp=$(mktemp -d "$CACHE/node/.install.XXXXXX")
		# shellcheck disable=SC2064 # expand now: tmp is local
		trap "rm -rf '$tmp'" EXIT
		echo "node.sh: installing node $NODE_VERSION and npm $NPM_VERSION into $DIR" >&2
		mkdir -p "$tmp/bin" "$tmp/lib/node_modules/npm"
		tar -xzf "$node_tgz" -C "$tmp" --strip-components=1 package/bin/node package/LICENSE
		tar -xzf "$npm_tgz" -C "$tmp/lib/node_modules/npm" --strip-components=1
		ln -s ../lib/node_modules/npm/bin/npm-cli.js "$tmp/bin/npm"
		ln -s ../lib/node_modules/npm/bin/npx-cli.js "$tmp/bin/npx"
		[[ $("$tmp/bin/node" --version) == "v$NODE_VERSION" ]] || die "$PKG@$NODE_VERSION did not unpack a working node"
		[[ $(PATH=$tmp/bin:$PATH "$tmp/bin/npm" --version) == "$NPM_VERSION" ]] || die "npm@$NPM_VERSION did not unpack a working npm"
		chmod 0755 "$tmp"
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
	export npm_config_cache=$NPM_CACHE npm_config_update_notifier=false
	exec "$@"
	;;
version)
	echo "$NODE_VERSION"
	;;
*)
	die "unknown command $cmd (bin, env, exec, version)"
	;;
esac
