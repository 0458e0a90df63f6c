#!/usr/bin/env bash
# Creates (or reuses) a Cloud TPU VM or pod slice, ships this repo to every worker, installs it and runs
# `python -m rmsweb_jax.main` on all workers at once. See usage() below and launch/README.md.
set -euo pipefail

# Empty arrays under `set -u` need bash >= 4.4 (macOS ships 3.2: brew install bash).
if ((BASH_VERSINFO[0] < 4 || (BASH_VERSINFO[0] == 4 && BASH_VERSINFO[1] < 4))); then
  echo "gcloud_tpu.sh: error: needs bash >= 4.4, this is $BASH_VERSION" >&2
  exit 2
fi

usage() {
  cat <<'EOF'
Usage:
  launch/gcloud_tpu.sh --name=NAME --zone=ZONE --accelerator=TYPE --config=PATH[:ARG] --workdir=DIR \
      [options] [-- --config.a.b=VALUE ...]      create/reuse, ship code, install, run
  launch/gcloud_tpu.sh --name=NAME --zone=ZONE --logs [--log-worker=N]   follow a worker's latest log
  launch/gcloud_tpu.sh --name=NAME --zone=ZONE --stop                    stop the run on all workers
  launch/gcloud_tpu.sh --name=NAME --zone=ZONE --delete [--queued]       tear the TPU down

Required for a run:
  --name=NAME             TPU VM (node) name; also the queued-resource id with --queued
  --zone=ZONE             e.g. us-west4-a (v5e), us-east5-a (v5p)
  --accelerator=TYPE      v5litepod-8 (v5e, one host), v5litepod-16 (multi-host), v5p-8, v5p-32, v6e-8 ...
  --config=PATH[:ARG]     config file relative to the repo root, e.g. configs/qwen3_vl_8b.py
  --workdir=DIR           gs://BUCKET/FOLDER (one folder every worker sees), or an absolute path on the
                          workers; on a multi-host slice a path must be a folder every worker mounts
                          (a bucket through gcsfuse, with --shared-workdir; see below)

Options:
  --project=ID            GCP project (default: gcloud's configured project)
  --runtime-version=V     TPU software version (default from the accelerator: v2-alpha-tpuv5-lite for
                          v5litepod, v2-alpha-tpuv5 for v5p, v2-alpha-tpuv6e for v6e, else tpu-ubuntu2204-base)
  --spot                  Spot capacity (cheaper, preemptible)
  --retries=N             when the slice is preempted during the run (the VM is PREEMPTED, gone, or the run
                          exited 143 after SIGTERM), delete it, create it again and rerun the same command,
                          up to N times; the run resumes from the workdir's checkpoints (use a gs:// workdir
                          or a shared mount: a preempted VM's disk is gone). Foreground runs only.
  --queued                create through a queued resource and wait until it is ACTIVE
  --wait-minutes=N        how long to wait for a queued resource (default 120)
  --repo-url=URL          git clone URL on the workers instead of copying this working tree
  --ref=REF               branch, tag or commit for --repo-url (default main)
  --checkpoint=gs://B/DIR copy an HF checkpoint to each worker's local disk (resumable) and add
                          --config.model.init=hf:<local copy> (a later --config.model.init= wins)
  --checkpoint-root=DIR   local folder for --checkpoint (default /tmp/rmsweb_checkpoints)
  --env=KEY=VALUE         export on every worker before the run (repeatable), e.g. --env=XLA_FLAGS=...
  --python=BIN            Python >= 3.11 on the workers (default python3.11, apt-installed if missing)
  --no-constraints        pip install without -c constraints.txt (the CPU-tested pins; on by default)
  --skip-setup            reuse the installed venv: only ship the code (and checkpoint) and run
  --detach                start the run in the background and return; follow it with --logs
  --shared-workdir        --workdir on a multi-host slice is a folder every worker mounts at the same
                          path (gcsfuse, NFS), not each worker's own disk
  --internal-ip           ssh/scp over internal IPs (from a VM inside the VPC)
  --yes                   no confirmation prompt for --delete
  --dry-run               print every command (and the generated env.sh) instead of running anything
  -h, --help              this text

Everything after `--` is passed to rmsweb_jax.main unchanged (config overrides, absl flags).
Foreground runs stream every worker's output prefixed [wN]; Ctrl-C stops the streaming, not the run.
Multi-worker ssh needs your key in ssh-agent: ssh-add ~/.ssh/google_compute_engine

Multi-host slices (a type numbered past 8: v5litepod-16, v5p-16, v6e-16, v4-16 and up) need one
workdir that every worker sees, in practice a bucket. All workers save each Orbax checkpoint together,
each writing its own shards into the same directory, and resume from it; on each worker's own disk
each would hold a partial checkpoint that no worker can restore, and the store, metrics and reports
would be split across hosts. Pass --workdir=gs://BUCKET/runs/NAME: the stages model, collect,
train_smoke, sft and action_accuracy read and write the bucket directly (Orbax checkpoints through
tensorstore, the rest through etils.epath/gcsfs). mine, salvage, eval and table still write local
paths: for them rmsweb_jax.main refuses a gs:// workdir at start, naming them; mount the bucket with
gcsfuse at the same path on every worker (gcsfuse --implicit-dirs BUCKET /mnt/BUCKET) and pass
--workdir=/mnt/BUCKET/runs/NAME --shared-workdir. The workers reach the bucket with the TPU VM's
service account (created with the cloud-platform scope); keep the bucket in the slice's region.
EOF
}

die() { echo "gcloud_tpu.sh: error: $*" >&2; exit 2; }
warn() { echo "gcloud_tpu.sh: warning: $*" >&2; }
note() { echo "# $*"; }

# Prints one shell word, quoted only when it needs to be, so dry-run output can be pasted back.
quote() {
  if [[ "$1" =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then printf '%s' "$1"; else printf "'%s'" "${1//\'/\'\\\'\'}"; fi
}
words() {
  local out="" word
  for word in "$@"; do out+="${out:+ }$(quote "$word")"; done
  printf '%s' "$out"
}
show() { echo "+ $(words "$@")"; }
# Runs a command, or only prints it under --dry-run.
run() {
  show "$@"
  if ((DRY_RUN)); then return 0; fi
  "$@"
}

# ---- arguments -------------------------------------------------------------------------------
NAME="" ZONE="" ACCELERATOR="" CONFIG="" WORKDIR="" PROJECT="" RUNTIME_VERSION=""
SPOT=0 QUEUED=0 WAIT_MINUTES=120 REPO_URL="" REF="main" CHECKPOINT="" CHECKPOINT_ROOT="/tmp/rmsweb_checkpoints"
RETRIES=0 PYTHON="python3.11" CONSTRAINTS=1 SKIP_SETUP=0 DETACH=0 SHARED_WORKDIR=0 INTERNAL_IP=0 YES=0 DRY_RUN=0 ACTION="launch" LOG_WORKER=0
EXPORTS=() MAIN_ARGS=()

set_action() {
  [[ "$ACTION" == launch || "$ACTION" == "$1" ]] || die "--$ACTION and --$1 cannot be combined"
  ACTION="$1"
}

while (($#)); do
  arg="$1"
  shift
  case "$arg" in
    --) MAIN_ARGS+=("$@"); break ;;
    -h | --help) usage; exit 0 ;;
    --spot) SPOT=1; continue ;;
    --queued) QUEUED=1; continue ;;
    --skip-setup) SKIP_SETUP=1; continue ;;
    --no-constraints) CONSTRAINTS=0; continue ;;
    --detach) DETACH=1; continue ;;
    --shared-workdir) SHARED_WORKDIR=1; continue ;;
    --internal-ip) INTERNAL_IP=1; continue ;;
    --yes) YES=1; continue ;;
    --dry-run) DRY_RUN=1; continue ;;
    --delete | --logs | --stop) set_action "${arg#--}"; continue ;;
    --*=*) key="${arg%%=*}" value="${arg#*=}" ;;
    --*)
      key="$arg"
      # A following option is a forgotten value, not the value: `--zone --dry-run` must not mean zone "--dry-run".
      [[ $# -gt 0 && "$1" != --* ]] || die "$key needs a value (try --help)"
      value="$1"
      shift
      ;;
    *) die "unexpected argument '$arg'; config overrides go after '--' (try --help)" ;;
  esac
  case "$key" in
    --name) NAME="$value" ;;
    --zone) ZONE="$value" ;;
    --accelerator) ACCELERATOR="$value" ;;
    --config) CONFIG="$value" ;;
    --workdir) WORKDIR="$value" ;;
    --project) PROJECT="$value" ;;
    --runtime-version) RUNTIME_VERSION="$value" ;;
    --wait-minutes) WAIT_MINUTES="$value" ;;
    --repo-url) REPO_URL="$value" ;;
    --ref) REF="$value" ;;
    --checkpoint) CHECKPOINT="${value%/}" ;;
    --checkpoint-root) CHECKPOINT_ROOT="${value%/}" ;;
    --env) EXPORTS+=("$value") ;;
    --python) PYTHON="$value" ;;
    --log-worker) LOG_WORKER="$value" ;;
    --retries) RETRIES="$value" ;;
    *) die "unknown option '$key' (try --help)" ;;
  esac
