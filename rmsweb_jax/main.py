"""Entry point: `python -m rmsweb_jax.main --config=configs/demo.py --workdir=/tmp/run`.

Runs the stages named in `config.stages`, in order. Any config field can be overridden on the
command line (`--config.model.init=hf:/ckpt --config.stages=collect,sft`). Stages talk to each other
only through files in the workdir, so each can be rerun or resumed alone. Each completed stage leaves
a manifest (<workdir>/manifests/<stage>.json: the config fields it read, its inputs' manifests, its
outputs); a stage that is up to date is skipped, one whose inputs or fields changed reruns, and so
do the stages after it (rmsweb_jax/stages/manifest.py; `--config.rerun=mine,salvage` or `all` forces).

A user's mistake (an unknown stage or override key, a bad value, a missing checkpoint or store:
rmsweb_jax.errors.UserError) prints one line naming the value and what would work, and exits with
status 2; --verbosity=1 or RMSWEB_TRACEBACK=1 shows the traceback instead. Every stage of config.stages
builds its settings before the first one runs (stages/pipeline.py check_stages), so a bad value of a late
stage (`--config.salvage.loss.clip_low=1.5`) fails at once, naming that stage, with nothing written.

One run per workdir: a run takes <workdir>/run.lock before it writes anything and holds it to the end
(rmsweb_jax/workdir_lock.py); a second run on the same workdir is refused in one line naming the holder,
status 2. On a pod slice process 0 holds it and the others wait for its answer.

SIGTERM (a preempted spot VM, a pod's maintenance event): a training stage saves the step in flight, every other
stage keeps what it completed; one line says so and the run exits with status 143; rerunning the same command
resumes (rmsweb_jax/preemption.py).

`--config.stages=help` prints each stage (what it does, the stages it reads from, what it writes, the
config fields it reads, with this config's values) and runs nothing. Ctrl-C stops the run with one line
naming the stage it stopped, status 130; rerunning the same command resumes it (the stages' manifests and
checkpoints say where).
"""
from __future__ import annotations

import contextlib
import difflib
import json
import os
import pathlib
import signal
import sys
import threading
import time

from absl import app, flags, logging
from ml_collections import config_flags

from rmsweb_jax import preemption
from rmsweb_jax.distributed import gpu_memory_fraction, libtpu_init_args, maybe_initialize_distributed
from rmsweb_jax.errors import USAGE_ERROR, UserError, disk_full, exit_with_one_line, one_line, wants_help
from rmsweb_jax.workdir_lock import WorkdirLock, describe
# STAGES: stage name -> its module of rmsweb_jax.stages (the registry lives beside the runner, which the
# `table` stage also runs on its variants' sub-workdirs).
from rmsweb_jax.stages.pipeline import STAGES, check_stages, run_pipeline, stage_module, stage_names  # noqa: F401

_CONFIG = config_flags.DEFINE_config_file("config", None, "ml_collections config file (path[:arg]).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for this run's outputs (created if missing).")
flags.mark_flags_as_required(["config"])  # --workdir is checked in main: --config.stages=help needs none

