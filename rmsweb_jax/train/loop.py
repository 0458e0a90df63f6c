"""The shared step loop: start or resume, step through batches, metrics, checkpoints, NaN stop, HF export.

    trainer = Trainer(config, workdir, name="sft")         # restores <workdir>/sft/checkpoints if any
    result = trainer.fit(batches)                            # batches: a BatchSource (see train/__init__.py)

`fit` is the SFT loop; an RL loop (Salvage-DS) drives the same Trainer itself:

    trainer = Trainer(config, workdir, name="salvage", loss_fn=make_salvage_loss(settings, impl))
    sampler = Sampler(trainer.model(), ...)
    per update:  sample groups with sampler; build the host batch (salvage/batches.py's rows)
                 host["token_old_logprobs"] = trainer.token_logprobs(host)   # the trainer's own numerics
                 trainer.step(host, data_state)
                 trainer.sync_model(sampler.model); sampler.refresh()        # the step donated the old arrays
    trainer.finish()

A step donates the train state, so every array of a model taken from `trainer.model()` before it is
deleted afterwards (using it raises "Array has been deleted"); `sync_model` puts the new parameters
into a kept model in place. The loss's aux metrics (train/aux_metrics.py) are reported with the
trainer's own to metrics.jsonl, TensorBoard and the console.

A step's scalars are read back one step late (the device keeps working while the host prepares
the next batch), except at checkpoint and metrics steps, which wait for their own step. Every
scalar read is checked: a non-finite loss, gradient norm or parameter norm stops the run with
NonFiniteError naming the step. A state is saved only after its step's scalars were checked, so
a NaN state never reaches disk and the last good checkpoint stays the latest.

SIGTERM (a preempted VM, rmsweb_jax/preemption.py): the step in flight finishes, the state is saved at that step
(every process of a pod slice saves the same one) and `step` raises Preempted; rerunning resumes there.

A damaged checkpoint (its files do not read back as saved: train/checkpoint.py) is moved to
checkpoints/quarantine/ with one line naming it and the error, and the run resumes from the newest
intact one, with that step's data-iterator state and RNG. When none is intact the run stops with a
UserError saying where they went: never a silent start from step 0.
"""
from __future__ import annotations

import dataclasses
import math
import pathlib
import time
from typing import Any, Iterator, Protocol

import jax
import numpy as np
from absl import logging
from flax import nnx
from jax.experimental import multihost_utils

from rmsweb_jax import preemption, storage
from rmsweb_jax.errors import UserError
from rmsweb_jax.models.from_config import runtime_from_config
from rmsweb_jax.model_init import load_model
from rmsweb_jax.models.from_config import mesh_from_config, rules_from_config
from rmsweb_jax.models.qwen3_vl import Qwen3VLConfig, abstract_model, to_hf
from rmsweb_jax.train import aux_metrics, run_record
from rmsweb_jax.train import batch as batch_lib
from rmsweb_jax.train.checkpoint import CheckpointDamaged, Checkpointer
from rmsweb_jax.train.logprobs import logprob_fn
from rmsweb_jax.train.loss import LossFn, make_sft_loss, resolve_loss_impl
from rmsweb_jax.train.metrics import MetricsWriter, peak_flops_per_device, train_flops
from rmsweb_jax.train.optimizer import learning_rate_schedule, make_optimizer
from rmsweb_jax.train.profiling import StepProfiler
from rmsweb_jax.train.settings import TrainSettings
from rmsweb_jax.train.step import (ModelParts, TrainState, TrainStep, init_train_state, param_shardings,
                                   train_state_shardings)


class BatchSource(Protocol):
    """What the loop iterates: contract batches (train/batch.py), with resumable iterator state."""
    def __next__(self) -> dict: ...
    def get_state(self) -> Any: ...          # JSON value or bytes, after the batch just returned
    def set_state(self, state: Any) -> None: ...


class NonFiniteError(FloatingPointError):
    """Training produced a non-finite loss, gradient norm or parameter norm at `step`."""
    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


@dataclasses.dataclass(frozen=True)
class TrainResult:
    run_dir: pathlib.Path
    step: int                      # steps taken in total
    resumed_from: int | None       # the checkpoint step this process started from
    last_metrics: dict[str, float]
    hf_dir: pathlib.Path | None    # the exported HF checkpoint