done

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

[[ -n "$NAME" ]] || die "--name is required (the TPU VM name)"
[[ -n "$ZONE" ]] || die "--zone is required (e.g. --zone=us-west4-a)"
[[ "$NAME" =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ ]] \
  || die "--name=$NAME: expected lowercase letters, digits and '-', starting with a letter"
[[ "$LOG_WORKER" =~ ^[0-9]+$ ]] || die "--log-worker=$LOG_WORKER: expected a worker number (0, 1, ...)"
[[ "$WAIT_MINUTES" =~ ^[0-9]+$ ]] || die "--wait-minutes=$WAIT_MINUTES: expected a whole number of minutes"
[[ "$RETRIES" =~ ^[0-9]+$ ]] || die "--retries=$RETRIES: expected a whole number of retries"
((RETRIES == 0 || DETACH == 0)) || die "--retries watches the run to its end: it cannot be combined with --detach"

GC=(gcloud compute tpus)
LOC=("--zone=$ZONE")
[[ -z "$PROJECT" ]] || LOC+=("--project=$PROJECT")
SSH_OPTS=()
((INTERNAL_IP == 0)) || SSH_OPTS+=(--internal-ip)

ssh_workers() {  # ssh_workers WORKER COMMAND
  run "${GC[@]}" tpu-vm ssh "$NAME" "${LOC[@]}" "--worker=$1" "${SSH_OPTS[@]}" \
    --ssh-flag=-oServerAliveInterval=60 "--command=$2"
}