INTERRUPTED = 130  # exit status after Ctrl-C, as shells report a SIGINT death (128 + 2)
STOP_GRACE_S = 10.0  # after Ctrl-C, how long the run may unwind (finally blocks, lock release) before it is ended

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
    if _describe_wanted(_CONFIG.value.stages):
        from rmsweb_jax.stages.describe import describe_stages  # deferred: it imports every stage module
        print(describe_stages(_CONFIG.value))
        return
    stop = Stop(_WORKDIR.value)
    try:
        stage_names(_CONFIG.value.stages)  # a misspelt stage answers before the cluster starts
        if _WORKDIR.value is None:
            raise UserError("--workdir is missing: give the folder (or gs://BUCKET/FOLDER) for this run's outputs")
        if not _WORKDIR.value.strip():  # "" would be the current folder: a run's files among the user's own
            raise UserError("--workdir is empty: give the folder (or gs://BUCKET/FOLDER) for this run's outputs")
        try:  # before any backend exists: a GPU client then takes the plan's share of memory, not JAX's 75%
            gpu_memory = gpu_memory_fraction()
            libtpu_init_args(str(_CONFIG.value.tpu.libtpu_init_args))  # libtpu reads its flags when it loads
        except ValueError as err:
            raise UserError(str(err)) from None
        maybe_initialize_distributed()  # multi-host only when RMSWEB_DISTRIBUTED=1 (see BUILD.md)
        check_stages(_CONFIG.value, _WORKDIR.value)  # every stage's settings, before the lock and the first stage
        import jax  # deferred: JAX reads the two settings above when its first backend starts, here
        if jax.default_backend() == "gpu":
            logging.info(gpu_memory)
        if jax.process_index() == 0:
            from rmsweb_jax.plan.disk import space_warning
            warning = space_warning(_CONFIG.value, _WORKDIR.value, stage_names(_CONFIG.value.stages))
            if warning:
                print(f"rmsweb: warning: {warning}", file=sys.stderr, flush=True)
        with workdir_locked(_CONFIG.value, _WORKDIR.value) as lock, stop.handling(lock):
            run_stages(_CONFIG.value, _WORKDIR.value)
            stop.raise_if_signalled()  # the signal's exception was lost (see Stop); the run still ends as signalled
    except UserError as err:
        if _traceback_wanted():
            raise
        _exit_with(err)
    except preemption.Preempted as err:  # not a failure: no traceback, even when asked for one
        stop.exit(err)
    except KeyboardInterrupt as err:
        if _traceback_wanted():
            raise
        stop.exit(err)
    except Exception as err:
        full = disk_full(err)
        if full is None or _traceback_wanted():
            raise
        print(f"rmsweb: error: {_full_disk_line(full, _WORKDIR.value)}", file=sys.stderr, flush=True)
        _hard_exit(USAGE_ERROR)  # Orbax's writer threads would print pages of tracebacks at the interpreter's exit


class Stop:
    """Ctrl-C and SIGTERM during a run: one line saying what stopped and that rerunning resumes, then status 130
    (Ctrl-C) or 143 (SIGTERM, rmsweb_jax/preemption.py).

    Ctrl-C raises KeyboardInterrupt wherever the main thread is. SIGTERM waits for the next step of a training loop
    that is stepping (it saves that step, then raises Preempted) and otherwise raises Preempted at once. A
    KeyboardInterrupt raised inside a garbage-collection callback (JAX registers one) is printed and dropped: the run
    would go on. So each signal also starts a watchdog that ends the process when it has not stopped within the
    grace (STOP_GRACE_S after Ctrl-C, preemption.GRACE_S after SIGTERM), the pipeline raises Preempted before the
    next stage, and a run that finishes anyway ends as signalled; a second signal ends it at once. Ending it
    abruptly is safe: a stage's outputs count only once its manifest is written, and checkpoints are written
    atomically (a kill -9 resumes the same way). The exit itself skips the interpreter's teardown (os._exit), which
    crashed while native threads of the model stage were still working.
    A lock lost on a bucket also interrupts the main thread (workdir_lock.py): that is not a Ctrl-C, and the lock's
    own message has been printed, so the run then ends with status 2 and no Ctrl-C line.
    """

    def __init__(self, workdir: str | None):
        self.workdir, self.lock = workdir, None
        self._said = threading.Lock()
        self._signalled = threading.Event()
        self._term, self._stage = False, ""
        self._deadline: float | None = None

    @contextlib.contextmanager
    def handling(self, lock):
        """Yields with this handler on SIGINT and SIGTERM (main thread only), the previous handlers restored after."""
        self.lock = lock
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum, frame):
        term = signum == signal.SIGTERM
        if self._signalled.is_set():
            self._end(self._message(term, late=True), preemption.PREEMPTED if term else INTERRUPTED)
        self._signalled.set()
        self._term, self._stage = term, _interrupted_stage(self.workdir)  # what the line names, whatever follows
        grace = preemption.GRACE_S if term else STOP_GRACE_S
        self._deadline = time.monotonic() + grace
        threading.Thread(target=self._end_after_grace, args=(term, grace), name="rmsweb-stop", daemon=True).start()
        if not term:
            raise KeyboardInterrupt
        preemption.notice()
        if not preemption.defers():
            raise preemption.Preempted(self._message(term=True))

    def raise_if_signalled(self) -> None:
        """Raises the first signal's exception (Preempted or KeyboardInterrupt) if a signal came."""
        if self._signalled.is_set():
            raise preemption.Preempted(self._message(term=True)) if self._term else KeyboardInterrupt

    def _message(self, term: bool, late: bool = False) -> str:
        stage = self._stage or _interrupted_stage(self.workdir)
        if not term:
            return f"interrupted: {stage} stopped by Ctrl-C; rerun the same command to resume"
        if late:
            return (f"preempted: {stage} had not stopped {preemption.GRACE_S:.0f} s after SIGTERM; rerun the same "
                    "command to resume from its last checkpoint")
        return f"preempted: {stage} stopped by SIGTERM; what it completed is saved; rerun the same command to resume"

    def _end_after_grace(self, term: bool, grace: float) -> None:
        time.sleep(grace)
        self._end(self._message(term, late=term), preemption.PREEMPTED if term else INTERRUPTED)

    def _lost_lock(self) -> bool:
        return bool(getattr(self.lock, "lost", False))

    def _say(self, message: str) -> None:
        if self._said.acquire(blocking=False) and not self._lost_lock():
            print(f"rmsweb: {message}", file=sys.stderr, flush=True)

    def _end(self, message: str, status: int) -> None:
        self._say(message)
        _hard_exit(USAGE_ERROR if self._lost_lock() else status)

    def exit(self, err: BaseException | None = None) -> None:
        """Says what stopped (once: Preempted's own message, else the Ctrl-C line), lets threads still working
        finish (within the grace) and exits with 130 or 143 (2 when the lock was lost)."""
        term = isinstance(err, preemption.Preempted)
        self._say(str(err) if term and str(err) else self._message(term))
        self._join_working_threads()
        _hard_exit(USAGE_ERROR if self._lost_lock() else preemption.PREEMPTED if term else INTERRUPTED)

    def _join_working_threads(self) -> None:
        """Waits, until the grace ends, for the other non-daemon threads (Orbax's async checkpoint saves): their
        writes finish rather than leave a temporary folder."""
        deadline = self._deadline or time.monotonic() + STOP_GRACE_S
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join(max(0.0, deadline - time.monotonic()))


