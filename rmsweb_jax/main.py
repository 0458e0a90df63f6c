"""Entry point: `python -m rmsweb_jax.main --config=configs/demo.py --workdir=/tmp/run`.

Runs the stages named in `config.stages`, in order. Any config field can be overridden on the
command line (`--config.model.init=hf:/ckpt --config.stages=model`). Stages talk to each other only
through files in the workdir, so each can be rerun or resumed alone.
"""
from __future__ import annotations

import json
import pathlib
import time

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "ml_collections config file (path[:arg]).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for this run's outputs (created if missing).")
flags.mark_flags_as_required(["config", "workdir"])


def stage_table():
    """Returns {stage name: run(config, workdir)}; imported lazily so `--help` stays fast."""
    from rmsweb_jax.stages import action_accuracy, collect, model_smoke, sft, train_smoke
    return {"model": model_smoke.run, "collect": collect.run, "train_smoke": train_smoke.run, "sft": sft.run,
            "action_accuracy": action_accuracy.run}


def run_stages(config, workdir: str | pathlib.Path) -> None:
    """Runs config.stages in order, recording each stage's wall time in workdir/stages.json."""
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    # `--config.stages=collect,sft` arrives as one string: read it as the list it names.
    stages = ([s.strip() for s in config.stages.split(",") if s.strip()] if isinstance(config.stages, str)
              else list(config.stages))
    table = stage_table()
    unknown = [s for s in stages if s not in table]
    if unknown:
        raise ValueError(f"config.stages names unknown stage(s) {unknown}; known stages: {sorted(table)}")
    import jax
    writer = jax.process_index() == 0  # on a pod slice every host runs this; one writes the records
    if writer:
        (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))
    record = []
    for name in stages:
        logging.info("stage %s: starting (workdir %s)", name, workdir)
        start = time.time()
        table[name](config, workdir)
        record.append({"stage": name, "seconds": round(time.time() - start, 2)})
        logging.info("stage %s: done in %.1f s", name, record[-1]["seconds"])
        if writer:
            (workdir / "stages.json").write_text(json.dumps(record, indent=2))


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from rmsweb_jax.distributed import maybe_initialize_distributed
    maybe_initialize_distributed()  # multi-host only when RMSWEB_DISTRIBUTED=1 (see BUILD.md)
    run_stages(_CONFIG.value, _WORKDIR.value)


def run() -> None:
    """Console-script entry point (`rmsweb`)."""
    app.run(main)


if __name__ == "__main__":
    run()