# ---- the small actions ------------------------------------------------------------------------
case "$ACTION" in
  logs)
    ssh_workers "$LOG_WORKER" 'tail -n 200 -F ~/rmsweb_logs/latest.log'
    exit 0
    ;;
  stop)
    ssh_workers all 'bash ~/rmsweb_launch/stop.sh'
    exit 0
    ;;
  delete)
    QUIET=()
    ((YES == 0)) || QUIET=(--quiet)
    if ((QUEUED)); then
      # --force deletes the node together with its queued resource.
      run "${GC[@]}" queued-resources delete "$NAME" "${LOC[@]}" --force "${QUIET[@]}"
    else
      run "${GC[@]}" tpu-vm delete "$NAME" "${LOC[@]}" "${QUIET[@]}"
    fi
    exit 0
    ;;
esac

# ---- a run: check everything before touching the cloud ------------------------------------------
[[ -n "$ACCELERATOR" ]] || die "--accelerator is required (e.g. --accelerator=v5litepod-8)"
[[ -n "$CONFIG" ]] || die "--config is required (e.g. --config=configs/qwen3_vl_8b.py)"
[[ -n "$WORKDIR" ]] || die "--workdir is required (e.g. --workdir=/mnt/MY_BUCKET/runs/8b)"
case "$WORKDIR" in
  gs://?*/*) ;;  # one folder every worker sees; rmsweb_jax.main refuses the stages that cannot write it yet
  gs://*) die "--workdir=$WORKDIR: expected gs://BUCKET/FOLDER" ;;
  /*)
    # A type numbered past 8 spans several hosts (v5litepod-16: 4 hosts of 4 chips; v5p-16: 2 hosts of 4
    # chips, v5p counting TensorCores); v5litepod-8, v5p-8, v6e-8 and v4-8 are one host.
    type_number="${ACCELERATOR##*-}"
    if [[ "$type_number" =~ ^[0-9]+$ ]] && ((type_number > 8 && SHARED_WORKDIR == 0)); then
      die "--workdir=$WORKDIR on $ACCELERATOR (multi-host): each worker would write its own copy, and Orbax" \
        "needs one directory every host sees; mount a bucket with gcsfuse at $WORKDIR on every worker and add --shared-workdir"
    fi
    ;;
  *) die "--workdir=$WORKDIR: expected an absolute path (the code folder is replaced on every launch)" ;;
esac
if [[ -z "$RUNTIME_VERSION" ]]; then
  case "$ACCELERATOR" in
    v6e-*) RUNTIME_VERSION=v2-alpha-tpuv6e ;;
    v5p-*) RUNTIME_VERSION=v2-alpha-tpuv5 ;;
    v5litepod-*) RUNTIME_VERSION=v2-alpha-tpuv5-lite ;;
    v2-* | v3-* | v4-*) RUNTIME_VERSION=tpu-ubuntu2204-base ;;
    *) die "--accelerator=$ACCELERATOR: no default runtime version; pass --runtime-version" ;;
  esac
fi
if [[ -z "$REPO_URL" ]]; then
  git -C "$REPO_ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1 \
    || die "$REPO_ROOT is not a git checkout; pass --repo-url to clone on the workers instead"
  [[ -f "$REPO_ROOT/${CONFIG%%:*}" ]] || die "--config=$CONFIG: no file ${CONFIG%%:*} under $REPO_ROOT"
fi
[[ -z "$CHECKPOINT" || "$CHECKPOINT" == gs://* ]] || die "--checkpoint=$CHECKPOINT: expected gs://bucket/folder"
for kv in "${EXPORTS[@]}"; do
  [[ "$kv" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env=$kv: expected KEY=VALUE"
done

RUN_ID="rmsweb_$(date -u +%Y%m%d_%H%M%S)"
ARGS=("--config=$CONFIG" "--workdir=$WORKDIR")
CHECKPOINT_DIR=""
if [[ -n "$CHECKPOINT" ]]; then
  CHECKPOINT_DIR="$CHECKPOINT_ROOT/${CHECKPOINT##*/}"
  ARGS+=("--config.model.init=hf:$CHECKPOINT_DIR")
