"""A jax.profiler trace of training steps START..STOP (`--config.train.profile_steps=START,STOP`), as MaxText offers.

The trace goes to <run dir>/tensorboard/plugins/profile/<timestamp>/ (the layout TensorBoard's profile plugin and
XProf read: `tensorboard --logdir <workdir>/<stage>/tensorboard`, Profile tab): <host>.xplane.pb, and a Perfetto
trace (perfetto_trace.json.gz) that ui.perfetto.dev opens without TensorBoard. On a bucket the trace is written in
the metrics writer's local mirror and uploaded with the event files.

Why these choices:
- Steps are counted as the trainer counts them (1 = the first optimizer step), and the window is inclusive, so
  `1,1` traces the first step (its compile included) and `10,12` three steady-state steps.
- The trace stops after the device has finished STOP's work (block_until_ready on that step's outputs): the
  steps are dispatched asynchronously, and a trace stopped at dispatch would miss their device time.
- A run resumed inside the window traces what is left of it; one resumed past it traces nothing.
"""
from __future__ import annotations

import pathlib
from typing import Any

import jax

from rmsweb_jax.errors import UserError


def parse_profile_steps(value: Any) -> tuple[int, int] | None:
    """Returns (start, stop) of config.train.profile_steps ("START,STOP", a pair, or "" for none); UserError naming
    the key otherwise."""
    if value in (None, "", ()):
        return None
    parts = [p.strip() for p in value.split(",")] if isinstance(value, str) else list(value)
    try:
        start, stop = (int(p) for p in parts)
    except (TypeError, ValueError):
        start = stop = None
    if start is None or not 1 <= start <= stop:
        raise UserError(f"config.train.profile_steps = {value!r}: expected 'START,STOP', two step numbers with "
                        "1 <= START <= STOP (e.g. --config.train.profile_steps=10,12), or '' for no trace")
    return start, stop


class StepProfiler:
    """Starts a jax.profiler trace before step `start` and stops it after step `stop` (inclusive)."""

    def __init__(self, window: tuple[int, int] | None, log_dir: pathlib.Path, *, say=print):
        self.window, self.log_dir, self.say = window, pathlib.Path(log_dir), say
        self.active = False

    def before_step(self, step: int) -> None:
        """Call before taking step `step` (1-based)."""
        if self.window and not self.active and self.window[0] <= step <= self.window[1]:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(str(self.log_dir), create_perfetto_trace=True)
            self.active = True
            self.started_at = step

    def after_step(self, step: int, outputs: Any) -> None:
        """Call after dispatching step `step` with that step's outputs (waited on before the trace stops)."""
        if self.active and step >= self.window[1]:
            jax.block_until_ready(outputs)
            self.stop(step)

    def stop(self, step: int) -> None:
        """Stops the trace (a run that ends inside the window: at its last step)."""
        if not self.active:
            return
        jax.profiler.stop_trace()
        self.active = False
        self.say(f"[train] profile of steps {self.started_at}..{step} written to "
                 f"{self.log_dir / 'plugins' / 'profile'} (tensorboard --logdir {self.log_dir}, Profile tab; or the "
                 "perfetto_trace.json.gz in ui.perfetto.dev)")
