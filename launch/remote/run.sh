#!/usr/bin/env bash
# Runs on every TPU VM worker: `python -m rmsweb_jax.main` with the arguments in env.sh, logging to
# ~/rmsweb_logs/<run id>.log (latest.log points at it). With --detached it only logs; otherwise it
# also streams the log to stdout, each line prefixed with the worker number.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=/dev/null
source "$here/env.sh"

stream=1
case "${1:-}" in
  "") ;;
  --detached) stream=0 ;;
  *) echo "usage: run.sh [--detached]" >&2; exit 2 ;;
esac

in_home() { case "$1" in /*) printf '%s' "$1" ;; *) printf '%s/%s' "$HOME" "$1" ;; esac; }
repo="$(in_home "$RMSWEB_REPO_DIR")"
venv="$(in_home "$RMSWEB_VENV_DIR")"
pid_file="$here/run.pid"
log_dir="$HOME/rmsweb_logs"
log="$log_dir/$RMSWEB_RUN_ID.log"

# The TPU metadata server numbers the workers of a slice; fall back to the hostname elsewhere.
worker="$(curl -sf -m 5 -H 'Metadata-Flavor: Google' \
  http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number \
  || hostname)"

# A previous run still holding the TPU would make this one fail later with "TPU in use".
if [[ -f "$pid_file" ]] && kill -0 "$(cat "$pid_file")" 2>/dev/null; then
  echo "[w$worker] error: a previous run (pid $(cat "$pid_file")) is still running; stop it with --stop" >&2
  exit 1
fi

mkdir -p "$log_dir"
ln -sfn "$log" "$log_dir/latest.log"
cd "$repo"
# shellcheck source=/dev/null
source "$venv/bin/activate"
export RMSWEB_DISTRIBUTED=1  # every worker calls jax.distributed.initialize (auto-detected on TPU VMs)
for kv in "${RMSWEB_EXPORTS[@]}"; do export "${kv?}"; done

# Its own session: a closing ssh (with or without a tty) or a Ctrl-C never reaches the run; stop.sh does.
setsid python -m rmsweb_jax.main "${RMSWEB_ARGS[@]}" >"$log" 2>&1 &
pid=$!
echo "$pid" >"$pid_file"
if ((stream)); then
  # --pid ends tail once python exits, so the ssh session closes with the run.
  tail -n +1 -F --pid="$pid" "$log" 2>/dev/null | sed -u "s/^/[w$worker] /" &
fi
status=0
wait "$pid" || status=$?
wait  # the tail above, flushing the last lines
rm -f "$pid_file"
echo "[w$worker] rmsweb_jax.main exited with status $status (log: $log)"
exit "$status"