fi
ARGS+=("${MAIN_ARGS[@]}")

# ---- 1. the TPU: reuse a READY one, else create it -------------------------------------------------
vm_state() {  # prints the VM state, or nothing when it does not exist
  local err
  err="$(mktemp)"
  if "${GC[@]}" tpu-vm describe "$NAME" "${LOC[@]}" --format='value(state)' 2>"$err"; then
    rm -f "$err"
    return 0
  fi
  if grep -qiE 'not.?found' "$err"; then rm -f "$err"; return 0; fi
  echo "gcloud_tpu.sh: error: could not describe TPU $NAME:" >&2
  cat "$err" >&2
  rm -f "$err"
  exit 1
}

wait_for_queued_resource() {
  local deadline=$((SECONDS + WAIT_MINUTES * 60)) state="" last=""
  while :; do
    state="$("${GC[@]}" queued-resources describe "$NAME" "${LOC[@]}" --format='value(state.state)')"
    [[ "$state" == "$last" ]] || echo "queued resource $NAME: $state"
    last="$state"
    case "$state" in
      ACTIVE) return 0 ;;
      FAILED | SUSPENDED | SUSPENDING) die "queued resource $NAME is $state; see: gcloud compute tpus queued-resources describe $NAME ${LOC[*]}" ;;
    esac
    ((SECONDS < deadline)) || die "queued resource $NAME still $state after $WAIT_MINUTES minutes (it stays queued; rerun to keep waiting, or --delete --queued)"
    sleep 30
  done
}

