"""Full training step (forward, backward, AdamW) tokens/s: ours (jax, fp32) vs transformers torch eager.

Same config, same weights, same inputs, both in this run; also prints our model-FLOPs utilisation
against the peak fp32 matmul throughput measured in the same run.
    python bench/train_step.py [--quick]
"""
from __future__ import annotations

import argparse
import functools
import tempfile

import common  # noqa: F401  (sets up sys.path / JAX_PLATFORMS)
import numpy as np


def model_flops_per_step(cfg, batch: int, length: int, patches: int) -> float:
    """Returns training FLOPs (3 x forward matmul FLOPs, attention included) for one step."""
    t, v = cfg.text, cfg.vision
    d, hd = t.hidden_size, t.head_dim
    per_tok = 2 * (d * hd * (t.num_attention_heads * 2 + t.num_key_value_heads * 2) + 3 * d * t.intermediate_size)
    attn = 2 * 2 * length * hd * t.num_attention_heads  # QK^T and PV per query token (full, as computed)
    text = batch * length * (t.num_hidden_layers * (per_tok + attn) + 2 * d * t.vocab_size)
    dv = v.hidden_size
    per_patch = 2 * (dv * 3 * dv + dv * dv + 2 * dv * v.intermediate_size)
    img_len = patches // batch
    vis = patches * (v.depth * (per_patch + 2 * 2 * img_len * dv) + 2 * v.patch_dim * dv)
    merged = patches // 4
    mergers = merged * (1 + len(v.deepstack_visual_indexes)) * 2 * (
        v.merged_hidden_size ** 2 + v.merged_hidden_size * v.out_hidden_size)
    return 3.0 * (text + vis + mergers)


def make_ours(ckpt, ids, pixels, grid, scan_layers: bool = False):
    """Returns (run one step -> loss, first-step loss, model config) for our jitted training step."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx
    from rmsweb_jax.models.qwen3_vl import RuntimeOptions, from_hf, prepare_inputs
    from rmsweb_jax.train.loss import resolve_loss_impl, token_cross_entropy

    model = from_hf(ckpt, runtime=RuntimeOptions(scan_layers=scan_layers))
    inputs = prepare_inputs(model.config, ids, pixel_values=pixels, image_grid_thw=grid)
    inputs = jax.tree.map(jnp.asarray, inputs)
    labels = jnp.asarray(ids[:, 1:], jnp.int32)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = optax.adamw(1e-5, weight_decay=0.0)
    # Committed to the device like the trainer's state: an uncommitted leaf (optax's step count) would
    # make the second call compile again with the first call's committed outputs as inputs.
    params, opt_state = jax.device_put((params, tx.init(params)), jax.devices()[0])
    impl = resolve_loss_impl("auto", None)  # the trainer's loss on one device (CPU: the fused path)

    def loss_fn(params):
        m = nnx.merge(graphdef, params, rest)
        hidden, _ = m.hidden_states(inputs)
        parts = token_cross_entropy(hidden[:, :-1], m.text.lm_head_matrix(), labels, jnp.ones(labels.shape),
                                    impl=impl)
        return parts.value()

    @functools.partial(jax.jit, donate_argnums=(0, 1))  # in place, as the trainer's step
    def step(params, opt_state):
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    state = list(step(params, opt_state))

    def run():
        state[:] = step(state[0], state[1])
        return float(state[2])  # waits for the step

    return run, float(state[2]), model.config


def make_torch(torch_model, ids, pixels, grid):
    """Returns (run one step -> loss, first-step loss) for transformers' model with torch.optim.AdamW."""
    import torch
    torch_model.train()
    opt = torch.optim.AdamW(torch_model.parameters(), lr=1e-5, weight_decay=0.0)
    kw = dict(input_ids=torch.from_numpy(ids), pixel_values=torch.from_numpy(pixels),
              image_grid_thw=torch.from_numpy(grid),
              mm_token_type_ids=torch.from_numpy((ids == common.IMAGE_TOKEN).astype(np.int64)))
    labels = torch.from_numpy(ids)

    def step():
        opt.zero_grad(set_to_none=True)
        out = torch_model(**kw, labels=labels)
        out.loss.backward()
        opt.step()
        return float(out.loss.detach())

    return step, step()


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="3 timed steps each (about a minute)")
    parser.add_argument("--steps", type=int, default=8, help="timed steps each, alternating; the median counts")
    parser.add_argument("--scan-layers", action="store_true",
                        help="run our layers as one lax.scan (the default for deep models); without it a Python "
                             "loop over the 4 layers (config.model.scan_layers = False)")
    args = parser.parse_args()
    steps = 3 if args.quick else args.steps
    batch, length = 4, 512
    rng = np.random.default_rng(0)
    ids, pixels, grid = common.image_batch(rng, batch, length)
    peak_before = common.peak_matmul_gflops(1.0 if args.quick else 3.0)
    with tempfile.TemporaryDirectory() as d:
        torch_model = common.write_bench_checkpoint(d)
        ours_run, ours_loss, cfg = make_ours(d, ids, pixels, grid, args.scan_layers)
        torch_run, torch_loss = make_torch(torch_model, ids, pixels, grid)
        timed = common.interleaved({"ours": ours_run, "torch": torch_run}, steps)
    ours_s, torch_s = timed["ours"], timed["torch"]
    tokens = batch * length
    # The best of two windows: one slow second of the machine must not set the MFU denominator.
    peak = max(peak_before, common.peak_matmul_gflops(1.0 if args.quick else 3.0))
    flops = model_flops_per_step(cfg, batch, length, pixels.shape[0])
    mfu = flops / ours_s / 1e9 / peak
    torch_mfu = flops / torch_s / 1e9 / peak
    print(f"first-step loss: ours {ours_loss:.5f}  torch {torch_loss:.5f}  (same weights and inputs)")
    print(f"step time (median of {steps}, alternating): ours {ours_s * 1e3:.1f} ms (scan_layers={args.scan_layers})  "
          f"torch {torch_s * 1e3:.1f} ms")
    print(f"tokens/s: ours {tokens / ours_s:.0f}  torch {tokens / torch_s:.0f}  ratio {torch_s / ours_s:.2f}x")
    print(f"peak fp32 matmul {peak:.1f} GFLOP/s; model FLOPs/step {flops / 1e9:.1f} G; "
          f"MFU ours {mfu:.1%}  torch {torch_mfu:.1%}")
    common.emit("train_step", tokens / ours_s, tokens / torch_s, "tokens/s", 1.2, mfu=round(mfu, 3),
                torch_mfu=round(torch_mfu, 3), peak_gflops=round(peak, 1), scan_layers=args.scan_layers)


if __name__ == "__main__":
    main()
