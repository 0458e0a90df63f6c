"""The micro recipe collect -> sft -> mine -> salvage -> eval -> table with --workdir=gs://... on a GCS emulator on
127.0.0.1: the store and its viewer, the SFT and Salvage-DS checkpoints, metrics and exports, the state set, the
reports, the eval stores, report and viewer, the table's variants (linked to the main stages by their links.json)
and the table land on the bucket (nothing in a local folder named "gs:"); an SFT run on the same store SIGKILLed
after its first checkpoint reached the bucket resumes from it (data iterator included) and ends with the losses and
parameters of the unbroken run; a rerun skips every stage."""
import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import uuid

import numpy as np
import pytest

from rmsweb_jax import storage
from rmsweb_jax.stages import manifest
from rmsweb_jax.train.metrics import read_metrics

REPO = pathlib.Path(__file__).resolve().parents[2]
STAGES = ("collect", "sft", "mine", "salvage", "eval", "table")
SFT_STEPS, EVERY = 4, 2


def _run(workdir: str, *, stages=STAGES, store_dir: str = "", die_after_checkpoint: int = 0) -> str:
    """Runs the micro recipe's `stages` on `workdir` in a fresh process; returns its stdout. `store_dir`: the store
    SFT trains on (default the workdir's); `die_after_checkpoint`: SIGKILLed right after that SFT checkpoint is on
    the bucket."""
    script = textwrap.dedent(f"""
        import os, signal
        from rmsweb_jax.stages.pipeline import run_pipeline
        from rmsweb_jax.train.loop import Trainer
        from tests.stages.micro_pipeline import micro_pipeline_config
        c = micro_pipeline_config()
        c.stages = {tuple(stages)!r}
        c.train.optimizer.total_steps = {SFT_STEPS}  # checkpoints every {EVERY} (train.checkpoint.every_steps)
        c.salvage.train.total_steps = 2
        c.data.store_dir = {store_dir!r}
        c.eval.viewer = c.collect.viewer = True
        die = {die_after_checkpoint}
        real_save = Trainer.save
        def save(self):
            real_save(self)
            if self.run_dir.name == "sft" and self.step_count == die:
                self.checkpoints.wait()  # the checkpoint and the metrics of its steps are on the bucket
                os.kill(os.getpid(), signal.SIGKILL)
        Trainer.save = save
        run_pipeline(c, {workdir!r})
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    if die_after_checkpoint:
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    else:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _final_params(workdir: str) -> dict:
    import orbax.checkpoint as ocp
    with ocp.PyTreeCheckpointer() as ckpt:
        return ckpt.restore(storage.as_path(workdir) / "sft" / "checkpoints" / str(SFT_STEPS) / "state")


def _losses(workdir: str) -> dict[int, float]:
    return {step: m["loss"] for step, m in read_metrics(f"{workdir}/sft/metrics.jsonl").items()}


@pytest.mark.slow
@pytest.mark.browser
def test_the_micro_recipe_on_a_bucket_writes_there_resumes_sft_after_a_kill_and_skips_when_done(gcs_emulator,
                                                                                                 tmp_path):
    root = f"{gcs_emulator}/{uuid.uuid4().hex}"
    run, killed = f"{root}/run", f"{root}/killed"
    out = _run(run)
    assert all(f"[{stage}] running" in out for stage in STAGES), out
    files = storage.remote_files(run)
    for name in ("config.json", "stages.json", "store/store.json", "collect_report.json", "collect_report.png",
                 "sft/split.json", "sft/summary.json", "sft/metrics.jsonl", "sft/hf/config.json",
                 "checkpoints/random_demo/config.json", "mine/states.arrayrecord", "mine/report.json", "mine/report.md", "mine/failure_modes.png",
                 "mine/summary.json", "salvage/summary.json", "salvage/metrics.jsonl", "salvage/hf/config.json",
                 "eval/eval_report.json", "eval/eval_report.md", "eval/eval_report.png", "eval/training_curves.png",
                 "eval/viewer/index.html", "collect_viewer/index.html", "demo_table.json", "demo_table.md",
                 "variants/plain_collect/store/store.json", "variants/sft_first/links.json",
                 "variants/sft_first/manifests/collect.json", "variants/sft_first/sft/split.json",
                 "variants/sft_first/eval/eval_report.json", *(f"manifests/{stage}.json" for stage in STAGES)):
        assert name in files, sorted(files)
    for folder in (f"sft/checkpoints/{SFT_STEPS}/", "salvage/checkpoints/2/", "sft/tensorboard/"):
        assert any(name.startswith(folder) for name in files), folder
    report = json.loads(storage.as_path(f"{run}/eval/eval_report.json").read_text())
    assert [p["label"] for p in report["policies"]] == ["sft", "salvage"]
    for policy in report["policies"]:  # each policy's episodes are a store on the bucket
        assert policy["store_dir"].startswith(f"{run}/eval/") and f"{policy['store_dir'][len(run) + 1:]}/store.json" \
            in files
        assert policy["overall"]["episodes"] == 2  # 2 tasks x 1 seed
    pages = [name for name in files if name.startswith("eval/viewer/episodes/") and name.endswith(".html")]
    assert len(pages) == 4, pages  # 2 policies x 2 episodes
    # The table: its variants read the main store through links.json (a bucket has no symbolic links).
    assert json.loads(storage.as_path(f"{run}/variants/sft_first/links.json").read_text()) == {"store": f"{run}/store"}
    assert json.loads(storage.as_path(f"{run}/variants/sft_first/sft/split.json").read_text())["store_dir"] == \
        f"{run}/store"
    table = json.loads(storage.as_path(f"{run}/demo_table.json").read_text())
    assert table["collection"]["plain"]["store_dir"] == f"{run}/variants/plain_collect/store"
    assert [r["key"] for r in table["policies"]["rows"]] == ["sft_first", "sft", "rmsweb"]
    assert all(r["episodes"] == 2 and r["store_dir"].startswith(f"{run}/") for r in table["policies"]["rows"])
    assert "# RMSWeb at this scale" in storage.as_path(f"{run}/demo_table.md").read_text()
    mined = json.loads(storage.as_path(f"{run}/mine/summary.json").read_text())
    assert mined["state_set"]["path"] == f"{run}/mine/states.arrayrecord" and mined["states"] >= 1
    assert not (REPO / "gs:").exists() and not (tmp_path / "gs:").exists()

    # SFT on the same store, killed after its first checkpoint, then rerun: it resumes.
    _run(killed, stages=("sft",), store_dir=f"{run}/store", die_after_checkpoint=EVERY)
    on_bucket = storage.remote_files(f"{killed}/sft/checkpoints")
    assert {name.split("/")[0] for name in on_bucket} == {str(EVERY)}, sorted(on_bucket)
    assert not manifest.read_manifest(killed, "sft")["complete"]
    out = _run(killed, stages=("sft",), store_dir=f"{run}/store")
    assert "[sft] running: its last run (started" in out and "did not complete: resuming" in out
    assert f"resumed from checkpoint step {EVERY}" in out
    assert json.loads(storage.as_path(f"{killed}/sft/summary.json").read_text())["resumed_from"] == EVERY
    # The data iterator's state is in the checkpoint: the same batches, losses and final parameters as unbroken.
    assert _losses(killed) == _losses(run) and len(_losses(run)) == SFT_STEPS
    import jax
    want, got = _final_params(run), _final_params(killed)
    pairs = list(zip(jax.tree_util.tree_leaves_with_path(want), jax.tree_util.tree_leaves_with_path(got)))
    assert pairs
    for (path, a), (_, b) in pairs:
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(path))

    # A finished bucket workdir: nothing is redone.
    out = _run(run)
    assert all(f"[{stage}] skipped: up to date" in out for stage in STAGES), out