create_tpu() {
  local capacity=()
  ((SPOT == 0)) || capacity=(--spot)
  # The workers read the checkpoint bucket with the VM's service account: give it the full scope.
  local common=("--accelerator-type=$ACCELERATOR" "${LOC[@]}" "${capacity[@]}"
    --scopes=https://www.googleapis.com/auth/cloud-platform)
  if ((QUEUED)); then
    run "${GC[@]}" queued-resources create "$NAME" "--node-id=$NAME" "--runtime-version=$RUNTIME_VERSION" "${common[@]}"
    if ((DRY_RUN)); then
      note "then poll: ${GC[*]} queued-resources describe $NAME ${LOC[*]} --format='value(state.state)' until ACTIVE"
    else
      wait_for_queued_resource
    fi
  else
    run "${GC[@]}" tpu-vm create "$NAME" "--version=$RUNTIME_VERSION" "${common[@]}"
  fi
}

delete_tpu() {
  if ((QUEUED)); then
    run "${GC[@]}" queued-resources delete "$NAME" "${LOC[@]}" --force --quiet
  else
    run "${GC[@]}" tpu-vm delete "$NAME" "${LOC[@]}" --quiet
  fi
}

ensure_tpu() {  # reuses a READY TPU, else creates it (a preempted one is deleted first when --retries allows)
  show "${GC[@]}" tpu-vm describe "$NAME" "${LOC[@]}" "--format=value(state)"
  if ((DRY_RUN)); then
    note "dry run: assuming $NAME does not exist yet"
    create_tpu
    return 0
  fi
  local state
  state="$(vm_state)"
  case "$state" in
    READY) echo "reusing TPU VM $NAME (READY)" ;;
    "")
      if ((QUEUED)) && "${GC[@]}" queued-resources describe "$NAME" "${LOC[@]}" >/dev/null 2>&1; then
        echo "queued resource $NAME already requested; waiting for it"
        wait_for_queued_resource
      else
        create_tpu
      fi
      ;;
    PREEMPTED | TERMINATED)
      ((RETRIES > 0)) || die "TPU VM $NAME exists but is $state (expected READY); --delete it and rerun, or pass --retries=N"
      echo "TPU VM $NAME is $state: deleting it and creating it again"
      delete_tpu
      create_tpu
      ;;
    *) die "TPU VM $NAME exists but is $state (expected READY); if it was preempted, --delete it and rerun" ;;
  esac
  ssh-add -l >/dev/null 2>&1 || warn "no key in ssh-agent; --worker=all may prompt per worker (ssh-add ~/.ssh/google_compute_engine)"
}

