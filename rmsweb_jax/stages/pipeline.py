"""The stage runner: config.stages in order, each skipped when its manifest says it is up to date.

rmsweb_jax/main.py runs it on the user's workdir; the `table` stage runs it again on each variant's
sub-workdir (<workdir>/variants/<name>/, a config copy with a few fields changed), so a variant's
stages skip and rerun by the same manifests as the main ones (rmsweb_jax/stages/manifest.py).
"""
from __future__ import annotations

import importlib
import json
import pathlib
import time

from absl import logging

from rmsweb_jax import preemption, storage
from rmsweb_jax.errors import UserError

# Stage name -> the module of rmsweb_jax.stages whose run(config, workdir) runs it, imported when needed
# (so that --help and a misspelt stage name answer at once).
STAGES = {"model": "model_smoke", "collect": "collect", "train_smoke": "train_smoke", "base": "base",
          "ground": "ground", "sft": "sft", "action_accuracy": "action_accuracy", "mine": "mine",
          "salvage": "salvage", "eval": "eval", "transfer": "transfer", "table": "table"}
STAGES_FILE = "stages.json"  # per run: each stage's decision, reason and wall time


def stage_module(name: str):
    """Returns the module of stage `name` (its run(config, workdir) and its manifest declarations)."""
    return importlib.import_module(f"rmsweb_jax.stages.{STAGES[name]}")


def stage_names(stages) -> list[str]:
    """Returns config.stages as a list of known stage names, or raises UserError naming the unknown ones.

    Takes a tuple of names or comma-separated strings: `--config.stages=collect,sft` reaches the
    config as the one-element tuple ('collect,sft',), `--config.stages="('collect','sft')"` as two.
    """
    parts = [stages] if isinstance(stages, str) else list(stages)
    names = [name.strip() for part in parts for name in str(part).split(",") if name.strip()]
    unknown = [name for name in names if name not in STAGES]
    if unknown or not names:
        what = f"names unknown stage(s) {unknown}" if unknown else "names no stage"
        raise UserError(f"config.stages = {stages!r} {what}; known stages: {sorted(STAGES)} "
                        "(e.g. --config.stages=collect,sft)")
    return names


def check_stages(config, workdir: str | pathlib.Path) -> None:
    """Returns None once every stage of config.stages has built its settings from the config (each stage's
    check_config: the same builders its run() calls first, no model, browser or file read); raises UserError
    naming the stage whose settings refused a value. main.py calls it before the workdir lock and the first
    stage, so a mistake in a late stage's settings fails in seconds, not after the stages before it ran."""
    for name in stage_names(config.stages):
        try:
            stage_module(name).check_config(config, workdir)
        except UserError as err:
            raise UserError(f"stage {name}'s settings refused the config (checked before any stage ran): "
                            f"{err}") from err


def run_pipeline(config, workdir: str | pathlib.Path, *, prefix: str = "") -> list[dict]:
    """Returns the record of each stage of config.stages (stage, ran, reason, seconds), having run them in
    order, each unless its manifest says it is up to date (config.rerun forces some), printing
    "[<prefix><stage>] running|skipped: <why>"; the record is also written to workdir/stages.json."""
    from rmsweb_jax.stages import manifest
    stages = stage_names(config.stages)  # before anything is created or imported
    forced = manifest.forced_stages(config.rerun, stages, STAGES)
    workdir = storage.as_path(workdir)  # a pathlib.Path, or an etils.epath.Path on a bucket (another scheme: refused)
    workdir.mkdir(parents=True, exist_ok=True)
    import jax  # deferred, here and in _agreed: main's flag and config checks run without JAX's import (~2 s)
    writer = jax.process_index() == 0  # on a pod slice every host runs this; one writes the records
    if writer:
        storage.write_text_atomic(workdir / "config.json", config.to_json_best_effort(indent=2))
    record = []
    for name in stages:
        if preemption.noticed():  # a SIGTERM whose Preempted was lost (main.Stop) stops the run here
            raise preemption.Preempted()
        decl = manifest.Declaration.of(name, stage_module(name))
        decision = _agreed(manifest.decide(decl, config, workdir, forced=name in forced))
        print(f"[{prefix}{name}] {'running' if decision.run else 'skipped'}: {decision.reason}", flush=True)
        record.append({"stage": name, "ran": decision.run, "reason": decision.reason, "seconds": 0.0})
        if writer:
            storage.write_text_atomic(workdir / STAGES_FILE, json.dumps(record, indent=2))
            if decision.settings_changed:  # skipped as done: the next run compares with these values
                manifest.record_settings(decl, config, workdir)
        if decision.run:
            logging.info("stage %s%s: starting (workdir %s)", prefix, name, workdir)
            start = time.time()
            if decision.fresh and writer:
                moved = manifest.set_aside(decl, workdir)
                if moved:
                    print(f"[{prefix}{name}] starting afresh: its previous outputs moved to {moved}", flush=True)
            begun = manifest.started(decl, config, workdir) if writer else None
            stage_module(name).run(config, workdir)
            record[-1]["seconds"] = round(time.time() - start, 2)
            if writer:
                manifest.completed(decl, begun, config, workdir, record[-1]["seconds"])
            logging.info("stage %s%s: done in %.1f s", prefix, name, record[-1]["seconds"])
        if writer:
            storage.write_text_atomic(workdir / STAGES_FILE, json.dumps(record, indent=2))
    return record


def _agreed(decision):
    """Returns process 0's decision on every process of a pod slice (all must run or skip a stage together,
    whatever each host sees of the workdir)."""
    import jax
    if jax.process_count() == 1:
        return decision
    import numpy as np
    from jax.experimental import multihost_utils
    run = bool(multihost_utils.broadcast_one_to_all(np.int32(decision.run)))
    return decision if run == decision.run else type(decision)(run, "as process 0 decided")
