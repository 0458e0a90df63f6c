#!/usr/bin/env bash
# A stand-in for `gcloud compute tpus ...` that plays a one-worker TPU VM on this machine, so
# launch/gcloud_tpu.sh can run for real offline. Every call is appended to $FAKE_GCLOUD_LOG.
#   tpu-vm describe          -> NOT_FOUND until `create` ran, then READY
#   tpu-vm scp SRC NAME:     -> copies SRC into $FAKE_WORKER_HOME
#   tpu-vm ssh --command=C   -> runs C with bash in $FAKE_WORKER_HOME (as HOME)
set -euo pipefail
: "${FAKE_GCLOUD_LOG:?}" "${FAKE_WORKER_HOME:?}"
printf '%s\n' "$*" >>"$FAKE_GCLOUD_LOG"
state_file="$FAKE_WORKER_HOME/.fake_tpu_state"

[[ "$1 $2 $3" == "compute tpus tpu-vm" || "$1 $2 $3" == "compute tpus queued-resources" ]] \
  || { echo "fake gcloud: unsupported command: $*" >&2; exit 2; }
verb="$4"
shift 4
case "$verb" in
  describe)
    if [[ -f "$state_file" ]]; then cat "$state_file"; else
      echo "ERROR: (gcloud.compute.tpus.tpu-vm.describe) NOT_FOUND: Resource 'nodes/x' was not found" >&2
      exit 1
    fi
    ;;
  create) echo READY >"$state_file" ;;
  delete) rm -f "$state_file" ;;
  scp)
    src=""
    for a in "$@"; do [[ "$a" == --* || "$a" == *: ]] || src="$a"; done
    cp -r "$src" "$FAKE_WORKER_HOME/"
    ;;
  ssh)
    cmd=""
    for a in "$@"; do [[ "$a" != --command=* ]] || cmd="${a#--command=}"; done
    cd "$FAKE_WORKER_HOME"
    HOME="$FAKE_WORKER_HOME" bash -c "$cmd"  # ~ in the command expands to the fake home
    ;;
  *) echo "fake gcloud: unsupported verb $verb" >&2; exit 2 ;;
esac
