"""Entry point: `python -m rmsweb_jax.main --config=configs/demo.py --workdir=/tmp/run`.

Runs the stages named in `config.stages`, in order. Any config field can be overridden on the
command line (`--config.model.init=hf:/ckpt --config.stages=collect,sft`). Stages talk to each other
only through files in the workdir, so each can be rerun or resumed alone. Each completed stage leaves
a manifest (<workdir>/manifests/<stage>.json: the config fields it read, its inputs' manifests, its
outputs); a stage that is up to date is skipped, one whose inputs or fields changed reruns, and so
do the stages after it (rmsweb_jax/stages/manifest.py; `--config.rerun=mine,salvage` or `all` forces).

A user's mistake (an unknown stage or override key, a bad value, a missing checkpoint or store:
rmsweb_jax.errors.UserError) prints one line naming the value and what would work, and exits with
status 2; --verbosity=1 or RMSWEB_TRACEBACK=1 shows the traceback instead.

One run per workdir: a run takes <workdir>/run.lock before it writes anything and holds it to the end
(rmsweb_jax/workdir_lock.py); a second run on the same workdir is refused in one line naming the holder,
status 2. On a pod slice process 0 holds it and the others wait for its answer.
"""
from __future__ import annotations

import contextlib
import os
import pathlib
import sys

from absl import app, flags
from ml_collections import config_flags

from rmsweb_jax.distributed import maybe_initialize_distributed
from rmsweb_jax.errors import UserError
from rmsweb_jax.workdir_lock import WorkdirLock, describe
# STAGES: stage name -> its module of rmsweb_jax.stages (the registry lives beside the runner, which the
# `table` stage also runs on its variants' sub-workdirs).
from rmsweb_jax.stages.pipeline import STAGES, run_pipeline, stage_module, stage_names  # noqa: F401

_CONFIG = config_flags.DEFINE_config_file("config", None, "ml_collections config file (path[:arg]).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for this run's outputs (created if missing).")
flags.mark_flags_as_required(["config", "workdir"])

USAGE_ERROR = 2  # exit status of a user error, as argparse and absl's usage errors use
TRACEBACK_ENV = "RMSWEB_TRACEBACK"


def stage_run(name: str):
    """Returns the run(config, workdir) of stage `name`, importing its module."""
    return stage_module(name).run


def stage_table():
    """Returns {stage name: run(config, workdir)}, importing every stage module."""
    return {name: stage_run(name) for name in STAGES}


def run_stages(config, workdir: str | pathlib.Path) -> None:
    """Runs config.stages in order, each unless its manifest says it is up to date (rmsweb_jax/stages/
    manifest.py; config.rerun forces some), printing why it runs or is skipped; records each stage's
    wall time and decision in workdir/stages.json (rmsweb_jax/stages/pipeline.py run_pipeline)."""
    run_pipeline(config, workdir)


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    try:
        stage_names(_CONFIG.value.stages)  # a misspelt stage answers before the cluster starts
        if not _WORKDIR.value.strip():  # "" would be the current folder: a run's files among the user's own
            raise UserError("--workdir is empty: give the folder (or gs://BUCKET/FOLDER) for this run's outputs")
        maybe_initialize_distributed()  # multi-host only when RMSWEB_DISTRIBUTED=1 (see BUILD.md)
        with workdir_locked(_CONFIG.value, _WORKDIR.value):
            run_stages(_CONFIG.value, _WORKDIR.value)
    except UserError as err:
        if _traceback_wanted():
            raise
        _exit_with(err)


@contextlib.contextmanager
def workdir_locked(config, workdir):
    """Yields with the workdir's lock held around a run: process 0 takes it (UserError when another run holds it),
    the other processes of a pod slice wait for its answer and stop with it."""
    import jax  # deferred: after maybe_initialize_distributed (JAX refuses to initialize once a backend exists)
    lock, refused = None, ""
    if jax.process_index() == 0:
        try:
            lock = WorkdirLock.acquire(workdir, force=bool(config.get("force_unlock")))
        except UserError as err:
            refused = str(err)
    if jax.process_count() > 1:
        import numpy as np
        from jax.experimental import multihost_utils
        if bool(multihost_utils.broadcast_one_to_all(np.int32(bool(refused)))) and not refused:
            refused = f"process 0 could not take the lock of workdir {workdir} (its log says why)"
    if refused:
        raise UserError(refused)
    if lock is not None and lock.displaced is not None:
        print(f"rmsweb: force_unlock: took the lock of workdir {workdir} from {describe(lock.displaced)}; "
              "if that run is still alive, both now write there", file=sys.stderr, flush=True)
    try:
        yield lock
    finally:
        if lock is not None:
            lock.release()


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
