"""SIGTERM: a spot or preemptible VM being reclaimed, or a pod's maintenance event. The run keeps what it reached.

`python -m rmsweb_jax.main` turns SIGTERM into a notice here (main.py's Stop handler):
- a training loop (train/loop.py) that is stepping finishes the step in flight, saves a checkpoint at that step (the
  data iterator's and the RNG's state with it, as every checkpoint has) and raises Preempted; every process of a
  pod slice saves the same step (`save_step`);
- anything else (collect, mine, eval, the model stage, a trainer still compiling) gets Preempted raised at once in
  the main thread, as a Ctrl-C raises KeyboardInterrupt: the stage unwinds, what it completed is on disk, and the
  rerun does only what is missing.
main prints Preempted's message as one line and exits with PREEMPTED; a run that has not stopped GRACE_S after the
signal is ended there (a preempted VM gets about 30 s).

The processes of a pod slice agree through JAX's coordination service: a process that got the notice posts it;
process 0, at its next step s, names the save step s + 2 for all. No process has passed it: a step's metrics are
read back at the next step and wait for every process's previous step, so no process runs more than one step
ahead of another. (JAX's own preemption service would take SIGTERM away from Python, and with it every stage that
is not a training loop.)
"""
from __future__ import annotations

import threading

PREEMPTED = 143  # exit status after SIGTERM, as shells report a SIGTERM death (128 + 15)
GRACE_S = 25.0  # after SIGTERM, how long the run may take to save and stop before it is ended
_KEY = "rmsweb/preemption"
_LEAD_STEPS = 2  # process 0 names a save step this many steps after its own (see the module's docstring)


class Preempted(BaseException):
    """The run stopped on SIGTERM; the message says what was saved. A BaseException, as KeyboardInterrupt: code
    that catches Exception to go on does not swallow it."""


_notice = threading.Event()
_stepping = [0]  # training loops alive in this process (a stage's Trainer, from start to close)
_agreed: dict[str, int | bool] = {}


def notice() -> None:
    """Records a SIGTERM (main's signal handler calls this)."""
    _notice.set()


def noticed() -> bool:
    """Returns whether this process got a SIGTERM."""
    return _notice.is_set()


def defers() -> bool:
    """Returns whether a training loop is stepping, and will save and raise at its next step itself."""
    return _stepping[0] > 0


def training_started() -> None:
    """A training loop started: a SIGTERM from now on waits for its next step (defers())."""
    _stepping[0] += 1


def training_ended() -> None:
    """A training loop closed."""
    _stepping[0] = max(0, _stepping[0] - 1)


def save_step(step: int) -> bool:
    """Returns whether a training loop should save and stop after `step` (or at its first step after it that can
    save): on one process, once SIGTERM came; on several, from the step process 0 named once any process got one.
    Every process calls it after every step, and gets the same answers at the same steps."""
    import jax
    if jax.process_count() == 1:
        return noticed()
    target = _agreed_step(step)
    return target is not None and step >= target


def _agreed_step(step: int) -> int | None:
    """Returns the save step once one is named (posting this process's notice, and naming it on process 0)."""
    if "target" in _agreed:
        return int(_agreed["target"])
    import jax
    from jax._src import distributed
    client = distributed.global_state.client
    me = jax.process_index()
    if noticed() and not _agreed.get("posted"):
        client.key_value_set(f"{_KEY}/notice/{me}", str(step))
        _agreed["posted"] = True
    if me == 0:
        if _agreed.get("posted") or client.key_value_dir_get(f"{_KEY}/notice/"):
            _agreed["target"] = step + _LEAD_STEPS
            client.key_value_set(f"{_KEY}/step", str(_agreed["target"]))
        return _agreed.get("target")
    try:
        target = int(client.key_value_try_get(f"{_KEY}/step"))
    except Exception:  # not named yet (NOT_FOUND)
        return None
    if step > target:
        raise RuntimeError(f"preemption: process {me} is at step {step}, past the save step {target} that process 0 "
                           "named: the processes were not stepping together")
    _agreed["target"] = target
    return target
