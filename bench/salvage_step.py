"""A Salvage-DS update vs an SFT step on the same tokens: step time ratio (goal <= 1.3x the SFT step).

Same model (the bench config of bench/common.py, fp32), same rows, same loss mask, same AdamW and the
trainer's own jitted step (train/step.py TrainStep): the SFT step takes the trainer's SFT loss
(on one CPU device the fused value-and-gradient kernel), the Salvage-DS update takes
train/rl_loss.py's clipped surrogate + anchor NLL (+ k3 KL with --kl) on the same batch, whose rows
are half policy rows (advantages +-1, old log-probs near the model's own so some ratios clip), a
quarter anchor rows, the rest policy rows of advantage 0. Timed alternately, the median counts.
    python bench/salvage_step.py [--quick] [--kl]
"""
from __future__ import annotations

import argparse
import tempfile
import time

import common  # noqa: F401  (sets up sys.path / JAX_PLATFORMS)
import numpy as np


def build(ckpt, batch: int, length: int, kl: bool):
    """Returns ({"sft": run, "salvage": run}, salvage aux of the first step): each run takes one step."""
    import jax
    import jax.numpy as jnp
    import optax
    from rmsweb_jax.models.qwen3_vl import from_hf
    from rmsweb_jax.train import batch as batch_lib
    from rmsweb_jax.train.logprobs import token_logprobs_of
    from rmsweb_jax.train.loss import make_sft_loss, resolve_loss_impl
    from rmsweb_jax.train.rl_loss import RLLossSettings, make_salvage_loss
    from rmsweb_jax.train.step import ModelParts, TrainStep, init_train_state

    model = from_hf(ckpt)
    parts = ModelParts.split(model)
    rng = np.random.default_rng(0)
    ids, pixels, grid = common.image_batch(rng, batch, length)
    prompt = length // 2
    mask = np.zeros((batch, length), np.float32)
    mask[:, prompt:] = 1
    anchor = np.zeros(batch, np.float32)
    anchor[batch // 2: batch // 2 + max(batch // 4, 1)] = 1
    for r in np.flatnonzero(anchor):  # an anchor row weights only its action span
        mask[r] = 0
        mask[r, prompt + 32: prompt + 64] = 1
    advantage = np.where(anchor == 0, np.where(np.arange(batch) % 2 == 0, 1.0, -1.0), 0.0).astype(np.float32)
    advantage[batch // 2 + max(batch // 4, 1):] = 0.0
    host = {"input_ids": ids.astype(np.int32), "attention_mask": np.ones_like(ids, np.int32), "loss_mask": mask,
            "pixel_values": pixels, "image_grid_thw": grid}
    impl = resolve_loss_impl("auto", None)
    sft_batch = batch_lib.prepare_batch(host, model.config, 1)
    own = batch_lib.unshift_tokens(batch_lib.rows_of(token_logprobs_of(parts, sft_batch, impl=impl), 1))
    rl_host = dict(host, advantage=advantage, anchor=anchor,
                   token_old_logprobs=own + rng.normal(0, 0.2, own.shape).astype(np.float32))
    if kl:
        rl_host["token_ref_logprobs"] = own + rng.normal(0, 0.1, own.shape).astype(np.float32)
    rl_batch = batch_lib.prepare_batch(rl_host, model.config, 1)
    settings = RLLossSettings(clip_low=0.2, clip_high=0.28, aggregation="token_mean", kl_beta=0.05 if kl else 0.0,
                              anchor_weight=0.1)
    tx = optax.adamw(1e-5, weight_decay=0.0)
    runs, aux = {}, {}
    for name, loss_fn, tb in (("sft", make_sft_loss(impl), sft_batch),
                              ("salvage", make_salvage_loss(settings, impl), rl_batch)):
        step = TrainStep(parts, loss_fn, tx)  # donates the state, like the trainer
        # A copy of the parameters per step: each step donates its state.
        state = [init_train_state(jax.tree.map(jnp.copy, parts.params), tx, 0, None)]
        placed = batch_lib.to_global(tb, None)

        def run(step=step, state=state, placed=placed):
            state[0], metrics = step(state[0], placed)
            return float(metrics["loss"])  # waits for the step

        start = time.perf_counter()
        run()
        print(f"{name}: first step (compile + run) {time.perf_counter() - start:.1f} s", flush=True)
        runs[name] = run
        if name == "salvage":
            state[0], metrics = step(state[0], placed)
            aux = jax.device_get(metrics["aux"])
    return runs, aux


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="4 rows of 256 tokens, 3 timed steps each (< 1 min)")
    parser.add_argument("--steps", type=int, default=8, help="timed steps each, alternating; the median counts")
    parser.add_argument("--kl", action="store_true", help="add the k3 KL term (kl_beta 0.05)")
    args = parser.parse_args()
    batch, length = (4, 256) if args.quick else (4, 512)
    steps = 3 if args.quick else args.steps
    with tempfile.TemporaryDirectory() as d:
        common.write_bench_checkpoint(d)
        runs, aux = build(d, batch, length, args.kl)
        timed = common.interleaved(runs, steps)
    from rmsweb_jax.train import aux_metrics
    shown = {k: round(v, 4) for k, v in aux_metrics.resolve(aux).items()}
    ratio = timed["salvage"] / timed["sft"]
    print(f"step time (median of {steps}, alternating, {batch} x {length} tokens): salvage "
          f"{timed['salvage'] * 1e3:.1f} ms  sft {timed['sft'] * 1e3:.1f} ms  ratio {ratio:.3f}x (goal <= 1.3x)")
    print(f"salvage metrics of a step: {shown}")
    common.emit("salvage_step", timed["salvage"], timed["sft"], "s/step", 1.3, digits=4, kl=args.kl,
                batch_shape=[batch, length], clip_fraction_high=shown.get("clip_fraction_high"),
                clip_fraction_low=shown.get("clip_fraction_low"))


if __name__ == "__main__":
    main()