class Trainer:
    """A model, its optimizer state and checkpoints under <workdir>/<name>, ready to step."""

    def __init__(self, config, workdir: str | pathlib.Path, *, name: str = "train", loss_fn: LossFn | None = None):
        self.config, self.workdir = config, storage.as_path(workdir)  # local, or gs://
        self.name, self.run_dir = name, self.workdir / name
        self.settings = s = TrainSettings.from_config(config.get("train"))
        self.mesh, self.rules = mesh_from_config(config), rules_from_config(config)
        # A process feeds the rows its devices hold: processes whose devices hold the same rows (a tensor group
        # over several hosts) feed the same ones, so the batch splits over feeds, not processes (train/feeds.py).
        self.feeds = batch_lib.batch_feeds(self.mesh, self.rules)
        batch_lib.check_batch_layout(s.batch_size, s.microbatches, self.mesh, self.feeds.count)
        self.local_rows = s.batch_size // self.feeds.count
        self.tx = make_optimizer(s.optimizer)
        self.schedule = learning_rate_schedule(s.optimizer)
        self.is_writer = jax.process_index() == 0
        self.checkpoints = Checkpointer(self.run_dir / "checkpoints", every_steps=s.checkpoint_every,
                                        keep=s.checkpoint_keep, async_save=s.checkpoint_async)
        try:
            self._start()
        except BaseException:
            self.checkpoints.close()
            raise
        self.parts = self.parts._replace(params=None)  # the live parameters are self.state.params
        impl = resolve_loss_impl(s.loss_impl, self.mesh)
        self.train_step = TrainStep(self.parts, loss_fn or make_sft_loss(impl), self.tx, mesh=self.mesh,
                                    rules=self.rules, p_shardings=self.p_shardings,
                                    shardings=self.state_shardings, schedule=self.schedule)
        self.step_count = int(self.resumed_from or 0)
        self.writer = MetricsWriter(self.run_dir, enabled=self.is_writer, total_steps=s.total_steps,
                                    initial_step=self.step_count)
        self.profiler = StepProfiler(s.profile_steps, self.writer.directory / "tensorboard", say=self.writer.message)
        self.wandb = self._record_run(name)
        self.peak_flops = peak_flops_per_device(s.peak_tflops) * (self.mesh.size if self.mesh else 1)
        self._pending: list[tuple[int, dict, dict]] = []
        self._logprobs = None
        self._window: list[dict] = []
        self._clock: float | None = None
        self._save_owed = False  # a checkpoint fell due at a step that could not save (step can_save=False)
        self.last_metrics: dict[str, float] = {}
        preemption.training_started()
        self._stepping = True
        if self.resumed_from is not None:
            self.writer.message(f"[train] resumed from checkpoint step {self.resumed_from} in "
                                f"{self.checkpoints.directory}")

    # ---- start-up ---------------------------------------------------------------------------------------
    def _record_run(self, name: str) -> run_record.WandbRun | None:
        """Writes the resolved config and the run's identity to <workdir>/config.json and TensorBoard (the writing
        process); returns the W&B run when config.train.metrics.wandb names a project."""
        if not self.is_writer:
            return None
        identity = run_record.run_identity(self.mesh, stage=name)
        run_record.write_config_json(self.workdir, self.config, identity)
        run_record.write_tensorboard(self.writer.directory / "tensorboard", self.config, identity)
        if not self.settings.wandb_project:
            return None
        return run_record.WandbRun(self.settings.wandb_project, name=f"{self.workdir.name}/{name}",
                                   directory=self.writer.directory, config=self.config, identity=identity)

    def _start(self) -> None:
        """Sets model parts, shardings and state: restored from the newest intact checkpoint (damaged ones moved
        to quarantine/), else fresh from init; UserError when checkpoints exist but none is intact."""
        self.resumed_from, self.data_state = None, None
        for step in reversed(self.checkpoints.all_steps()):
            try:
                self.resumed_from = step
                return self._restore()
            except CheckpointDamaged as err:
                self._set_aside(step, err)
        self.resumed_from = None
        if self.checkpoints.quarantined():
            where = self.checkpoints.directory / "quarantine"
            raise UserError(f"no intact checkpoint in {self.checkpoints.directory}: the damaged ones are in {where} "
                            f"({', '.join(self.checkpoints.quarantined())}); to train this stage from step 0 "
                            f"instead, move {where} away and rerun")
        model, init_dir = load_model(self.config, self.workdir)
        self.init_dir = str(init_dir)
        self.parts, self.model_config = ModelParts.split(model), model.config
        self.p_shardings = param_shardings(model, self.mesh, self.rules)
        self.state_shardings = train_state_shardings(self.parts.params, self.tx, self.mesh, self.p_shardings)
        self.state = init_train_state(self.parts.params, self.tx, self.config.seed, self.state_shardings)

    def _set_aside(self, step: int, err: CheckpointDamaged) -> None:
        """Moves damaged checkpoint `step` to quarantine/ (process 0, once every process has given up on it)."""
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"checkpoint {step} damaged")
        if self.is_writer:
            where = self.checkpoints.quarantine(step)
            print(f"[train] checkpoint step {step} is damaged, moved to {where}: {err}", flush=True)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"checkpoint {step} set aside")
            self.checkpoints.reload()

    def _restore(self) -> None:
        meta = self.checkpoints.read_meta(self.resumed_from)
        model_config = Qwen3VLConfig.from_hf_dict(meta["model_config"], source=str(self.checkpoints.directory))
        self.init_dir = meta.get("init_dir")
        abstract = abstract_model(model_config, runtime_from_config(self.config.model), mesh=self.mesh,
                                  rules=self.rules)
        self.parts, self.model_config = ModelParts.split(abstract), model_config
        self.p_shardings = param_shardings(abstract, self.mesh, self.rules)
        self.state_shardings = train_state_shardings(self.parts.params, self.tx, self.mesh, self.p_shardings)
        target = _abstract_state(self.parts.params, self.tx, self.state_shardings)
        restored = self.checkpoints.restore(target, self.resumed_from)
        self.state, self.data_state = restored.state, restored.data_state
        logging.info("restored step %d from %s", restored.step, self.checkpoints.directory)

    # ---- the loop -----------------------------------------------------------------------------------------
    def fit(self, batches, after_step=None) -> TrainResult:
        """Steps through `batches` until config.train.optimizer.total_steps, then finishes; returns the result.
        `after_step(step)`, when given, runs after every step (a probe of the model between steps)."""
        iterator = _resume_iterator(batches, self.data_state)
        try:
            while self.step_count < self.settings.total_steps:
                try:
                    host = next(iterator)
                except StopIteration:
                    raise ValueError(f"the batch source ran out after step {self.step_count} of "
                                     f"{self.settings.total_steps}: it must yield a batch per step") from None
                self.step(host, iterator.get_state() if hasattr(iterator, "get_state") else None)
                if after_step is not None:
                    after_step(self.step_count)
            return self.finish()
        finally:
            self.close()

    def step(self, host_batch: dict, data_state: Any = None, host_metrics: dict[str, float] | None = None, *,
             can_save: bool = True) -> None:
        """Takes one optimizer step on a contract batch; checkpoints and reports when due.

        data_state: the batch source's state *after* this batch (saved with a checkpoint of this step).
        host_metrics: scalars the caller measured for this step (an RL loop's sampling counts), reported
        with the step's metrics as their mean over the reporting window.
        can_save: False where a checkpoint here could not be resumed from (an RL loop between the optimizer
        steps on one drawn batch): a checkpoint due here is taken at the next step that can.
        """
        batch = batch_lib.prepare_batch(host_batch, self.model_config, self.settings.microbatches, rows=self.local_rows,
                                        mesh=self.mesh, rules=self.rules,
                                        vision_window=int(self.config.model.vision_window))
        counts = batch_lib.batch_counts(batch, self.feeds.count)
        placed = batch_lib.to_global(batch, batch_lib.batch_shardings(batch, self.mesh, self.rules))
        self.profiler.before_step(self.step_count + 1)
        self.state, metrics = self.train_step(self.state, placed)
        self.step_count += 1
        step = self.step_count
        self.profiler.after_step(step, metrics)
        flops = train_flops(self.model_config, tokens=counts["tokens"], seq_len=batch.targets.shape[-1],
                            patches=counts["patches"], images=counts["images"])  # this process's rows
        self._pending.append((step, metrics, {**counts, "flops": flops, "host": dict(host_metrics or {})}))
        self.data_state = data_state
        self._save_owed = self._save_owed or self.checkpoints.due(step) or step == self.settings.total_steps
        due_checkpoint = can_save and self._save_owed
        due_metrics = step % self.settings.metrics_every == 0 or step == self.settings.total_steps
        self._drain(keep=0 if (due_checkpoint or due_metrics) else 1)
        if due_metrics:
            self._report(step)
        if due_checkpoint:
            self.save()
            self._save_owed = False
        if preemption.save_step(step) and can_save:
            self._stop_preempted(step)

    def _stop_preempted(self, step: int) -> None:
        """Saves the state of `step` (its metrics first) and raises Preempted."""
        self._drain(keep=0)
        self._report(step)
        self.save()
        self.checkpoints.wait()
        raise preemption.Preempted(f"preempted at step {step} of {self.name}; checkpoint saved; rerun the same "
                                   "command to resume")

    def save(self) -> None:
        """Saves the current state (already checked finite) as checkpoint `step_count`."""
        self._drain(keep=0)
        if self.checkpoints.latest_step() == self.step_count:
            return
        meta = {"model_config": self.model_config.to_hf_dict(), "init_dir": self.init_dir, "step": self.step_count}
        self.checkpoints.save(self.step_count, self.state, self.data_state, meta)
        self.writer.sync()  # on a bucket: the metrics of every checkpointed step are there before a resume reads them

    def finish(self) -> TrainResult:
        """Saves the final state, waits for pending saves, exports HF weights if configured; returns the result."""
        self.save()
        self.checkpoints.wait()
        self._end_stepping()  # from here a SIGTERM stops at once: the last step is saved, a rerun exports again
        hf_dir = None
        if self.settings.export_hf:
            hf_dir = self.run_dir / "hf"
            already = self.resumed_from == self.step_count and (hf_dir / "config.json").is_file()
            if not already:  # a finished run restarted: its export is already there
                local, remote = storage.local_side(hf_dir)  # safetensors writes local files: on a bucket the mirror
                to_hf(self.model(), local, tokenizer_dir=self.init_dir)
                if remote is not None and self.is_writer:  # every process gathers, process 0 writes (to_hf)
                    storage.push_folder(local, remote, last="config.json")
                self.writer.message(f"[train] exported step {self.step_count} in HF format to {hf_dir}")
            if jax.process_count() > 1:  # the next stage may load the export on any process: written before it
                multihost_utils.sync_global_devices(f"export {hf_dir}")
        return TrainResult(self.run_dir, self.step_count, self.resumed_from, dict(self.last_metrics), hf_dir)

    def model(self):
        """Returns the NNX model with the current parameters (sharded like the state).

        The model shares the state's arrays, and a step donates the state: after `step` the arrays of a
        model taken before it are deleted (using it raises). Take `model()` again, or refresh a model you
        keep (a sampler's) in place with `sync_model`.
        """
        return self.parts.merge(self.state.params)

    def sync_model(self, model):
        """Returns `model` (an NNX model of this trainer's graph, e.g. a Sampler's) after putting the current
        parameters into it in place; call after every `step`, then the sampler's `refresh()`.

        RL loop:   sampler = Sampler(trainer.model(), ...)
                   for each update: sample with sampler; trainer.step(batch, data_state)
                                    trainer.sync_model(sampler.model); sampler.refresh()
        A loop that keeps several models can record `params_version` (the step count) with each sync. The
        model's graph is left as it is (no attribute set on it), so a sampler's compiled programs stay valid.
        """
        nnx.update(model, nnx.State(self.state.params))
        return model

    @property
    def params_version(self) -> int:
        """Returns the version of the current parameters: the number of steps taken."""
        return self.step_count

    def token_logprobs(self, host_batch: dict, params=None) -> np.ndarray:
        """Returns this process's [B, L] float32 log p(input_ids[t] | prefix) by token (aligned like loss_mask:
        the value at t belongs to token t as a target; 0 where loss_mask is 0), from one forward pass with the
        current parameters or `params` (a frozen reference's, laid out like the state's).

        What an RL loop feeds back as `token_old_logprobs` / `token_ref_logprobs`: the trainer's own numerics
        on the exact token ids of the batch.
        """
        batch = batch_lib.prepare_batch(host_batch, self.model_config, self.settings.microbatches,
                                        rows=self.local_rows, mesh=self.mesh, rules=self.rules)
        placed = batch_lib.to_global(batch, batch_lib.batch_shardings(batch, self.mesh, self.rules))
        if self._logprobs is None:
            impl = resolve_loss_impl(self.settings.loss_impl, self.mesh)
            self._logprobs = jax.jit(logprob_fn(self.parts, impl))
        out = self._logprobs(self.state.params if params is None else params, placed)
        return batch_lib.unshift_tokens(batch_lib.rows_of(batch_lib.local_rows(out, row_axis=1),
                                                          self.settings.microbatches))

    def close(self) -> None:
        """Waits for pending checkpoint writes and closes the metric sinks (and a trace still recording)."""
        self._end_stepping()
        self.profiler.stop(self.step_count)
        try:
            self.checkpoints.close()
        finally:  # a last save that failed (a full disk) still ends the progress bar's line before main's one line
            self.writer.close()
            if self.wandb is not None:
                self.wandb.close()

    def _end_stepping(self) -> None:
        if getattr(self, "_stepping", False):
            preemption.training_ended()
            self._stepping = False

    # ---- scalars ------------------------------------------------------------------------------------------
    def _drain(self, keep: int) -> None:
        """Reads back every pending step's scalars but the newest `keep`, checking that they are finite."""
        while len(self._pending) > keep:
            step, metrics, counts = self._pending.pop(0)
            metrics = jax.device_get(metrics)
            aux = aux_metrics.to_host(metrics.pop("aux", {}))
            values = {k: float(v) for k, v in metrics.items()}
            values["aux"] = aux
            now = time.perf_counter()
            if not all(math.isfinite(values[k]) for k in ("loss", "grad_norm", "param_norm")):
                self._stop(step, values)
            self.writer.progress(step, values["loss"])
            if self._clock is None:  # the first step read back carries the compile time: start the clock after it
                self._clock = now
                self._window.append({**values, "timed": False, **counts})
            else:
                self._window.append({**values, "timed": True, "seconds": now - self._clock, **counts})
                self._clock = now

    def _report(self, step: int) -> None:
        window, self._window = self._window, []
        if not window:
            return
        timed = [w for w in window if w["timed"]]
        target_tokens, tokens, flops = _over_feeds([sum(w["target_tokens"] for w in window),
                                                    sum(w["tokens"] for w in timed), sum(w["flops"] for w in timed)],
                                                   self.feeds)
        out = {"loss": float(np.mean([w["loss"] for w in window])), "grad_norm": window[-1]["grad_norm"],
               "param_norm": window[-1]["param_norm"], "learning_rate": window[-1].get("learning_rate"),
               "target_tokens": target_tokens}
        seconds = sum(w["seconds"] for w in timed)
        if timed and seconds > 0:
            out["tokens_per_s"] = tokens / seconds
            out["step_s"] = seconds / len(timed)
            if self.peak_flops > 0:
                out["mfu"] = flops / seconds / self.peak_flops
        for name in sorted({k for w in window for k in w["host"]}):
            if name in out:
                raise ValueError(f"host metric {name!r} has the name of a trainer metric; rename it")
            out[name] = float(np.mean([w["host"][name] for w in window if name in w["host"]]))
        # The loss's own terms (train/aux_metrics.py), each reduced exactly over the window's microbatches.
        for name, value in aux_metrics.resolve(aux_metrics.combine([w["aux"] for w in window])).items():
            if name in out:
                raise ValueError(f"the loss's aux metric {name!r} has the name of a trainer metric; rename it")
            out[name] = value
        self.last_metrics = out
        self.writer.write(step, out)
        if self.wandb is not None:
            self.wandb.log(step, out)

    def _stop(self, step: int, values: dict) -> None:
        self._pending.clear()
        self.checkpoints.wait()
        good = self.checkpoints.latest_step()
        where = (f"the last good checkpoint is step {good} in {self.checkpoints.directory} (a rerun resumes from it)"
                 if good is not None else f"no checkpoint had been written yet in {self.checkpoints.directory}")
        message = (f"training stopped at step {step}: non-finite values (loss {values['loss']}, grad_norm "
                   f"{values['grad_norm']}, param_norm {values['param_norm']}); the state of step {step} was not "
                   f"saved; {where}")
        self.writer.message(f"[train] {message}")
        raise NonFiniteError(message, step)


