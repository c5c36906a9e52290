#!/usr/bin/env bash
# cluster.sh: kubeclip's own single-node Kubernetes cluster for tests.
#
#   cluster.sh up          (re)start a fresh cluster, import the test images, install the test CRDs,
#                          run the agent-sandbox controller
#   cluster.sh down        stop everything, unmount, leave nothing running
#   cluster.sh status      show what runs
#   cluster.sh kubeconfig  print the admin kubeconfig path
#   cluster.sh images      rebuild the test images and import them into the running cluster
#   cluster.sh storage     (re)install the storage provisioner into the running cluster
#
# What runs: etcd (Debian etcd-server), kube-apiserver, kube-controller-manager, kube-scheduler and
# kubelet (built from hack/k8s and cached under $KUBECLIP_CACHE), containerd (Debian) with its own
# config, root, state and socket, and in the cluster a dynamic storage provisioner (rancher's
# local-path-provisioner, StorageClass kubeclip-local, the default; volumes are directories under
# $STATE/local-path), and beside them agent-sandbox's controller (kubernetes-sigs/agent-sandbox,
# the version AGENT_SANDBOX_VERSION pins, built from the Go module proxy and cached like the
# Kubernetes binaries), run out of cluster with the admin kubeconfig, its CRDs installed from the
# same module: the `sandbox-cr` backend's tests run against it. No systemd: every daemon is a background process with a pidfile
# in $STATE/run and a log in $STATE/logs. Facts and gotchas behind the settings below:
# ../shared/notes/local-kubernetes.md.
#
# Environment:
#   KUBECLIP_CLUSTER_DIR  state dir (default /var/lib/kubeclip/cluster). internal/clustertest
#                         reads /var/lib/kubeclip/cluster/admin.kubeconfig: when you move the state
#                         dir, point KUBECLIP_KUBECONFIG at $KUBECLIP_CLUSTER_DIR/admin.kubeconfig.
#   KUBECLIP_CACHE        cache of built Kubernetes binaries, of the agent-sandbox controller and
#                         its CRDs, and of the sandbox image's Debian packages, node and tarball
#                         (default ~/.cache/kubeclip)
#   KUBECLIP_KUBECONFIG   use that existing cluster instead: `up` only checks that it answers
#                         (and loads nothing), `down` does nothing.
#   KUBECLIP_NODE_IP      node address (default: the source address of the default route)
#
# One cluster per machine at a time: the ports (6443, 10250, 10248, 10257, 10259, 23790, 23800),
# the bridge kubeclip0 and the pod CIDR are fixed.
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=hack/lib/apt.sh
. "$ROOT/hack/lib/apt.sh"
# The Kubernetes version is the one hack/k8s pins, so the two cannot drift apart.
K8S_VERSION=$(grep -m1 -oE 'k8s\.io/kubernetes v[0-9][^ ]*' "$ROOT/hack/k8s/go.mod" | awk '{print $2}')
CACHE=${KUBECLIP_CACHE:-${HOME:-/root}/.cache/kubeclip}
BIN=$CACHE/k8s/$K8S_VERSION/bin
K8S_COMMANDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)

STATE=${KUBECLIP_CLUSTER_DIR:-/var/lib/kubeclip/cluster}
RUN=$STATE/run
LOGS=$STATE/logs
PKI=$STATE/pki
ADMIN_KUBECONFIG=$STATE/admin.kubeconfig
CONTAINERD_SOCK=$RUN/containerd.sock
# The runc state of our containers, apart from any other containerd's (runc.v2 adds /<namespace>).
RUNC_ROOT=$RUN/runc

# Loopback ports away from etcd's usual 2379/2380, so a system etcd cannot clash with ours.
ETCD_CLIENT_URL=http://127.0.0.1:23790
ETCD_PEER_URL=http://127.0.0.1:23800
APISERVER_PORT=6443
SERVICE_CIDR=10.96.0.0/16
SERVICE_IP=10.96.0.1
POD_CIDR=10.88.0.0/16
BRIDGE=kubeclip0
# iptables rules we add carry this comment, so that cleanup finds exactly ours.
IPT_COMMENT=kubeclip-cluster

IMAGES_DIR=$STATE/images
PAUSE_IMAGE=kubeclip.local/pause:dev
STUB_IMAGE=kubeclip.local/agent-stub:dev
# kubeclip's sandboxd, for the init container that copies it into exec-capable pods.
SANDBOXD_IMAGE=kubeclip.local/sandboxd:dev
# Paperclip's sandbox: a Debian userland, node and the claude stub (hack/cluster/sandbox-image.sh).
SANDBOX_IMAGE=kubeclip.local/sandbox:dev
# The storage provisioner: rancher's local-path-provisioner, the version hack/k8s pins, built there
# (cached under $CACHE like the Kubernetes binaries), its helper pod running hack/local-path-helper,
# and hack/cluster/local-path.yaml.
LOCAL_PATH_VERSION=$(grep -m1 -oE 'github\.com/rancher/local-path-provisioner v[0-9][^ ]*' "$ROOT/hack/k8s/go.mod" | awk '{print $2}')
LOCAL_PATH_BIN=$CACHE/local-path-provisioner/$LOCAL_PATH_VERSION
PROVISIONER_IMAGE=kubeclip.local/local-path-provisioner:$LOCAL_PATH_VERSION
HELPER_IMAGE=kubeclip.local/local-path-helper:dev
# Where the volumes live on the node: inside the state dir, so a fresh `up` starts without them.
LOCAL_PATH_DIR=$STATE/local-path
STORAGE_CLASS=kubeclip-local
IMAGE_TARS=(pause agent-stub sandboxd sandbox local-path-provisioner local-path-helper)
# agent-sandbox: an exact version, because the module proxy serves only some (v1.0.1 and, asked by
# exact version, v1.0.3; it refuses v1.0.2 and v1.0.4 and later). Its binary and CRDs are cached
# together under $AGENT_SANDBOX_DIR.
AGENT_SANDBOX_MODULE=sigs.k8s.io/agent-sandbox
AGENT_SANDBOX_VERSION=v1.0.3
AGENT_SANDBOX_DIR=$CACHE/agent-sandbox/$AGENT_SANDBOX_VERSION
AGENT_SANDBOX_BIN=$AGENT_SANDBOX_DIR/bin/agent-sandbox-controller
# The version stamped in as upstream's Makefile does, so its log and --version name it.
AGENT_SANDBOX_LDFLAGS="-s -w -X $AGENT_SANDBOX_MODULE/internal/version.gitVersion=$AGENT_SANDBOX_VERSION"
AGENT_SANDBOX_STAMP="$AGENT_SANDBOX_MODULE@$AGENT_SANDBOX_VERSION -trimpath $AGENT_SANDBOX_LDFLAGS"
# Its health endpoint (/readyz), on loopback: `up` waits on it. Metrics are off.
AGENT_SANDBOX_PROBE=127.0.0.1:10281
CRD_NAMES=(sandboxes.agents.x-k8s.io sandboxclaims.extensions.agents.x-k8s.io sandboxtemplates.extensions.agents.x-k8s.io
  sandboxwarmpools.extensions.agents.x-k8s.io ciliumnetworkpolicies.cilium.io)

# Say where `up` stopped and where the logs are, instead of exiting silently under set -e.
# shellcheck disable=SC2154 # rc is assigned inside the trap
trap 'rc=$?; log "failed (exit $rc) at line $LINENO: $BASH_COMMAND; daemon logs: $LOGS"; exit $rc' ERR

