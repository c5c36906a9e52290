#!/usr/bin/env bash
# run.sh: what two maintained tar libraries for Node, tar-stream and modern-tar, read from
# kubeclip's archive corpus (testdata/archives), beside kubeclip's own outcome for each archive;
# the evidence for plugins/paperclip/README.md "Why the plugin writes its own tar". The
# libraries are installed in a scratch directory (removed after), never into the plugin.
#
#   bash hack/tarprobe/run.sh [tar-stream version] [modern-tar version]
set -Eeuo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
node_sh=$root/hack/node/node.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cp "$root/hack/tarprobe/probe.mjs" "$work/"
cd "$work"
"$node_sh" exec npm init -y >/dev/null
"$node_sh" exec npm install --no-audit --no-fund --silent "tar-stream@${1:-3.3.0}" "modern-tar@${2:-0.8.7}"
"$node_sh" exec node probe.mjs "$root/testdata/archives"
