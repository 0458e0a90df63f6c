"""Training metrics: model FLOPs for an MFU estimate, and a writer to TensorBoard, JSONL and the console.

MFU = model FLOPs per second / (peak FLOP/s per device x devices). Model FLOPs count 3x the forward
matmuls (forward + backward) of the tokens and patches actually in the batch (padding excluded),
attention included, remat recompute excluded (that is what makes it MFU rather than HFU).
"""
from __future__ import annotations

import json
import pathlib
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from rmsweb_jax import storage
from rmsweb_jax.models.qwen3_vl.config import Qwen3VLConfig
from rmsweb_jax.tensorboardx_import import tensorboardx

SYNC_S = 30.0  # on a bucket, metric files are uploaded at most this often between checkpoints (see MetricsWriter)
# The trainer reports at every config.train.metrics.every_steps (and the last step) the mean loss of the steps
# since its previous report (train/loop.py _report): the writer records how many, under this name, beside it,
# and the console line and loss_summary name that window.
WINDOW = "window_steps"

# Dense bf16 peak TFLOP/s per device by jax `device_kind` prefix (vendor figures, no sparsity).
PEAK_TFLOPS = (
    ("TPU v6", 918.0), ("TPU v5p", 459.0), ("TPU v5 lite", 197.0), ("TPU v5e", 197.0), ("TPU v5", 459.0),
    ("TPU v4", 275.0), ("NVIDIA H200", 989.0), ("NVIDIA H100", 989.0), ("NVIDIA A100", 312.0),
    ("NVIDIA L4", 121.0),
)


def train_flops(config: Qwen3VLConfig, *, tokens: int, seq_len: int, patches: int = 0, images: int = 0) -> float:
    """Returns the model FLOPs of one training pass (3 x forward) over `tokens` text tokens in rows of
    `seq_len` and `patches` vision patches from `images` images."""
    t, v = config.text, config.vision
    d, hd = t.hidden_size, t.head_dim
    proj = 2 * d * hd * (2 * t.num_attention_heads + 2 * t.num_key_value_heads)
    mlp = 2 * 3 * d * t.intermediate_size
    attn = 2 * 2 * seq_len * hd * t.num_attention_heads / 2  # causal: on average half the row is visible
    text = tokens * (t.num_hidden_layers * (proj + mlp + attn) + 2 * d * t.vocab_size)
    vision = 0.0
    if patches:
        dv = v.hidden_size
        per_patch = 2 * (4 * dv * dv + 2 * dv * v.intermediate_size)
        patches_per_image = patches / max(images, 1)
        vision = patches * (v.depth * (per_patch + 2 * 2 * patches_per_image * dv) + 2 * v.patch_dim * dv)
        merged = patches / v.spatial_merge_size ** 2
        vision += merged * (1 + len(v.deepstack_visual_indexes)) * 2 * (
            v.merged_hidden_size ** 2 + v.merged_hidden_size * v.out_hidden_size)
    return 3.0 * (text + vision)


def peak_flops_per_device(configured_tflops: float = 0.0) -> float:
    """Returns peak FLOP/s of one device: the configured figure, the table's for accelerators, or a
    measured fp32 matmul rate on CPU (~0.3 s)."""
    if configured_tflops and configured_tflops > 0:
        return configured_tflops * 1e12
    device = jax.devices()[0]
    for prefix, tflops in PEAK_TFLOPS:
        if device.device_kind.startswith(prefix):
            return tflops * 1e12
    if device.platform != "cpu":
        return 0.0  # unknown accelerator: no MFU rather than a wrong one (set config.train.metrics.peak_tflops)
    # Host CPU "devices" (--xla_force_host_platform_device_count) share the same cores: split the rate.
    return measured_matmul_flops() / max(len(jax.devices()), 1)


def measured_matmul_flops(n: int = 1024, seconds: float = 0.3) -> float:
    """Returns the best fp32 [n, n] matmul FLOP/s of jax on the default device over `seconds`."""
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n), np.float32))
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best, end = 0.0, time.time() + seconds
    while time.time() < end:
        start = time.perf_counter()
        f(a).block_until_ready()
        best = max(best, 2 * n ** 3 / (time.perf_counter() - start))
    return best


