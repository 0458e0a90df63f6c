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


def test_a_bucket_quota_under_a_checkpoint_is_one_line_and_the_rerun_resumes(gcs_emulator, tmp_path):
    """A proxy in front of the emulator refuses the step-4 checkpoint's uploads as a project past its quota does
    (403 quotaExceeded): one line naming the bucket and the write, status 2; the rerun with the quota lifted resumes
    from the step-2 checkpoint."""
    from tests.quota_proxy import QuotaProxy
    from tests.storage_emulator import emulator_env
    run = uuid.uuid4().hex
    workdir = f"{gcs_emulator}/{run}/quota"
    command = [sys.executable, "-m", "rmsweb_jax.main", "--config=configs/common.py", f"--workdir={workdir}",
               "--config.stages=train_smoke", "--config.model.init=random:tiny", "--config.mesh.shape=(1,1,1)",
               "--config.train.batch_size=4", "--config.train.optimizer.total_steps=4",
               "--config.train.optimizer.warmup_steps=1", "--config.train.checkpoint.every_steps=2"]
    env = dict(os.environ, PYTHONPATH=str(REPO), XLA_FLAGS="--xla_force_host_platform_device_count=1")
    with QuotaProxy(os.environ["STORAGE_EMULATOR_HOST"], refused=f"{run}/quota/train_smoke/checkpoints/4/") as url:
        proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900,
                              env=dict(env, **emulator_env(url, tmp_path / "mirrors")))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("rmsweb:")]
    assert len(lines) == 1 and lines[0].startswith(f"rmsweb: error: the bucket under workdir {workdir} refused a "
                                                   "write: "), proc.stderr[-3000:]
    assert "Quota exceeded" in lines[0] and "checkpoints/4" in lines[0], lines[0]
    assert lines[0].endswith("raise the quota or free space and rerun the same command to resume")
    assert len(proc.stderr.splitlines()) < 60, proc.stderr  # no pages of writer threads' tracebacks

    rerun = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    summary = json.loads(storage.as_path(f"{workdir}/train_smoke/summary.json").read_text())
    assert summary["steps"] == 4 and summary["resumed_from"] == 2, summary