def _hard_exit(status: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _full_disk_line(full: OSError | str, workdir: str) -> str:
    """Returns the one line for a full disk (or a bucket's quota): what failed where, what is free, and that the rerun
    resumes."""
    from rmsweb_jax import storage
    if isinstance(full, OSError):
        what = full.strerror + (f" writing {full.filename}" if full.filename else "")
    else:
        what = full
    if storage.is_remote(workdir):
        import urllib.parse  # gcsfs quotes the request's URL, the object's name %-encoded
        return (f"the bucket under workdir {workdir} refused a write: {urllib.parse.unquote(what)}; what was saved "
                "before is intact: raise the quota or free space and rerun the same command to resume")
    import shutil
    folder = pathlib.Path(workdir).absolute()
    while not folder.exists():
        folder = folder.parent
    free = f" ({shutil.disk_usage(folder).free / 2**20:,.1f} MiB free there now)"
    return (f"the disk under workdir {workdir} is full{free}: {what}; what was saved before is intact: free space and "
            "rerun the same command to resume")


def _describe_wanted(stages) -> bool:
    parts = [stages] if isinstance(stages, str) else list(stages)
    return [str(part).strip() for part in parts] in (["help"], ["describe"])


def _interrupted_stage(workdir: str) -> str:
    """Returns which stage a Ctrl-C stopped ("stage sft"), from workdir/stages.json (run_pipeline writes each stage
    there as it starts and gives it its seconds when it ends): the one that started and has no seconds yet."""
    if not workdir:
        return "the run"
    try:
        from rmsweb_jax import storage
        from rmsweb_jax.stages.pipeline import STAGES_FILE
        record = json.loads((storage.as_path(workdir) / STAGES_FILE).read_text())
    except (OSError, ValueError):  # no stages.json yet: stopped while starting up
        return "the run (before its first stage started)"
    running = [entry["stage"] for entry in record if entry.get("ran") and not entry.get("seconds")]
    return f"stage {running[-1]}" if running else "the run (between stages)"


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
    wrong type, missing config file) exits with one line and status 2, --help with the usage and status 0."""
    try:
        left = flags.FLAGS(argv)
        _CONFIG.value.get("stages")  # a config file that failed to load raises here (ml_collections defers it)
        return left
    except SystemExit as done:
        if done.code == 1 and wants_help(argv):
            sys.exit(0)  # absl's --help exits 1: asking for help is not a failure
        raise
    except (flags.Error, KeyError, AttributeError, TypeError, ValueError, OSError) as err:
        # ml_collections raises KeyError / AttributeError / TypeError for an override of a key the config
        # does not have or of the wrong type, OSError for a config file it cannot load; absl's flags.Error
        # covers the rest (e.g. a missing --workdir).
        if os.environ.get(TRACEBACK_ENV) == "1":
            raise
        _exit_with(UserError(flag_mistake(argv, err)), hint="(--helpfull lists the flags)")


def flag_mistake(argv: list[str], err: BaseException) -> str:
    """Returns the one-line message for a flag the parser refused: the config file or override at fault, its
    value and what would work; else the parser's own message."""
    config_arg = next((a for a in argv[1:] if a.startswith("--config=")), None)
    if isinstance(err, OSError) and config_arg is not None:
        path = config_arg.split("=", 1)[1].split(":", 1)[0]
        if not os.path.isfile(path):
            shipped = sorted(p.name for p in (pathlib.Path(__file__).resolve().parents[1] / "configs").glob("*.py"))
            return (f"{config_arg}: no such config file {path!r} (relative to {os.getcwd()}); "
                    f"the shipped ones: configs/{{{','.join(shipped)}}}")
        return f"{config_arg}: could not load the config file: {' '.join(str(err).split())}"
    config = flags.FLAGS["config"].value
    if config is None and config_arg is not None:  # an override failed while the flag was being set: load it again
        try:
            config = flags.FLAGS["config"].parser.parse(config_arg.split("=", 1)[1])  # the config file's parser
        except (OSError, TypeError, ValueError):  # it failed to load: the parser's own message below names the mistake
            config = None
    if config is None or not hasattr(config, "keys"):
        return one_line(err)
    for arg in argv[1:]:
        if not arg.startswith("--config.") or "=" not in arg:
            continue
        key, value = arg[len("--config."):].split("=", 1)
        node, walked = config, "config"
        for part in key.split("."):
            if not hasattr(node, "keys"):
                return f"{arg}: {walked} = {node!r} is a value, not a block: it has no field {part!r}"
            if part not in node:
                return f"{arg}: {walked} has no field {part!r}; {_nearest(config, walked, node, part)}"
            node, walked = node[part], f"{walked}.{part}"
        wrong = str(err).replace("flag ", "", 1)
        if wrong.startswith(f"{arg}:"):  # the field exists; the value is not of its type
            if hasattr(node, "keys"):
                return f"{arg}: {walked} is a block of fields ({', '.join(node.keys())}): set them one by one"
            return (f"{arg}: expected a value of type {type(node).__name__}, as {walked} = {node!r} in this config "
                    f"({value!r} is not one)")
    return one_line(err)