class MetricsWriter:
    """Writes scalar metrics to TensorBoard event files and metrics.jsonl, and a line to the console.

    Only the writing process (process 0) touches files; the others keep silent.
    """

    def __init__(self, directory: str | pathlib.Path, *, enabled: bool = True, total_steps: int = 0,
                 initial_step: int = 0, progress: bool = True):
        # On a bucket the sinks write a local mirror (tensorboardX and an appended file want local files), uploaded
        # by sync(): at most every SYNC_S seconds, at every checkpoint (Trainer.save) and on close.
        self.directory, self.remote = storage.local_side(directory)
        self._synced = time.monotonic()
        self.enabled = enabled
        self._tb = None
        self._jsonl = None
        self._bar = None
        self._written = initial_step  # the step of the previous write: each write's window starts after it
        if enabled:
            self.directory.mkdir(parents=True, exist_ok=True)
            if self.remote:  # a resumed run appends to what the bucket holds, not to a stale mirror
                storage.pull_file(f"{self.remote}/metrics.jsonl")
                storage.pull_tree(f"{self.remote}/tensorboard")
            self._tb = tensorboardx().SummaryWriter(str(self.directory / "tensorboard"))
            self._jsonl = open(self.directory / "metrics.jsonl", "a")
            if progress:
                self._bar = tqdm(total=total_steps, initial=initial_step, unit="step", dynamic_ncols=True,
                                 desc=self.directory.name)

    def progress(self, step: int, loss: float | None = None) -> None:
        """Advances the progress bar to `step`, showing `loss`: that one step's (the logged loss is a window's mean)."""
        if self._bar is not None:
            self._bar.update(step - self._bar.n)
            if loss is not None:
                self._bar.set_postfix_str(f"loss (step {step} alone) {loss:.4f}", refresh=False)

    def write(self, step: int, scalars: dict[str, Any]) -> None:
        """Writes `scalars` (name -> number) for `step` to every sink; metrics.jsonl also gets window_steps: the
        steps since the previous write (or since the run's initial step), which the trainer's loss is the mean of."""
        if not self.enabled:
            return
        clean = {k: float(v) for k, v in scalars.items() if v is not None}
        for name, value in clean.items():
            self._tb.add_scalar(f"train/{name}", value, step)
        self._tb.flush()
        clean[WINDOW], self._written = step - self._written, step  # metrics.jsonl's, not a curve of its own
        self._jsonl.write(json.dumps({"step": step, **clean}) + "\n")
        self._jsonl.flush()
        if self.remote and time.monotonic() - self._synced >= SYNC_S:
            self.sync()
        line = f"[train] step {step}: " + "  ".join(f"{_label(k, step, clean)} {_fmt(v)}" for k, v in clean.items()
                                                    if k != WINDOW)
        if self._bar is not None:
            self._bar.write(line)
        else:
            print(line, flush=True)

    def message(self, text: str) -> None:
        """Prints a line to the console (above the progress bar)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(text)
        else:
            print(text, flush=True)

    def sync(self) -> None:
        """Uploads the metric files to the bucket (nothing for a local directory or a silent process)."""
        if self.remote and self._tb is not None:
            self._tb.flush()
            storage.push_files(self.directory, self.remote, ["metrics.jsonl"])
            storage.push_tree(self.directory / "tensorboard", f"{self.remote}/tensorboard")
            self._synced = time.monotonic()

    def close(self) -> None:
        if self._tb is not None:
            self.sync()
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.close()
        if self._jsonl is not None:
            self._jsonl.close()
        self._bar = self._tb = self._jsonl = None


def _label(name: str, step: int, scalars: dict[str, float]) -> str:
    """Returns how the console names scalar `name`: the loss with its window ("loss (mean of steps 41-50)")."""
    if name != "loss" or WINDOW not in scalars:
        return name
    return f"loss ({_span([step - int(scalars[WINDOW]) + 1, step])})"


def loss_summary(path: str | pathlib.Path) -> dict:
    """Returns the first and the last logged loss of a metrics.jsonl with the steps each is the mean of, and how
    many windows were logged: {"windows", "first_loss", "first_steps", "last_loss", "last_steps", "text"}, text
    such as "loss 5.255 (mean of steps 1-50, the first of 12 logged windows) -> 3.102 (mean of steps 551-600,
    the last)" or, from one window, "loss 5.255 (mean of steps 1-2, the only logged window: no trend)". A record
    without window_steps (written before the trainer wrote it) is taken to start after the one before it."""
    path = storage.as_path(path)
    logged = sorted((s, m) for s, m in read_metrics(path).items() if "loss" in m) if path.is_file() else []
    if not logged:
        return {"windows": 0, "first_loss": None, "first_steps": None, "last_loss": None, "last_steps": None,
                "text": "no loss logged"}
    spans, previous = [], 0
    for step, m in logged:
        spans.append([step - int(m[WINDOW]) + 1 if WINDOW in m else previous + 1, step])
        previous = step
    out = {"windows": len(logged), "first_loss": logged[0][1]["loss"], "first_steps": spans[0],
           "last_loss": logged[-1][1]["loss"], "last_steps": spans[-1]}
    first = f"loss {out['first_loss']:.3f} ({_span(spans[0])}"
    if len(logged) == 1:
        out["text"] = first + ", the only logged window: no trend)"
    else:
        out["text"] = (first + f", the first of {len(logged)} logged windows) -> {out['last_loss']:.3f} "
                       f"({_span(spans[-1])}, the last)")
    return out


def _span(steps: list[int]) -> str:
    return f"mean of steps {steps[0]}-{steps[1]}" if steps[0] < steps[1] else f"step {steps[1]}"


def _fmt(value: float) -> str:
    if value == 0 or 1e-3 <= abs(value) < 1e5:
        return f"{value:.4g}"
    return f"{value:.3e}"


def read_metrics(path: str | pathlib.Path) -> dict[int, dict[str, float]]:
    """Returns {step: scalars} from a metrics.jsonl; a step written twice (a resumed run) keeps its last line."""
    out: dict[int, dict[str, float]] = {}
    for line in storage.as_path(path).read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            out[int(record.pop("step"))] = record
    return out
