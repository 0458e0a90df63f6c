"""Full training step (forward, backward, AdamW) tokens/s: ours (jax, fp32) vs transformers torch eager.

Same config, same weights, same inputs, both in this run; also prints our model-FLOPs utilisation
against the peak fp32 matmul throughput measured in the same run.
    python bench/train_step.py [--quick]
"""
from __future__ import annotations

import argparse
import tempfile
import time

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


def bench_ours(ckpt, ids, pixels, grid, steps):
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx
    from rmsweb_jax.models.qwen3_vl import from_hf, prepare_inputs

    model = from_hf(ckpt)
    inputs = prepare_inputs(model.config, ids, pixel_values=pixels, image_grid_thw=grid)
    inputs = jax.tree.map(jnp.asarray, inputs)
    labels = jnp.asarray(ids[:, 1:], jnp.int32)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = optax.adamw(1e-5, weight_decay=0.0)
    opt_state = tx.init(params)

    def loss_fn(params):
        m = nnx.merge(graphdef, params, rest)
        hidden, _ = m.hidden_states(inputs)
        logits = m.logits(hidden[:, :-1])
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], axis=-1))

    @jax.jit
    def step(params, opt_state):
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    params, opt_state, loss = step(params, opt_state)
    loss.block_until_ready()
    first = float(loss)
    start = time.perf_counter()
    for _ in range(steps):
        params, opt_state, loss = step(params, opt_state)
    loss.block_until_ready()
    return (time.perf_counter() - start) / steps, first, model.config


def bench_torch(torch_model, ids, pixels, grid, steps):
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
        return out.loss

    first = float(step())
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps, first


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="2 timed steps each (about a minute)")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    steps = 2 if args.quick else args.steps
    batch, length = 4, 512
    rng = np.random.default_rng(0)
    ids, pixels, grid = common.image_batch(rng, batch, length)
    with tempfile.TemporaryDirectory() as d:
        torch_model = common.write_bench_checkpoint(d)
        ours_s, ours_loss, cfg = bench_ours(d, ids, pixels, grid, steps)
        torch_s, torch_loss = bench_torch(torch_model, ids, pixels, grid, steps)
    tokens = batch * length
    peak = common.peak_matmul_gflops(1.0 if args.quick else 3.0)
    flops = model_flops_per_step(cfg, batch, length, pixels.shape[0])
    mfu = flops / ours_s / 1e9 / peak
    torch_mfu = flops / torch_s / 1e9 / peak
    print(f"first-step loss: ours {ours_loss:.5f}  torch {torch_loss:.5f}  (same weights and inputs)")
    print(f"step time: ours {ours_s * 1e3:.1f} ms  torch {torch_s * 1e3:.1f} ms")
    print(f"tokens/s: ours {tokens / ours_s:.0f}  torch {tokens / torch_s:.0f}  ratio {torch_s / ours_s:.2f}x")
    print(f"peak fp32 matmul {peak:.1f} GFLOP/s; model FLOPs/step {flops / 1e9:.1f} G; "
          f"MFU ours {mfu:.1%}  torch {torch_mfu:.1%}")
    common.emit("train_step", tokens / ours_s, tokens / torch_s, "tokens/s", 1.2, mfu=round(mfu, 3),
                torch_mfu=round(torch_mfu, 3), peak_gflops=round(peak, 1))


if __name__ == "__main__":
    main()
