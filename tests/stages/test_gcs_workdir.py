"""The model and train_smoke stages through the absl entry point with --workdir=gs://... on a GCS emulator on
127.0.0.1 (the whole recipe on a bucket, killed and resumed: tests/stages/test_gcs_recipe.py)."""
import json
import os
import pathlib
import subprocess
import sys
import uuid

from rmsweb_jax import storage

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_the_model_and_train_smoke_stages_write_a_bucket_workdir_through_the_entry_point(gcs_emulator):
    workdir = f"{gcs_emulator}/{uuid.uuid4().hex}/smoke"
    command = [sys.executable, "-m", "rmsweb_jax.main", "--config=configs/common.py", f"--workdir={workdir}",
               "--config.stages=model,train_smoke", "--config.model.init=random:tiny", "--config.mesh.shape=(1,1,1)",
               "--config.train.batch_size=4", "--config.train.optimizer.total_steps=2",
               "--config.train.optimizer.warmup_steps=1", "--config.train.checkpoint.every_steps=2",
               "--config.train.checkpoint.async_save=False"]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = storage.remote_files(workdir)
    for name in ("model_smoke.json", "train_smoke/summary.json", "train_smoke/metrics.jsonl",
                 "train_smoke/hf/config.json", "manifests/model.json", "manifests/train_smoke.json"):
        assert name in files, sorted(files)
    assert any(name.startswith("train_smoke/checkpoints/2/") for name in files)
    assert json.loads(storage.as_path(f"{workdir}/train_smoke/summary.json").read_text())["steps"] == 2
    assert not (REPO / "gs:").exists()
