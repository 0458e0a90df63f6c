#!/usr/bin/env bash
# Runs on every TPU VM worker: stops the run that run.sh started (by its recorded pid), waiting up to
# 60 s for it to exit so the TPU is free for the next run.
set -euo pipefail

pid_file="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/run.pid"
if [[ ! -f "$pid_file" ]] || ! kill -0 "$(cat "$pid_file")" 2>/dev/null; then
  echo "[stop $(hostname)] no run in progress"
  exit 0
fi
pid="$(cat "$pid_file")"
kill "$pid"
for _ in $(seq 60); do
  kill -0 "$pid" 2>/dev/null || { echo "[stop $(hostname)] stopped pid $pid"; exit 0; }
  sleep 1
done
echo "[stop $(hostname)] pid $pid did not exit within 60 s of SIGTERM; sending SIGKILL" >&2
kill -9 "$pid" 2>/dev/null || true