def _over_feeds(local: list[float], layout) -> list[float]:
    """Returns the sums of `local` (this process's counts of its feed's rows) over the feeds: a Salvage-DS batch's
    rows are not spread evenly (anchor rows fill the first feeds' rows), so count x feeds would be wrong, and the
    processes of one feed hold the same rows, so only the feed's lead counts them."""
    if jax.process_count() == 1:
        return [float(x) for x in local]
    share = 1.0 if layout.leads else 0.0
    gathered = multihost_utils.process_allgather(np.asarray(local, np.float64) * share)
    return [float(x) for x in np.asarray(gathered).reshape(jax.process_count(), -1).sum(axis=0)]


def _abstract_state(params, tx, shardings: TrainState | None) -> TrainState:
    """Returns the abstract TrainState (shapes, dtypes, shardings) for abstract parameters `params`."""
    shapes = TrainState(jax.ShapeDtypeStruct((), np.int32), params, jax.eval_shape(tx.init, params),
                        jax.eval_shape(lambda: jax.random.PRNGKey(0)))
    if shardings is None:  # one device: every leaf on it
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), shapes)
    return jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), shapes, shardings)


def _resume_iterator(batches, data_state) -> Iterator:
    iterator = batches if hasattr(batches, "__next__") else iter(batches)
    if data_state is not None:
        if not hasattr(iterator, "set_state"):
            raise ValueError(f"the checkpoint holds a data-iterator state but the batch source "
                             f"{type(iterator).__name__} has no set_state(): it cannot resume where it stopped")
        iterator.set_state(data_state)
    return iterator