# ---- 2. the bundle every worker gets: env.sh, the remote scripts, and the code --------------------
write_env() {
  printf '# written by launch/gcloud_tpu.sh for run %s\n' "$RUN_ID"
  printf 'RMSWEB_RUN_ID=%q\n' "$RUN_ID"
  printf 'RMSWEB_SOURCE=%q\n' "$([[ -n "$REPO_URL" ]] && echo git || echo tarball)"
  printf 'RMSWEB_REPO_URL=%q\n' "$REPO_URL"
  printf 'RMSWEB_REF=%q\n' "$REF"
  printf 'RMSWEB_REPO_DIR=%q\n' rmsweb_jax
  printf 'RMSWEB_VENV_DIR=%q\n' rmsweb_venv
  printf 'RMSWEB_PYTHON=%q\n' "$PYTHON"
  printf 'RMSWEB_EXTRA=%q\n' tpu
  printf 'RMSWEB_CONSTRAINTS=%q\n' "$CONSTRAINTS"
  printf 'RMSWEB_INSTALL=%q\n' "$((1 - SKIP_SETUP))"
  printf 'RMSWEB_CHECKPOINT_GCS=%q\n' "$CHECKPOINT"
  printf 'RMSWEB_CHECKPOINT_DIR=%q\n' "$CHECKPOINT_DIR"
  printf 'RMSWEB_EXPORTS=('
  ((${#EXPORTS[@]} == 0)) || printf ' %q' "${EXPORTS[@]}"
  printf ' )\n'
  printf 'RMSWEB_ARGS=('
  printf ' %q' "${ARGS[@]}"
  printf ' )\n'
}

if ((DRY_RUN)); then
  BUNDLE="${TMPDIR:-/tmp}/rmsweb_launch"
else
  STAGING="$(mktemp -d)"
  trap 'rm -rf "$STAGING"' EXIT
  BUNDLE="$STAGING/rmsweb_launch"
  mkdir -p "$BUNDLE"
fi
note "env.sh for the workers:"
if ((DRY_RUN)); then write_env | sed 's/^/#   /'; else write_env | tee "$BUNDLE/env.sh" | sed 's/^/#   /'; fi
run cp "$REPO_ROOT/launch/remote/setup.sh" "$REPO_ROOT/launch/remote/run.sh" "$REPO_ROOT/launch/remote/stop.sh" "$BUNDLE/"
if [[ -z "$REPO_URL" ]]; then
  # Tracked and untracked-but-not-ignored files: the working tree as git sees it, without .venv.
  files="${BUNDLE%/*}/files"
  list=(git -C "$REPO_ROOT" ls-files -z --cached --others --exclude-standard)
  echo "+ $(words "${list[@]}") > $(quote "$files")"
  ((DRY_RUN)) || "${list[@]}" >"$files"
  # --ignore-failed-read: a tracked file deleted in the working tree is skipped, not fatal.
  run tar -czf "$BUNDLE/src.tar.gz" -C "$REPO_ROOT" --null --ignore-failed-read -T "$files"
fi

# ---- 3. ship, install, run on all workers; a preempted slice is created again (--retries) --------------
attempt=0
while :; do
  ensure_tpu
  run "${GC[@]}" tpu-vm scp --recurse "$BUNDLE" "$NAME:" "${LOC[@]}" --worker=all "${SSH_OPTS[@]}"
  ssh_workers all 'bash ~/rmsweb_launch/setup.sh'
  if ((DETACH)); then
    # setsid + closed fds: the run outlives this ssh session.
    ssh_workers all 'setsid nohup bash ~/rmsweb_launch/run.sh --detached >/dev/null 2>&1 </dev/null &'
    echo "started $RUN_ID on all workers; follow it with: $0 --name=$NAME ${LOC[*]} --logs"
    exit 0
  fi
  status=0
  ssh_workers all 'bash ~/rmsweb_launch/run.sh' || status=$?
  ((status != 0 && attempt < RETRIES && DRY_RUN == 0)) || exit "$status"
  state="$(vm_state)"
  case "$state" in
    PREEMPTED | TERMINATED | "") ;;
    *) ((status == 143)) || exit "$status" ;;  # 143: the run saved its step after a SIGTERM (preemption)
  esac
  attempt=$((attempt + 1))
  echo "gcloud_tpu.sh: the run ended with status $status and TPU VM $NAME is ${state:-gone}: preempted;" \
    "retry $attempt of $RETRIES (the run resumes from $WORKDIR)"
done
