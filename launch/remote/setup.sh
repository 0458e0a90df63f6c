#!/usr/bin/env bash
# Runs on every TPU VM worker (shipped by launch/gcloud_tpu.sh with env.sh beside it): the code
# (tarball or git), then unless RMSWEB_INSTALL=0 Python >= 3.11 and a venv with `pip install -e .[tpu]`,
# and optionally a checkpoint copied from GCS to local disk. Safe to rerun.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=/dev/null
source "$here/env.sh"

log() { echo "[setup $(hostname)] $*"; }
die() { echo "[setup $(hostname)] error: $*" >&2; exit 1; }
in_home() { case "$1" in /*) printf '%s' "$1" ;; *) printf '%s/%s' "$HOME" "$1" ;; esac; }

repo="$(in_home "$RMSWEB_REPO_DIR")"
venv="$(in_home "$RMSWEB_VENV_DIR")"

# Replacing the code under a live run would break its later imports.
if [[ -f "$here/run.pid" ]] && kill -0 "$(cat "$here/run.pid")" 2>/dev/null; then
  die "a run (pid $(cat "$here/run.pid")) is still in progress; stop it first with --stop"
fi

# 1. Code. Replaced whole so files deleted locally do not linger; the venv lives outside it.
case "$RMSWEB_SOURCE" in
  tarball)
    [[ -f "$here/src.tar.gz" ]] || die "$here/src.tar.gz missing (the launcher copies it before setup)"
    rm -rf "$repo.new" && mkdir -p "$repo.new"
    tar -xzf "$here/src.tar.gz" -C "$repo.new"
    rm -rf "$repo" && mv "$repo.new" "$repo"
    ;;
  git)
    [[ -d "$repo/.git" ]] || { rm -rf "$repo" && git clone --quiet "$RMSWEB_REPO_URL" "$repo"; }
    # fetch + FETCH_HEAD works alike for a branch, a tag or a commit id.
    git -C "$repo" fetch --quiet origin "$RMSWEB_REF"
    git -C "$repo" checkout --quiet --detach FETCH_HEAD
    ;;
  *) die "RMSWEB_SOURCE=$RMSWEB_SOURCE: expected tarball or git" ;;
esac
log "code at $repo"

if [[ "$RMSWEB_INSTALL" != 1 ]]; then
  [[ -x "$venv/bin/python" ]] || die "no venv at $venv to reuse; launch once without --skip-setup"
  log "reusing the venv at $venv (--skip-setup)"
else
  # 2. Python. TPU VM images are Ubuntu 22.04 (python3.10); setup.py needs >= 3.11.
  if ! command -v "$RMSWEB_PYTHON" >/dev/null 2>&1; then
    [[ "$RMSWEB_PYTHON" =~ ^python3\.[0-9]+$ ]] \
      || die "$RMSWEB_PYTHON not found; pass --python=python3.11 or the path of a Python >= 3.11"
    log "installing $RMSWEB_PYTHON and $RMSWEB_PYTHON-venv from apt"
    # A fresh VM's unattended-upgrades can hold the dpkg lock for minutes: wait for it, not fail.
    sudo apt-get -o DPkg::Lock::Timeout=600 update -qq
    sudo DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
      "$RMSWEB_PYTHON" "$RMSWEB_PYTHON-venv" \
      || die "apt could not install $RMSWEB_PYTHON; install a Python >= 3.11 (deadsnakes, uv) and pass --python=PATH"
  fi
  "$RMSWEB_PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "$RMSWEB_PYTHON is $("$RMSWEB_PYTHON" -V 2>&1); rmsweb_jax needs Python >= 3.11"

  # 3. Venv. A current pip matters: old resolvers can backtrack for a very long time.
  [[ -x "$venv/bin/python" ]] || "$RMSWEB_PYTHON" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  # constraints.txt pins what CI tested on CPU; the tpu extra only adds packages it does not pin.
  constraints=()
  if [[ "$RMSWEB_CONSTRAINTS" != 1 ]]; then
    log "installing without constraints.txt (--no-constraints)"
  elif [[ -f "$repo/constraints.txt" ]]; then
    constraints=(-c "$repo/constraints.txt")
  else
    log "warning: $repo/constraints.txt not found; installing unpinned versions"
  fi
  "$venv/bin/python" -m pip install --quiet "${constraints[@]}" -e "${repo}[${RMSWEB_EXTRA}]"
  # Importing jax does not claim the TPU, so this is safe while other workers are still installing.
  "$venv/bin/python" -c 'import jax, rmsweb_jax; print("[setup] jax", jax.__version__, "from", jax.__file__)'
fi

# 4. Checkpoint. from_hf reads local files; rsync is resumable and skips what is already copied.
if [[ -n "$RMSWEB_CHECKPOINT_GCS" ]]; then
  log "copying $RMSWEB_CHECKPOINT_GCS -> $RMSWEB_CHECKPOINT_DIR"
  mkdir -p "$RMSWEB_CHECKPOINT_DIR"
  gcloud storage rsync --recursive "$RMSWEB_CHECKPOINT_GCS" "$RMSWEB_CHECKPOINT_DIR"
  [[ -f "$RMSWEB_CHECKPOINT_DIR/config.json" ]] \
    || die "$RMSWEB_CHECKPOINT_GCS has no config.json: expected an HF checkpoint folder"
fi
log "done"