log() { printf '%s [cluster] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
now_ms() { date +%s%3N; }

# phase NAME: prints how long the previous phase took (the "print timing" part of `up`).
PHASE_START=0
PHASE_NAME=
UP_START=0
phase() {
  local t
  t=$(now_ms)
  [[ -n $PHASE_NAME ]] && log "$(printf '%-28s %6d ms' "$PHASE_NAME" $((t - PHASE_START)))"
  PHASE_NAME=$1
  PHASE_START=$t
}

# ---------------------------------------------------------------------------------------------
# Host preparation

# A fresh CI machine has none of the Debian packages: install what is missing, once.
ensure_packages() {
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v ctr >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  command -v etcd >/dev/null || missing+=(etcd-server)
  [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/portmap && -x /usr/lib/cni/loopback ]] ||
    missing+=(containernetworking-plugins)
  command -v iptables >/dev/null || missing+=(iptables)
  command -v conntrack >/dev/null || missing+=(conntrack)
  command -v socat >/dev/null || missing+=(socat)
  command -v openssl >/dev/null || missing+=(openssl)
  command -v curl >/dev/null || missing+=(curl)
  command -v ip >/dev/null || missing+=(iproute2)
  command -v ps >/dev/null || missing+=(procps)
  command -v flock >/dev/null || missing+=(util-linux)
  # Not the cluster's: tests/exec drives `kubeclip exec -t` in a tmux window.
  command -v tmux >/dev/null || missing+=(tmux)
  command -v go >/dev/null || die "go is not on PATH (needed to build the Kubernetes binaries and test images)"
  ((${#missing[@]} == 0)) && return 0
  # apt_install keeps the packages from starting daemons of their own (a system containerd or
  # etcd), and waits for any other kubeclip script's apt-get.
  apt_install "${missing[@]}"
}

# Kubernetes binaries are built from hack/k8s (its own module) and cached. The version is stamped
# in so the apiserver and kubelet report v1.34.x instead of v0.0.0-master, which client tooling
# cannot parse. The stamp file records the build inputs: a cache built differently is rebuilt.
K8S_LDFLAGS="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  K8S_LDFLAGS+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitTreeState=clean"
  K8S_LDFLAGS+=" -X $pkg.gitMajor=$(cut -d. -f1 <<<"${K8S_VERSION#v}") -X $pkg.gitMinor=$(cut -d. -f2 <<<"$K8S_VERSION")"
done
K8S_STAMP="$K8S_VERSION ${K8S_COMMANDS[*]} $K8S_LDFLAGS"

k8s_binaries_cached() {
  [[ -f $BIN/.stamp && $(<"$BIN/.stamp") == "$K8S_STAMP" ]] || return 1
  local c
  for c in "${K8S_COMMANDS[@]}"; do [[ -x $BIN/$c ]] || return 1; done
}

ensure_k8s_binaries() {
  k8s_binaries_cached && return 0
  mkdir -p "$(dirname "$BIN")"
  # One build at a time per cache, even when two `up`s race.
  exec 9>"$(dirname "$BIN")/.build.lock"
  flock 9
  if ! k8s_binaries_cached; then
    rm -rf "$BIN".tmp.* # left by a build that was killed (we hold the lock: none is running)
    log "building Kubernetes $K8S_VERSION (${K8S_COMMANDS[*]}) into $BIN (cold: ~7-10 min on 2 cores)"
    # Build into a temporary dir and move it into place, so an interrupted build is never taken
    # for a cached one.
    local tmp pkgs=() c
    tmp=$(mktemp -d "$BIN.tmp.XXXXXX")
    for c in "${K8S_COMMANDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
    CGO_ENABLED=0 go_progress "building Kubernetes $K8S_VERSION" "$ROOT/hack/k8s" "${pkgs[@]}" -- \
      go build -v -trimpath -ldflags="$K8S_LDFLAGS" -o "$tmp/" "${pkgs[@]}" ||
      { rm -rf "$tmp"; die "building Kubernetes binaries failed"; }
    printf '%s' "$K8S_STAMP" >"$tmp/.stamp"
    rm -rf "$BIN.old"
    [[ -e $BIN ]] && mv "$BIN" "$BIN.old"
    mv "$tmp" "$BIN"
    rm -rf "$BIN.old"
  fi
  flock -u 9
  exec 9>&-
}

# ---------------------------------------------------------------------------------------------
# The agent-sandbox controller

agent_sandbox_cached() {
  [[ -x $AGENT_SANDBOX_BIN && $(cat "$AGENT_SANDBOX_DIR/.stamp" 2>/dev/null) == "$AGENT_SANDBOX_STAMP" ]] &&
    compgen -G "$AGENT_SANDBOX_DIR/crds/*.yaml" >/dev/null
}

# ensure_agent_sandbox builds the controller with `go install` of the pinned version (its own
# go.mod and go.sum: nothing of it enters kubeclip's modules) and copies the CRDs of the same
# module version beside it, so a cached controller never runs against another version's CRDs.
# Cold: 11.6 min measured on 2 busy cores (load ~15; ~6 min on quiet ones); cached: nothing.
ensure_agent_sandbox() {
  agent_sandbox_cached && return 0
  mkdir -p "$(dirname "$AGENT_SANDBOX_DIR")"
  exec 6>"$(dirname "$AGENT_SANDBOX_DIR")/.build.lock"
  flock 6
  if ! agent_sandbox_cached; then
    rm -rf "$AGENT_SANDBOX_DIR".tmp.*
    log "building the agent-sandbox controller $AGENT_SANDBOX_VERSION into $AGENT_SANDBOX_DIR (cold: ~6-12 min on 2 cores)"
    local tmp dir
    tmp=$(mktemp -d "$AGENT_SANDBOX_DIR.tmp.XXXXXX")
    # Outside any module (kubeclip's go.work or go.mod must not steer the build).
    GOBIN=$tmp/bin CGO_ENABLED=0 GOWORK=off go_progress "building agent-sandbox $AGENT_SANDBOX_VERSION" "$tmp" -- \
      go install -v -trimpath -ldflags="$AGENT_SANDBOX_LDFLAGS" "$AGENT_SANDBOX_MODULE/cmd/agent-sandbox-controller@$AGENT_SANDBOX_VERSION" ||
      { rm -rf "$tmp"; die "building the agent-sandbox controller $AGENT_SANDBOX_VERSION failed"; }
    dir=$(cd "$tmp" && GOWORK=off go mod download -json "$AGENT_SANDBOX_MODULE@$AGENT_SANDBOX_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [[ -n $dir && -d $dir/k8s/crds ]] || { rm -rf "$tmp"; die "no CRDs in the module $AGENT_SANDBOX_MODULE@$AGENT_SANDBOX_VERSION (looked in ${dir:-?}/k8s/crds)"; }
    mkdir -p "$tmp/crds"
    cp "$dir"/k8s/crds/*.yaml "$tmp/crds/"
    chmod -R u+w "$tmp/crds" # the module cache is read-only
    printf '%s' "$AGENT_SANDBOX_STAMP" >"$tmp/.stamp"
    rm -rf "$AGENT_SANDBOX_DIR"
    mv "$tmp" "$AGENT_SANDBOX_DIR"
  fi
  flock -u 6
  exec 6>&-
}

# start_agent_sandbox_build starts ensure_agent_sandbox in the background (a cold build overlaps
# the Kubernetes build and the cluster's start); await_agent_sandbox_build collects it.
AGENT_SANDBOX_BUILD_PID=
start_agent_sandbox_build() {
  agent_sandbox_cached && return 0
  mkdir -p "$CACHE/agent-sandbox"
  ensure_agent_sandbox >"$CACHE/agent-sandbox/build.log" 2>&1 &
  AGENT_SANDBOX_BUILD_PID=$!
}
await_agent_sandbox_build() {
  if [[ -n $AGENT_SANDBOX_BUILD_PID ]]; then
    if ! PROGRESS_TAIL=$CACHE/agent-sandbox/build.log with_heartbeat "building the agent-sandbox controller (log: $CACHE/agent-sandbox/build.log)" \
      wait "$AGENT_SANDBOX_BUILD_PID"; then
      tail -n 30 "$CACHE/agent-sandbox/build.log" >&2
      die "building the agent-sandbox controller failed (log: $CACHE/agent-sandbox/build.log)"
    fi
    AGENT_SANDBOX_BUILD_PID=
  fi
  ensure_agent_sandbox
}

detect_node() {
  NODE_NAME=$(uname -n | tr '[:upper:]' '[:lower:]')
  NODE_IP=${KUBECLIP_NODE_IP:-$(ip -4 route get 1.1.1.1 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "src") {print $(i + 1); exit}}')}
  if [[ -z $NODE_IP ]]; then # no default route: take the first global address
    NODE_IP=$(ip -4 -o addr show scope global | awk '{split($4, a, "/"); print a[1]; exit}')
  fi
  [[ -n $NODE_IP ]] || die "cannot find this machine's IPv4 address; set KUBECLIP_NODE_IP"
  # Pods get the MTU of the node's interface (1400 on some cloud VMs), not a blind 1500.
  local dev
  dev=$(ip -4 -o addr show | awk -v ip="$NODE_IP" '{split($4, a, "/"); if (a[1] == ip) {print $2; exit}}')
  NODE_MTU=$(cat "/sys/class/net/${dev:-none}/mtu" 2>/dev/null || echo 1500)
}

# The apiserver reaches the kubelet by address (see --kubelet-preferred-address-types), but logs
# and exec also need the node name to resolve: add a hosts line when it does not.
ensure_hosts_entry() {
  getent hosts "$NODE_NAME" >/dev/null && return 0
  log "adding '$NODE_IP $NODE_NAME' to /etc/hosts"
  printf '%s %s # kubeclip\n' "$NODE_IP" "$NODE_NAME" >>/etc/hosts
}

# Pod networking: forwarding on, bridged traffic through iptables, pod egress masqueraded, and the
# `kubernetes` Service IP DNATed to the apiserver (there is no kube-proxy). Each step may be
# impossible on a locked-down host; the cluster still works for what the tests need (node-local
# pods reaching the node IP), so failures are warnings.
setup_host_network() {
  echo 1 >/proc/sys/net/ipv4/ip_forward 2>/dev/null || log "warning: cannot enable net.ipv4.ip_forward (pod egress beyond the node will fail)"
  if [[ ! -e /proc/sys/net/bridge/bridge-nf-call-iptables ]] && command -v modprobe >/dev/null; then
    modprobe br_netfilter 2>/dev/null || true
  fi
  if [[ -e /proc/sys/net/bridge/bridge-nf-call-iptables ]]; then
    echo 1 >/proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null || log "warning: cannot set bridge-nf-call-iptables"
  else
    log "warning: br_netfilter is not available (only matters for Service traffic between pods)"
  fi
  local c=(-m comment --comment "$IPT_COMMENT")
  if ! {
    iptables -t nat -A POSTROUTING -s "$POD_CIDR" ! -o "$BRIDGE" "${c[@]}" -j MASQUERADE &&
      iptables -t nat -A PREROUTING -d "$SERVICE_IP/32" -p tcp --dport 443 "${c[@]}" -j DNAT --to-destination "$NODE_IP:$APISERVER_PORT" &&
      iptables -t nat -A OUTPUT -d "$SERVICE_IP/32" -p tcp --dport 443 "${c[@]}" -j DNAT --to-destination "$NODE_IP:$APISERVER_PORT"
  } 2>/dev/null; then
    log "warning: cannot add iptables NAT rules (pods cannot reach $SERVICE_IP or beyond the node)"
  fi
}

cleanup_host_network() {
  command -v iptables-save >/dev/null || return 0
  local rule
  # Delete exactly the rules we added, found by their comment.
  while read -r rule; do
    [[ -n $rule ]] || continue
    eval "iptables -t nat ${rule/-A /-D }" 2>/dev/null || true
  done < <(iptables-save -t nat 2>/dev/null | grep -F -- "--comment $IPT_COMMENT" || true)
  if ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link delete "$BRIDGE" 2>/dev/null || true
  fi
}

# ---------------------------------------------------------------------------------------------
# Processes

# our_pids NAME: pids whose command is NAME (bare or a path ending in /NAME) and whose command line
# mentions our state dir. Every daemon we start gets paths under $STATE/ in its arguments, so this
# finds the processes of an interrupted run without touching another cluster's or the system's.
our_pids() {
  ps -eo pid=,args= | awk -v name="$1" -v state="$STATE/" '
    { cmd = $2; sub(/.*\//, "", cmd) }
    cmd == name && index($0, state) { print $1 }'
}

# stop_procs NAME TIMEOUT_S: SIGTERM the processes of NAME (pidfile and our_pids), SIGKILL after
# TIMEOUT_S.
stop_procs() {
  local name=$1 timeout=$2 pid pids=()
  mapfile -t pids < <(our_pids "$name")
  if [[ -f $RUN/$name.pid ]]; then
    pid=$(<"$RUN/$name.pid")
    # Only trust the pidfile while that pid still runs the same command.
    if [[ -n $pid && -r /proc/$pid/cmdline ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF "$name"; then
      pids+=("$pid")
    fi
    rm -f "$RUN/$name.pid"
  fi
  ((${#pids[@]} > 0)) || return 0
  mapfile -t pids < <(printf '%s\n' "${pids[@]}" | sort -u)
  log "stopping $name (pid ${pids[*]})"
  kill -TERM "${pids[@]}" 2>/dev/null || true
  local deadline=$(($(now_ms) + timeout * 1000)) alive
  while (($(now_ms) < deadline)); do
    alive=
    for pid in "${pids[@]}"; do
      if [[ -d /proc/$pid ]] && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null; then alive=1; fi
    done
    [[ -n $alive ]] || return 0
    sleep 0.1
  done
  kill -KILL "${pids[@]}" 2>/dev/null || true
}

# start_daemon NAME CMD...: runs CMD in its own session (so it outlives the shell that started it
# and no terminal signal reaches it), logging to $LOGS/NAME.log.
start_daemon() {
  local name=$1
  shift
  (
    # Close every inherited descriptor above stderr: a daemon holding its caller's pipe open
    # would keep `make` or CI waiting for an end of file that never comes.
    for fd in /proc/"$BASHPID"/fd/*; do
      fd=${fd##*/}
      if ((fd > 2)); then eval "exec $fd>&-"; fi
    done
    # setsid does not fork here (we are not a group leader): the pid below is the daemon's.
    exec setsid "$@" >"$LOGS/$name.log" 2>&1 </dev/null
  ) &
  echo $! >"$RUN/$name.pid"
}

# Kill the containers of our containerd: through containerd when it answers, then straight
# through runc (covers a containerd killed -9, whose shims and containers outlive it), then the
# shims themselves.
stop_containers() {
  local ctr=(ctr --address "$CONTAINERD_SOCK" --namespace k8s.io) id ids
  if [[ -S $CONTAINERD_SOCK ]] && timeout 3 "${ctr[@]}" version >/dev/null 2>&1; then
    ids=$(timeout 10 "${ctr[@]}" tasks ls -q 2>/dev/null || true)
    [[ -z $ids ]] || log "killing $(wc -w <<<"$ids") containers through containerd"
    for id in $ids; do
      timeout 5 "${ctr[@]}" tasks kill --all --signal SIGKILL "$id" >/dev/null 2>&1 || true
    done
    for id in $(timeout 10 "${ctr[@]}" tasks ls -q 2>/dev/null || true); do
      timeout 5 "${ctr[@]}" tasks delete --force "$id" >/dev/null 2>&1 || true
    done
    for id in $(timeout 10 "${ctr[@]}" containers ls -q 2>/dev/null || true); do
      timeout 5 "${ctr[@]}" containers delete "$id" >/dev/null 2>&1 || true
    done
  fi
  local root=$RUNC_ROOT/k8s.io
  if [[ -d $root ]]; then
    ids=$(runc --root "$root" list -q 2>/dev/null || true)
    [[ -z $ids ]] || log "killing $(wc -w <<<"$ids") containers through runc"
    for id in $ids; do
      runc --root "$root" kill --all "$id" KILL >/dev/null 2>&1 || true
      runc --root "$root" delete --force "$id" >/dev/null 2>&1 || true
    done
  fi
}

# Unmount everything under the state dir (kubelet pod volumes, sandbox shm and netns, container
# rootfs, the etcd tmpfs), deepest first, until nothing is left.
unmount_state() {
  local mounts m
  for _ in 1 2 3 4 5; do # stacked mounts need several rounds
    # mountinfo field 5 is the mount point, with spaces as \040.
    mounts=$(awk -v s="$STATE/" 'index($5, s) == 1 { print $5 }' /proc/self/mountinfo | sort -r -u)
    [[ -n $mounts ]] || return 0
    while read -r m; do
      m=$(printf '%b' "$m")
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done <<<"$mounts"
  done
  log "warning: mounts left under $STATE: $(awk -v s="$STATE/" 'index($5, s) == 1 { print $5 }' /proc/self/mountinfo | tr '\n' ' ')"
}

stop_all() {
  [[ -d $STATE ]] || return 0
  # kubelet first so that it does not restart what we kill next; the control plane last so that
  # nothing reschedules in between (and none of it matters once etcd is wiped).
  stop_procs agent-sandbox-controller 5
  stop_procs kubelet 5
  stop_containers
  stop_procs containerd 5
  stop_procs containerd-shim-runc-v2 2
  stop_containers # containers whose shim just died
  stop_procs kube-scheduler 5
  stop_procs kube-controller-manager 5
  stop_procs kube-apiserver 3 # with etcd gone it would wait out its request timeouts
  stop_procs etcd 5
  unmount_state
  cleanup_host_network
  rm -f "$RUN"/*.sock "$RUN"/*.sock.ttrpc 2>/dev/null || true
}

# ---------------------------------------------------------------------------------------------
# Configuration

# The state dir is wiped on every `up`: refuse to wipe a directory we did not create.
reset_state() {
  case $STATE in
  /*) ;;
  *) die "KUBECLIP_CLUSTER_DIR must be an absolute path: $STATE" ;;
  esac
  [[ $(realpath -m "$STATE") != / ]] || die "refusing to use / as the state dir"
  if [[ -d $STATE && -n $(ls -A "$STATE") && ! -e $STATE/.kubeclip-cluster ]]; then
    die "$STATE exists, is not empty and was not made by this script; remove it or set KUBECLIP_CLUSTER_DIR"
  fi
  mkdir -p "$STATE"
  # Keep the logs of the previous run for post-mortems of an interrupted one.
  rm -rf "$STATE/logs.prev"
  [[ -d $LOGS ]] && mv "$LOGS" "$STATE/logs.prev"
  find "$STATE" -mindepth 1 -maxdepth 1 ! -name logs.prev ! -name .kubeclip-cluster -exec rm -rf {} +
  touch "$STATE/.kubeclip-cluster"
  mkdir -p "$RUN" "$LOGS" "$PKI" "$STATE/etcd" "$STATE/kubelet" "$STATE/pod-logs" "$STATE/cni/net.d" \
    "$STATE/cni/ipam" "$STATE/containerd" "$IMAGES_DIR"
}

# PKI: one CA signs everything. EC P-256 keys: generating them takes milliseconds, RSA seconds.
gen_pki() {
  cat >"$PKI/openssl.cnf" <<'EOF'
[req]
distinguished_name = dn
prompt = no
[dn]
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign,digitalSignature
subjectKeyIdentifier = hash
[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = clientAuth
[server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = $ENV::SANS
EOF
  local ossl=(openssl req -config "$PKI/openssl.cnf" -x509 -noenc -days 3650 -newkey ec -pkeyopt ec_paramgen_curve:P-256)
  SANS=DNS:unused "${ossl[@]}" -extensions ca -subj "/CN=kubeclip-ca" -keyout "$PKI/ca.key" -out "$PKI/ca.crt" 2>/dev/null

  # cert NAME EXTENSION SUBJECT [SANS]
  cert() {
    SANS=${4:-DNS:unused} "${ossl[@]}" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -extensions "$2" -subj "$3" \
      -keyout "$PKI/$1.key" -out "$PKI/$1.crt" 2>/dev/null
  }
  cert apiserver server "/CN=kube-apiserver" \
    "IP:$SERVICE_IP,IP:$NODE_IP,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:$NODE_NAME,DNS:localhost"
  cert admin client "/O=system:masters/CN=kubeclip-admin"
  cert controller-manager client "/CN=system:kube-controller-manager"
  cert scheduler client "/CN=system:kube-scheduler"
  cert apiserver-kubelet-client client "/O=system:masters/CN=kube-apiserver-kubelet-client"
  cert kubelet-client client "/O=system:nodes/CN=system:node:$NODE_NAME"
  cert kubelet-serving server "/CN=$NODE_NAME" "DNS:$NODE_NAME,IP:$NODE_IP,IP:127.0.0.1"
  # ServiceAccount token signing key pair.
  openssl ecparam -name prime256v1 -genkey -noout 2>/dev/null | openssl pkcs8 -topk8 -nocrypt -out "$PKI/sa.key"
  openssl ec -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  chmod 600 "$PKI"/*.key
}

# write_kubeconfig FILE CERT_NAME SERVER: a kubeconfig with the client cert embedded, so the file
# can be copied (into a container, say) on its own.
write_kubeconfig() {
  local file=$1 name=$2 server=$3
  cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kubeclip
  cluster:
    server: $server
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $name
  user:
    client-certificate-data: $(base64 -w0 "$PKI/$name.crt")
    client-key-data: $(base64 -w0 "$PKI/$name.key")
contexts:
- name: kubeclip
  context:
    cluster: kubeclip
    user: $name
current-context: kubeclip
EOF
  chmod 600 "$file"
}

write_kubeconfigs() {
  # The admin kubeconfig uses the node address, so it also works from containers on this host.
  write_kubeconfig "$ADMIN_KUBECONFIG" admin "https://$NODE_IP:$APISERVER_PORT"
  write_kubeconfig "$STATE/controller-manager.kubeconfig" controller-manager "https://127.0.0.1:$APISERVER_PORT"
  write_kubeconfig "$STATE/scheduler.kubeconfig" scheduler "https://127.0.0.1:$APISERVER_PORT"
  write_kubeconfig "$STATE/kubelet.kubeconfig" kubelet-client "https://127.0.0.1:$APISERVER_PORT"
}

# overlayfs works on most hosts; where the state dir's filesystem cannot carry it (overlay on
# overlay, some tmpfs setups), containerd falls back to copying layers with "native".
pick_snapshotter() {
  local d=$STATE/containerd/overlay-check
  mkdir -p "$d"/{lower,upper,work,merged}
  SNAPSHOTTER=native
  if mount -t overlay overlay -o "lowerdir=$d/lower,upperdir=$d/upper,workdir=$d/work" "$d/merged" 2>/dev/null; then
    umount "$d/merged"
    SNAPSHOTTER=overlayfs
  fi
  rm -rf "$d"
}

write_containerd_config() {
  cat >"$STATE/containerd/config.toml" <<EOF
# containerd for the kubeclip test cluster (written by hack/cluster/cluster.sh; do not edit).
version = 2
root = "$STATE/containerd/root"
state = "$STATE/containerd/state"
# Plugins this cluster does not use; skipping them keeps startup quick and the log quiet.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "$CONTAINERD_SOCK"

[ttrpc]
  address = "$CONTAINERD_SOCK.ttrpc"

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "$STATE/containerd/opt"
  [plugins."io.containerd.grpc.v1.cri"]
    # No image can be pulled here: the sandbox image is built locally and imported.
    sandbox_image = "$PAUSE_IMAGE"
    # These machines lack CAP_SYS_RESOURCE: without this every sandbox fails with
    # "can't get final child's PID from pipe: EOF".
    restrict_oom_score_adj = true
    # Pod network namespaces live under our state dir, so cleanup finds and unmounts them.
    netns_mounts_under_state_dir = true
    enable_selinux = false
    disable_apparmor = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "$SNAPSHOTTER"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
          Root = "$RUNC_ROOT"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "$STATE/cni/net.d"
      max_conf_num = 1
EOF
}

# The pod network: a bridge with host-local addresses and portmap for hostPorts. containerd sets up
# each pod's loopback itself with /usr/lib/cni/loopback (go-cni's built-in "lo" network), so the
# loopback plugin does not belong in this chain.
write_cni_config() {
  cat >"$STATE/cni/net.d/10-kubeclip.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "kubeclip",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "mtu": $NODE_MTU,
      "ipam": {
        "type": "host-local",
        "dataDir": "$STATE/cni/ipam",
        "ranges": [[{"subnet": "$POD_CIDR"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
}

# write_kubelet_config writes the kubelet's configuration to $1 (its real place by default).
write_kubelet_config() {
  cat >"${1:-$STATE/kubelet/config.yaml}" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: $PKI/ca.crt
authorization:
  mode: Webhook
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
# What works on these machines: cgroup v1 with the cgroupfs driver, no QoS cgroups, no
# node-allocatable enforcement (this process's memory cgroup is nested).
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
# In-place pod resize reads the pod's cgroup, which does not exist without QoS cgroups: the
# 1.34 kubelet then dereferences a nil limit and crashes (kuberuntime_manager.go:839, after a
# "Missing actuated resource record" when a pod is deleted right after it started). kubeclip
# never resizes a pod.
featureGates:
  InPlacePodVerticalScaling: false
failCgroupV1: false
failSwapOn: false
maxPods: 250
# The kubelet's log API serves only a container's newest log file: lines rotated away before the
# run-watcher read them are lost to it (docs/architecture.md, "A run's log and the kubelet"). A
# file larger than a company's daily container-log budget (34,359,733 bytes by default) holds all
# of a run's log that kubeclip stores; at the kubelet's default, 10Mi, a loud run lost 70,000 of
# its 200,000 lines when its follower fell behind under load (tests/isolation noisy_test.go).
containerLogMaxSize: 128Mi
podLogsDir: $STATE/pod-logs
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
clusterDomain: cluster.local
serializeImagePulls: false
# Images cannot be pulled again here: never garbage-collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# A shared CI disk may be fuller than the defaults allow; evict only when it is really full.
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "2%"
  nodefs.inodesFree: "2%"
  imagefs.available: "2%"
EOF
}

# ---------------------------------------------------------------------------------------------
# Images

# The provisioner's binary is built once per version into $LOCAL_PATH_BIN, the way the Kubernetes
# binaries are, and in their module: hack/k8s resolves it against the same k8s.io modules (adding
# it changed no version they use), so its client-go is the one the Kubernetes build has just
# compiled, and a cold build costs ~20 s instead of the 2-3.5 min of compiling its own older
# client-go (`go install ...@v0.0.30` with its go.mod). The stamp records the build inputs.
LOCAL_PATH_STAMP="$LOCAL_PATH_VERSION $K8S_VERSION -trimpath -s -w"
local_path_cached() { [[ -x $LOCAL_PATH_BIN/local-path-provisioner && $(cat "$LOCAL_PATH_BIN/.stamp" 2>/dev/null) == "$LOCAL_PATH_STAMP" ]]; }

ensure_local_path_provisioner() {
  local_path_cached && return 0
  mkdir -p "$(dirname "$LOCAL_PATH_BIN")"
  exec 7>"$(dirname "$LOCAL_PATH_BIN")/.build.lock"
  flock 7
  if ! local_path_cached; then
    rm -rf "$LOCAL_PATH_BIN".tmp.*
    log "building local-path-provisioner $LOCAL_PATH_VERSION into $LOCAL_PATH_BIN"
    local tmp
    tmp=$(mktemp -d "$LOCAL_PATH_BIN.tmp.XXXXXX")
    CGO_ENABLED=0 go_progress "building local-path-provisioner" "$ROOT/hack/k8s" github.com/rancher/local-path-provisioner -- \
      go build -v -trimpath -ldflags='-s -w' -o "$tmp/" github.com/rancher/local-path-provisioner ||
      { rm -rf "$tmp"; die "building local-path-provisioner $LOCAL_PATH_VERSION failed"; }
    printf '%s' "$LOCAL_PATH_STAMP" >"$tmp/.stamp"
    rm -rf "$LOCAL_PATH_BIN"
    mv "$tmp" "$LOCAL_PATH_BIN"
  fi
  flock -u 7
  exec 7>&-
}

# build_storage_images writes the provisioner's and its helper's image tarballs.
build_storage_images() {
  local out=$IMAGES_DIR
  mkdir -p "$out/bin"
  ensure_local_path_provisioner
  (cd "$ROOT" && go build -o "$out/bin/mkimage" ./hack/mkimage)
  (cd "$ROOT" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$out/bin/local-path-helper" ./hack/local-path-helper)
  "$out/bin/mkimage" --tag "$PROVISIONER_IMAGE" --out "$out/local-path-provisioner.tar" --user 65532 \
    --entrypoint /usr/local/bin/local-path-provisioner "$LOCAL_PATH_BIN/local-path-provisioner:/usr/local/bin/local-path-provisioner"
  "$out/bin/mkimage" --tag "$HELPER_IMAGE" --out "$out/local-path-helper.tar" \
    --entrypoint /usr/local/bin/local-path-helper "$out/bin/local-path-helper:/usr/local/bin/local-path-helper"
}

build_images() {
  local out=$IMAGES_DIR b
  mkdir -p "$out/bin"
  (cd "$ROOT" && go build -o "$out/bin/mkimage" ./hack/mkimage)
  for b in pause tini agent-stub claude-stub; do
    (cd "$ROOT" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$out/bin/$b" "./tests/images/$b")
  done
  (cd "$ROOT" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$out/bin/sandboxd" ./cmd/sandboxd)
  "$out/bin/mkimage" --tag "$PAUSE_IMAGE" --out "$out/pause.tar" --entrypoint /pause --user 65535 \
    "$out/bin/pause:/pause"
  "$out/bin/mkimage" --tag "$STUB_IMAGE" --out "$out/agent-stub.tar" \
    --entrypoint /usr/local/bin/paperclip-agent-shim --user 1000 \
    "$out/bin/agent-stub:/usr/local/bin/paperclip-agent-shim" "$out/bin/tini:/usr/bin/tini"
  # Only its binary matters: the init container runs `/sandboxd install /kubeclip/bin/sandboxd`.
  "$out/bin/mkimage" --tag "$SANDBOXD_IMAGE" --out "$out/sandboxd.tar" --entrypoint /sandboxd --user 65532 \
    "$out/bin/sandboxd:/sandboxd"
  # Cached in $CACHE/images under a key of its inputs: with nothing changed this takes well
  # under a second (cold: Debian packages and node downloaded, ~10 s).
  bash "$ROOT/hack/cluster/sandbox-image.sh" --mkimage "$out/bin/mkimage" --claude "$out/bin/claude-stub" \
    --tag "$SANDBOX_IMAGE" --out "$out/sandbox.tar"
  build_storage_images
}

# import_images [NAME...]: imports the named tarballs of $IMAGES_DIR (default all of IMAGE_TARS).
import_images() {
  local name tar names=("$@")
  ((${#names[@]} > 0)) || names=("${IMAGE_TARS[@]}")
  for name in "${names[@]}"; do
    tar=$IMAGES_DIR/$name.tar
    # Re-importing an unchanged image changes nothing but costs a read of the whole tarball
    # (2 s for the sandbox's 144 MB): skip it when containerd has the tarball's image config.
    image_imported "$tar" && continue
    ctr --address "$CONTAINERD_SOCK" --namespace k8s.io images import --snapshotter "$SNAPSHOTTER" "$tar" >/dev/null
  done
}

# image_imported TAR: containerd's k8s.io namespace has TAR's tag, on a manifest naming TAR's
# image config (mkimage names the config after its digest). tar skips over the layer with seeks.
image_imported() {
  local manifest ref config digest
  manifest=$(tar -xOf "$1" manifest.json) || return 1
  ref=$(sed -n 's/.*"RepoTags":\["\([^"]*\)".*/\1/p' <<<"$manifest")
  config=$(sed -n 's/.*"Config":"\([0-9a-f]*\)\.json".*/\1/p' <<<"$manifest")
  [[ -n $ref && -n $config ]] || return 1
  digest=$(ctr --address "$CONTAINERD_SOCK" --namespace k8s.io images ls "name==$ref" 2>/dev/null | awk 'NR == 2 {print $3}')
  [[ -n $digest ]] || return 1
  ctr --address "$CONTAINERD_SOCK" --namespace k8s.io content get "$digest" 2>/dev/null | grep -q "\"digest\":\"sha256:$config\""
}

# ---------------------------------------------------------------------------------------------
# Daemons

start_etcd() {
  # etcd on tmpfs: the cluster is rebuilt on every `up`, and fsyncs on a shared CI disk are what
  # makes API calls slow under load. Disk when tmpfs cannot be mounted.
  mount -t tmpfs -o size=2g,mode=0700 kubeclip-etcd "$STATE/etcd" 2>/dev/null || log "warning: etcd data on disk (tmpfs mount failed)"
  start_daemon etcd /usr/bin/etcd --name kubeclip --data-dir "$STATE/etcd/data" \
    --listen-client-urls "$ETCD_CLIENT_URL" --advertise-client-urls "$ETCD_CLIENT_URL" \
    --listen-peer-urls "$ETCD_PEER_URL" --initial-advertise-peer-urls "$ETCD_PEER_URL" \
    --initial-cluster "kubeclip=$ETCD_PEER_URL" --initial-cluster-state new \
    --quota-backend-bytes $((1800 * 1024 * 1024)) --snapshot-count 10000
}

start_apiserver() {
  start_daemon kube-apiserver "$BIN/kube-apiserver" \
    --etcd-servers="$ETCD_CLIENT_URL" \
    --bind-address=0.0.0.0 --secure-port="$APISERVER_PORT" --advertise-address="$NODE_IP" \
    --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" \
    --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$PKI/ca.crt" \
    --kubelet-preferred-address-types=InternalIP,Hostname \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --authorization-mode=Node,RBAC \
    --enable-admission-plugins=NodeRestriction,PodSecurity,ResourceQuota,LimitRanger \
    --allow-privileged=true \
    --profiling=false \
    --v=1
}

start_controller_manager() {
  # No leader election: there is one instance, and a lease left by a killed one would hold the
  # new one back for up to 15 s.
  # --kube-api-qps/--kube-api-burst: each controller's client-side rate (each has its own client,
  # --use-service-account-credentials). The default, 20/30, held the Job controller to
  # about 7.6 pods/s (a pod POST, Job status updates and an event per pod): 22 min for the 10,000
  # Job leases of `make bench-scale` (docs/performance.md). A setting of this test cluster, not
  # a recommendation: a real cluster's operator sizes their own.
  start_daemon kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig="$STATE/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 \
    --leader-elect=false \
    --kube-api-qps=100 --kube-api-burst=200 \
    --use-service-account-credentials=true \
    --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
    --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --profiling=false \
    --v=1
}

start_scheduler() {
  start_daemon kube-scheduler "$BIN/kube-scheduler" \
    --kubeconfig="$STATE/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 \
    --leader-elect=false \
    --profiling=false \
    --v=1
}

start_containerd() {
  start_daemon containerd /usr/bin/containerd --config "$STATE/containerd/config.toml"
}

start_kubelet() {
  start_daemon kubelet "$BIN/kubelet" \
    --config="$STATE/kubelet/config.yaml" \
    --kubeconfig="$STATE/kubelet.kubeconfig" \
    --root-dir="$STATE/kubelet" \
    --hostname-override="$NODE_NAME" \
    --node-ip="$NODE_IP" \
    --v=1
}

# start_agent_sandbox runs agent-sandbox's controller out of cluster with the admin kubeconfig:
# no leader election (one instance; a lease left by a killed one would hold the next back), no
# metrics endpoint, its probes on loopback for `up` to wait on, and --extensions (the claim,
# template and warm-pool controllers; their CRDs are installed).
start_agent_sandbox() {
  agent_sandbox_identity >"$RUN/agent-sandbox-controller.identity"
  start_daemon agent-sandbox-controller "$AGENT_SANDBOX_BIN" \
    --kubeconfig="$ADMIN_KUBECONFIG" \
    --leader-elect=false \
    --extensions \
    --metrics-bind-address=0 \
    --health-probe-bind-address="$AGENT_SANDBOX_PROBE"
}
agent_sandbox_ready() { curl -fsS "http://$AGENT_SANDBOX_PROBE/readyz"; }

# agent_sandbox_identity: what the running controller must have been started with, the binary
# and the cluster (its admin kubeconfig, new with every fresh `up`).
agent_sandbox_identity() {
  printf '%s %s\n' "$AGENT_SANDBOX_BIN" "$(sha256sum <"$ADMIN_KUBECONFIG" | cut -d' ' -f1)"
}

# agent_sandbox_current: the controller runs the pinned version's binary against this cluster. A
# cluster started before the version changed restarts only its controller; one that a cluster.sh
# which knows no controller restarted (a branch older than it) leaves one holding the previous
# cluster's credentials, which is replaced.
agent_sandbox_current() {
  local pid
  daemon_alive agent-sandbox-controller || return 1
  pid=$(<"$RUN/agent-sandbox-controller.pid")
  [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == "$AGENT_SANDBOX_BIN" ]] || return 1
  [[ $(cat "$RUN/agent-sandbox-controller.identity" 2>/dev/null) == "$(agent_sandbox_identity)" ]]
}

# ensure_agent_sandbox_running (re)starts the controller unless the current one runs, and waits
# until it is ready. After the CRDs: its informers need them served. stop_procs also finds a
# controller whose pidfile is gone (our_pids: its --kubeconfig names the state dir).
ensure_agent_sandbox_running() {
  if ! agent_sandbox_current; then
    stop_procs agent-sandbox-controller 5
    start_agent_sandbox
  fi
  await agent-sandbox-controller 60 "the agent-sandbox controller ($AGENT_SANDBOX_PROBE/readyz)" agent_sandbox_ready
}

# daemon_alive NAME: the pidfile's process still runs (fail fast instead of waiting a timeout out).
daemon_alive() {
  local pid
  pid=$(cat "$RUN/$1.pid" 2>/dev/null) && [[ -d /proc/$pid ]] && ! grep -q '^State:.*Z' "/proc/$pid/status"
}

# await NAME TIMEOUT_S DESCRIPTION CMD...: polls CMD every 0.2 s until it succeeds; stops at once
# if daemon NAME died, and shows the end of its log either way.
await() {
  local name=$1 timeout=$2 what=$3
  shift 3
  local deadline=$(($(now_ms) + timeout * 1000))
  until "$@" >/dev/null 2>&1; do
    if ! daemon_alive "$name"; then
      log "$name exited while waiting for $what; last lines of $LOGS/$name.log:"
      tail -n 30 "$LOGS/$name.log" >&2 || true
      return 1
    fi
    if (($(now_ms) > deadline)); then
      log "timed out after ${timeout}s waiting for $what; last lines of $LOGS/$name.log:"
      tail -n 30 "$LOGS/$name.log" >&2 || true
      return 1
    fi
    sleep 0.2
  done
}

kubectl_admin() { "$BIN/kubectl" --kubeconfig "$ADMIN_KUBECONFIG" "$@"; }
etcd_healthy() { curl -fsS "$ETCD_CLIENT_URL/health" | grep -q '"health":"true"'; }
apiserver_ready() { kubectl_admin get --raw /readyz; }
containerd_ready() { ctr --address "$CONTAINERD_SOCK" version; }
node_ready() {
  [[ $(kubectl_admin get node "$NODE_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}') == True ]]
}
default_sa_exists() { kubectl_admin -n default get serviceaccount default; }
crd_established() {
  [[ $(kubectl_admin get crd "$1" -o 'jsonpath={.status.conditions[?(@.type=="Established")].status}') == True ]]
}

# apply_test_crds installs the CRDs the tests render objects for and waits until they serve:
# agent-sandbox's from its module (cached with the controller), Cilium's from hack/cluster/crds.
apply_test_crds() {
  # Server-side apply: the Sandbox CRD is larger than the last-applied annotation allows.
  kubectl_admin apply --server-side --force-conflicts -f "$ROOT/hack/cluster/crds/" -f "$AGENT_SANDBOX_DIR/crds/" >/dev/null
  local crd
  for crd in "${CRD_NAMES[@]}"; do
    await kube-apiserver 60 "CRD $crd Established" crd_established "$crd"
  done
}

# tar_config_digest TAR: the digest of the image config in a tarball mkimage wrote.
tar_config_digest() {
  tar -xOf "$1" manifest.json | sed -n 's/.*"Config":"\([0-9a-f]*\)\.json".*/\1/p'
}

# provisioner_available: the provisioner's Deployment has its pod of the current template up.
provisioner_available() {
  kubectl_admin -n local-path-storage rollout status deployment/local-path-provisioner --timeout=1s
}

# apply_storage installs the provisioner (hack/cluster/local-path.yaml) and waits until it runs.
# Applying it unchanged changes nothing: the pod restarts only when its image was rebuilt or the
# manifest changed (a digest of both on its pod template).
apply_storage() {
  # The volumes' parent: root's alone on the node (a pod sees only its own volume, bind-mounted).
  mkdir -p "$LOCAL_PATH_DIR"
  chmod 0700 "$LOCAL_PATH_DIR"
  local id manifest
  id=$(tar_config_digest "$IMAGES_DIR/local-path-provisioner.tar")
  [[ -n $id ]] || die "cannot read the image id of $IMAGES_DIR/local-path-provisioner.tar"
  manifest=$(sed -e "s|@PROVISIONER_IMAGE@|$PROVISIONER_IMAGE|g" -e "s|@HELPER_IMAGE@|$HELPER_IMAGE|g" \
    -e "s|@DATA_DIR@|$LOCAL_PATH_DIR|g" "$ROOT/hack/cluster/local-path.yaml")
  id=$(printf '%s\n%s' "$id" "$manifest" | sha256sum | cut -c1-16)
  sed "s|@MANIFEST_ID@|$id|" <<<"$manifest" | kubectl_admin apply --server-side --force-conflicts -f - >/dev/null
  await kube-apiserver 120 "the storage provisioner (local-path-storage/local-path-provisioner)" provisioner_available
}

# cluster_healthy: every daemon of ours runs, the binaries are the pinned ones, and the API
# server and the node answer.
cluster_healthy() {
  local name
  k8s_binaries_cached || return 1
  [[ -f $ADMIN_KUBECONFIG ]] || return 1
  for name in etcd containerd kube-apiserver kube-controller-manager kube-scheduler kubelet; do
    daemon_alive "$name" || return 1
  done
  detect_node
  kubelet_config_current || return 1
  timeout 5 "$BIN/kubectl" --kubeconfig "$ADMIN_KUBECONFIG" get --raw /readyz >/dev/null 2>&1 || return 1
  node_ready >/dev/null 2>&1
}

# kubelet_config_current: the running kubelet was started with the configuration this script
# writes now. A cluster started by an older script (a feature gate since turned off, say) is
# restarted rather than reused.
kubelet_config_current() {
  local want
  want=$(mktemp) || return 1
  write_kubelet_config "$want"
  cmp -s "$want" "$STATE/kubelet/config.yaml"
  local rc=$?
  rm -f "$want"
  if ((rc != 0)); then
    log "the kubelet's configuration changed since the cluster started"
  fi
  return "$rc"
}

# ---------------------------------------------------------------------------------------------
# Subcommands

cmd_up() {
  if [[ -n ${KUBECLIP_KUBECONFIG:-} ]]; then
    local kubectl=kubectl
    command -v kubectl >/dev/null || { ensure_k8s_binaries && kubectl=$BIN/kubectl; }
    "$kubectl" --kubeconfig "$KUBECLIP_KUBECONFIG" get --raw /readyz >/dev/null ||
      die "the cluster of KUBECLIP_KUBECONFIG=$KUBECLIP_KUBECONFIG does not answer"
    log "using the existing cluster of KUBECLIP_KUBECONFIG=$KUBECLIP_KUBECONFIG (nothing loaded)"
    return 0
  fi
  [[ $EUID -eq 0 ]] || die "up needs root (it runs containerd and the kubelet)"
  UP_START=$(now_ms)

  # A healthy cluster from an earlier `up` is reused: the test images and CRDs are refreshed,
  # nothing is restarted (a dev loop of `make test` should not cost a restart each time, and
  # other sessions' tests keep running). KUBECLIP_CLUSTER_FRESH=1 forces a clean restart.
  if [[ -z ${KUBECLIP_CLUSTER_FRESH:-} ]] && cluster_healthy; then
    log "reusing the running cluster (KUBECLIP_CLUSTER_FRESH=1 restarts it)"
    detect_node
    start_agent_sandbox_build
    cmd_images
    await_agent_sandbox_build
    apply_test_crds
    ensure_agent_sandbox_running
    apply_storage
    log "cluster ready in $((($(now_ms) - UP_START) / 1000)).$(((($(now_ms) - UP_START) % 1000) / 100)) s; kubeconfig: $ADMIN_KUBECONFIG"
    return 0
  fi

  phase "packages"
  ensure_packages
  phase "cleanup of previous run"
  stop_all
  phase "kubernetes binaries"
  start_agent_sandbox_build
  ensure_k8s_binaries
  phase "configuration and PKI"
  detect_node
  ensure_hosts_entry
  reset_state
  gen_pki
  write_kubeconfigs
  pick_snapshotter
  write_containerd_config
  write_cni_config
  write_kubelet_config
  setup_host_network

  phase "etcd, containerd, images"
  # Build the test images while the daemons start; `wait` collects it below.
  build_images >"$LOGS/images.log" 2>&1 &
  local images_pid=$!
  start_etcd
  start_containerd
  await etcd 30 "etcd" etcd_healthy
  phase "kube-apiserver"
  start_apiserver
  await containerd 30 "containerd" containerd_ready
  if ! PROGRESS_TAIL=$LOGS/images.log with_heartbeat "building the test images (log: $LOGS/images.log)" wait "$images_pid"; then
    tail -n 30 "$LOGS/images.log" >&2
    die "building the test images failed (log: $LOGS/images.log)"
  fi
  # The pause image must be in place before the kubelet starts its first sandbox.
  import_images
  await kube-apiserver 90 "kube-apiserver /readyz" apiserver_ready

  phase "controllers and kubelet"
  start_controller_manager
  start_scheduler
  start_kubelet
  await kubelet 90 "node $NODE_NAME Ready" node_ready
  await kube-controller-manager 60 "the default ServiceAccount" default_sa_exists

  phase "agent-sandbox build"
  await_agent_sandbox_build
  phase "test CRDs"
  apply_test_crds
  phase "agent-sandbox controller"
  ensure_agent_sandbox_running
  phase "storage provisioner"
  apply_storage
  phase "" # closes the last phase
  log "cluster up in $((($(now_ms) - UP_START) / 1000)).$(((($(now_ms) - UP_START) % 1000) / 100)) s; kubeconfig: $ADMIN_KUBECONFIG"
}

cmd_down() {
  if [[ -n ${KUBECLIP_KUBECONFIG:-} ]]; then
    log "KUBECLIP_KUBECONFIG is set: the cluster is not ours, leaving it alone"
    return 0
  fi
  stop_all
  log "cluster down (state and logs kept in $STATE)"
}

cmd_status() {
  if [[ -n ${KUBECLIP_KUBECONFIG:-} ]]; then
    echo "external cluster: KUBECLIP_KUBECONFIG=$KUBECLIP_KUBECONFIG"
    return 0
  fi
  local name pids
  for name in etcd containerd kube-apiserver kube-controller-manager kube-scheduler kubelet agent-sandbox-controller containerd-shim-runc-v2; do
    pids=$(our_pids "$name" | tr '\n' ' ')
    printf '%-26s %s\n' "$name" "${pids:-not running}"
  done
  if [[ -f $ADMIN_KUBECONFIG && -x $BIN/kubectl ]] && timeout 5 "$BIN/kubectl" --kubeconfig "$ADMIN_KUBECONFIG" get --raw /readyz >/dev/null 2>&1; then
    echo "apiserver                  ready ($ADMIN_KUBECONFIG)"
    timeout 5 "$BIN/kubectl" --kubeconfig "$ADMIN_KUBECONFIG" get nodes -o wide 2>/dev/null || true
    local ready
    ready=$(timeout 5 "$BIN/kubectl" --kubeconfig "$ADMIN_KUBECONFIG" -n local-path-storage get deployment local-path-provisioner \
      -o 'jsonpath={.status.readyReplicas}' 2>/dev/null || true)
    printf '%-26s %s\n' "storage provisioner" "$([[ ${ready:-0} -ge 1 ]] && echo "ready (StorageClass $STORAGE_CLASS, volumes in $LOCAL_PATH_DIR)" || echo "not ready (cluster.sh storage)")"
  else
    echo "apiserver                  not answering"
  fi
}

cmd_kubeconfig() {
  if [[ -n ${KUBECLIP_KUBECONFIG:-} ]]; then
    echo "$KUBECLIP_KUBECONFIG"
  else
    echo "$ADMIN_KUBECONFIG"
  fi
}

cmd_images() {
  [[ -z ${KUBECLIP_KUBECONFIG:-} ]] || die "KUBECLIP_KUBECONFIG is set: load the test images into that cluster yourself"
  mkdir -p "$IMAGES_DIR"
  build_images
  if [[ -S $CONTAINERD_SOCK ]] && containerd_ready >/dev/null 2>&1; then
    SNAPSHOTTER=$(sed -n 's/^ *snapshotter = "\(.*\)"/\1/p' "$STATE/containerd/config.toml")
    import_images
    log "imported $PAUSE_IMAGE, $STUB_IMAGE, $SANDBOXD_IMAGE, $SANDBOX_IMAGE, $PROVISIONER_IMAGE and $HELPER_IMAGE"
  else
    log "built $IMAGES_DIR/{pause,agent-stub,sandboxd,sandbox,local-path-provisioner,local-path-helper}.tar (containerd is not running: not imported)"
  fi
}

# cmd_storage installs the storage provisioner into the running cluster: its images built and
# imported, its objects applied, its pod waited for. `up` does the same on every start.
cmd_storage() {
  [[ -z ${KUBECLIP_KUBECONFIG:-} ]] || die "KUBECLIP_KUBECONFIG is set: install a storage provisioner into that cluster yourself"
  [[ -S $CONTAINERD_SOCK ]] && containerd_ready >/dev/null 2>&1 || die "the local cluster is not running (cluster.sh up)"
  local start
  start=$(now_ms)
  mkdir -p "$IMAGES_DIR"
  build_storage_images
  SNAPSHOTTER=$(sed -n 's/^ *snapshotter = "\(.*\)"/\1/p' "$STATE/containerd/config.toml")
  import_images local-path-provisioner local-path-helper
  apply_storage
  log "storage provisioner ready in $(($(now_ms) - start)) ms: StorageClass $STORAGE_CLASS (default), volumes under $LOCAL_PATH_DIR"
}

case ${1:-} in
up) cmd_up ;;
down) cmd_down ;;
status) cmd_status ;;
kubeconfig) cmd_kubeconfig ;;
images) cmd_images ;;
storage) cmd_storage ;;
*)
  echo "usage: $0 up|down|status|kubeconfig|images|storage" >&2
  exit 2
  ;;
esac
