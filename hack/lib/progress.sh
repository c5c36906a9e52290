# shellcheck shell=bash
# progress.sh: progress lines for the long steps of kubeclip's scripts (sourced by
# hack/cluster/cluster.sh, hack/cluster/sandbox-image.sh, hack/kwok/kwok.sh and hack/lib/apt.sh).
# A cold machine spends minutes compiling Kubernetes and installing packages; without these the
# first `make demo` or `make test` printed one line and then nothing for about five minutes.
#
# Lines go through the caller's log function when it has one. PROGRESS_EVERY is the seconds
# between two progress lines of one step (default 10).

PROGRESS_EVERY=${PROGRESS_EVERY:-10}

progress_log() {
  if declare -F log >/dev/null; then
    log "$@"
  else
    printf '%s %s\n' "$(date +%T)" "$*" >&2
  fi
}

# go_progress WHAT DIR [LIST-ARG...] -- CMD...: runs CMD, a `go build -v`, `go vet -v` or
# `go install -v`, in DIR. A step that ends within PROGRESS_EVERY s says nothing; a longer one logs
# every PROGRESS_EVERY s how many packages it has compiled, of how many the build has at most
# (`go list -deps LIST-ARG...`, counted meanwhile: the packages, and `-test` for a vet, which
# compiles the tests too; without LIST-ARGs no total), the last one and the time so far, and then
# that it is done. Other lines of CMD's stderr (downloads, errors) pass through.
# Returns CMD's status.
go_progress() {
  local what=$1 dir=$2
  shift 2
  local pkgs=()
  while (($#)) && [[ $1 != -- ]]; do
    pkgs+=("$1")
    shift
  done
  shift # the --
  local status
  (
    trap - ERR
    set +e +o pipefail
    totals=$(mktemp)
    trap 'rm -f "$totals"' EXIT
    if ((${#pkgs[@]} > 0)); then
      (cd "$dir" && go list -deps "${pkgs[@]}" 2>/dev/null | wc -l >"$totals.tmp" && mv "$totals.tmp" "$totals") &
    fi
    start=$(date +%s)
    last=$start
    n=0
    current=""
    reported=""
    (cd "$dir" && "$@" 2>&1 >/dev/null) | {
      while :; do
        if IFS= read -r -t 2 line; then
          # `go build -v` names each package as it compiles it: an import path alone on a line.
          if [[ $line =~ ^[A-Za-z0-9._~/+-]+$ ]]; then
            n=$((n + 1))
            current=$line
          else
            printf '%s\n' "$line" >&2
          fi
        elif (($? <= 128)); then
          break # end of output
        fi
        now=$(date +%s)
        if ((now - last >= PROGRESS_EVERY)); then
          last=$now
          reported=1
          total=$(cat "$totals" 2>/dev/null)
          [[ $total =~ ^[0-9]+$ && $total -gt 0 ]] || total=""
          if [[ -n $total && $n -ge $total ]]; then
            progress_log "$what: $n packages compiled, linking ($((now - start)) s)"
          else
            progress_log "$what: $n${total:+ of ≤ $total} packages compiled${total:+ ($((100 * n / total)) %)}, last ${current:-…} ($((now - start)) s)"
          fi
        fi
      done
      [[ -z $reported ]] || progress_log "$what: done, $n packages compiled in $(($(date +%s) - start)) s"
    }
    status=${PIPESTATUS[0]}
    wait
    exit "$status"
  ) && status=0 || status=$?
  return "$status"
}

# with_heartbeat WHAT CMD...: runs CMD and logs every PROGRESS_EVERY s that WHAT is still going,
# for steps that report no progress of their own (package installs, downloads), with the last line
# of the file PROGRESS_TAIL when it is set (a log the step writes). Returns CMD's status.
with_heartbeat() {
  local what=$1
  shift
  local start ticker status
  start=$(date +%s)
  (
    trap - ERR
    while sleep "$PROGRESS_EVERY"; do
      last=""
      [[ -n ${PROGRESS_TAIL:-} && -s $PROGRESS_TAIL ]] && last=$(tail -n 1 "$PROGRESS_TAIL" | cut -c1-160)
      progress_log "$what: still going after $(($(date +%s) - start)) s${last:+; last: $last}"
    done
  ) &
  ticker=$!
  "$@" && status=0 || status=$?
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
  return "$status"
}
