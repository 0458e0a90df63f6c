"""Entry point: `python -m rmsweb_jax.main --config=configs/demo.py --workdir=/tmp/run`.

Runs the stages named in `config.stages`, in order. Any config field can be overridden on the
command line (`--config.model.init=hf:/ckpt --config.stages=collect,sft`). Stages talk to each other
only through files in the workdir, so each can be rerun or resumed alone.

A user's mistake (an unknown stage or override key, a bad value, a missing checkpoint or store:
rmsweb_jax.errors.UserError) prints one line naming the value and what would work, and exits with
status 2; --verbosity=1 or RMSWEB_TRACEBACK=1 shows the traceback instead.
"""
from __future__ import annotations

import importlib
import json
import os
import pathlib
import sys
import time

from absl import app, flags, logging
from ml_collections import config_flags

from rmsweb_jax.errors import UserError

_CONFIG = config_flags.DEFINE_config_file("config", None, "ml_collections config file (path[:arg]).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for this run's outputs (created if missing).")
flags.mark_flags_as_required(["config", "workdir"])

# Stage name -> the module of rmsweb_jax.stages whose run(config, workdir) runs it, imported when needed
# (so that --help and a misspelt stage name answer at once).
STAGES = {"model": "model_smoke", "collect": "collect", "train_smoke": "train_smoke", "sft": "sft",
          "action_accuracy": "action_accuracy", "mine": "mine",
          "salvage": "salvage", "eval": "eval"}
USAGE_ERROR = 2  # exit status of a user error, as argparse and absl's usage errors use
TRACEBACK_ENV = "RMSWEB_TRACEBACK"


def stage_run(name: str):
    """Returns the run(config, workdir) of stage `name`, importing its module."""
    return importlib.import_module(f"rmsweb_jax.stages.{STAGES[name]}").run


def stage_table():
    """Returns {stage name: run(config, workdir)}, importing every stage module."""
    return {name: stage_run(name) for name in STAGES}


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


def run_stages(config, workdir: str | pathlib.Path) -> None:
    """Runs config.stages in order, recording each stage's wall time in workdir/stages.json."""
    stages = stage_names(config.stages)  # before anything is created or imported
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    import jax
    writer = jax.process_index() == 0  # on a pod slice every host runs this; one writes the records
    if writer:
        (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))
    record = []
    for name in stages:
        logging.info("stage %s: starting (workdir %s)", name, workdir)
        start = time.time()
        stage_run(name)(config, workdir)
        record.append({"stage": name, "seconds": round(time.time() - start, 2)})
        logging.info("stage %s: done in %.1f s", name, record[-1]["seconds"])
        if writer:
            (workdir / "stages.json").write_text(json.dumps(record, indent=2))


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    try:
        stage_names(_CONFIG.value.stages)  # a misspelt stage answers before the cluster starts
        from rmsweb_jax.distributed import maybe_initialize_distributed
        maybe_initialize_distributed()  # multi-host only when RMSWEB_DISTRIBUTED=1 (see BUILD.md)
        run_stages(_CONFIG.value, _WORKDIR.value)
    except UserError as err:
        if _traceback_wanted():
            raise
        _exit_with(err)


def parse_flags(argv: list[str]) -> list[str]:
    """Returns the arguments left after parsing the flags; a bad flag or config override (unknown key,
    wrong type, missing config file) exits with one line and status 2."""
    try:
        return flags.FLAGS(argv)
    except (flags.Error, KeyError, AttributeError, TypeError, ValueError) as err:
        # ml_collections raises KeyError / AttributeError / TypeError for an override of a key the config
        # does not have or of the wrong type; absl's flags.Error covers the rest (e.g. a missing --workdir).
        if os.environ.get(TRACEBACK_ENV) == "1":
            raise
        _exit_with(err, hint="(--helpfull lists the flags)")


def _traceback_wanted() -> bool:
    return os.environ.get(TRACEBACK_ENV) == "1" or flags.FLAGS["verbosity"].value >= 1


def _exit_with(err: BaseException, hint: str = "(--verbosity=1 shows the traceback)") -> None:
    message = err.args[0] if isinstance(err, KeyError) and err.args else str(err)  # KeyError's str() is a repr
    message = " ".join(str(message).split())  # one line: ml_collections adds "\nDid you mean ..."
    print(f"rmsweb: error: {message} {hint}", file=sys.stderr)
    sys.exit(USAGE_ERROR)


def run() -> None:
    """Console-script entry point (`rmsweb`)."""
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    run()