def _nearest(config, walked: str, node, part: str) -> str:
    """Returns a hint for an unknown field: a close name in its block, else fields of that name elsewhere, else the
    block's fields."""
    close = difflib.get_close_matches(part, list(node.keys()), n=1)
    if close:
        return f"did you mean {walked}.{close[0]}?"
    elsewhere = [path for path in _leaf_paths(config, "config") if path.rsplit(".", 1)[-1] == part]
    elsewhere.sort(key=lambda path: not path.startswith(f"{walked}."))  # inside the block given first
    if elsewhere:
        return f"a field of that name is at {' or '.join(elsewhere[:3])}"
    return f"its fields: {', '.join(sorted(node.keys()))}"


def _leaf_paths(node, prefix: str) -> list[str]:
    if not hasattr(node, "keys"):
        return [prefix]
    return [path for key in node.keys() for path in _leaf_paths(node[key], f"{prefix}.{key}")]


def _traceback_wanted() -> bool:
    return os.environ.get(TRACEBACK_ENV) == "1" or flags.FLAGS["verbosity"].value >= 1


def _exit_with(err: BaseException, hint: str = "(--verbosity=1 shows the traceback)") -> None:
    exit_with_one_line("rmsweb", err, hint)


def run() -> None:
    """Console-script entry point (`rmsweb`)."""
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    run()
