"""Where one grouped decode step's time goes (issue 28): the step of `bench/group_sampling.py` (the model-issue bench
config, fp32 CPU, per-layer decode weights; G = 8 rows of one 2,304-token prompt) split into its parts, each timed
alone as 24 steps of a `fori_loop` over the sampler's own functions:
  weights   `decode.step_hidden` over a 64-slot cache (the rows' own tokens only): the text layers' weight stream
            and the work per row, with next to no attention;
  copy      `step_hidden` over the prompt's cache copied to the 8 rows (prompt + 64 slots each);
  cascade   `step_hidden` over one copy of the prompt's cache (the `prefix`) plus the rows' own 64 slots;
  head      `decode.step_logits`: the [32k, 512] output projection;
  draw      `sampler.sample_token` at temperature 1 (Gumbel noise per row key, the argmax, the log-softmax);
and, as a check on the sum, the whole step (hidden, head, draw) in one loop, with this host's product.
The first four run with both of `decode`'s products of a few rows by a matrix: XLA's dot over [in, out] matrices
and the multiply fused into a row reduction over [out, in] (`StepWeights.fused_rows`; `fused_rows_default` says
which this host takes); the draw also as the sampler drew before (`jax.random.categorical`, whose argmax is
XLA's (value, index) reduce). A path's step = its hidden + head + draw; attention over the prompt = its hidden
less `weights`. "before" = the fused product and the categorical draw (the sampler until this bench).
`--demo`: the same split for the demo's policy (configs/demo.py's `random:demo`, 4 x 64 wide, vocabulary 768) at
mining's shape: one call of G = 8 rows of one prompt (mine.max_batch = 8 rows, K = 8), `--prompt` tokens (default
704, the demo's longer element prompts), 96 new tokens.
The JSON line: ours = cascade's step ms now, anchor = copy's; decode_speedup = copy / cascade (issue 28's goal: the
decode phase >= 2x). `--quick`: a 1,024-token prompt, one round of 3 timed loops a part (under a minute).
    python bench/decode_split.py [--quick] [--demo [--prompt N]]
"""
from __future__ import annotations

import argparse

import common
from group_sampling import GROUP, NEW, cpu_model


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a 1,024-token prompt, one round of 3 timed loops a part")
    parser.add_argument("--demo", action="store_true", help="the demo's policy at mining's shape (G = 8, 96 new)")
    parser.add_argument("--prompt", type=int, default=None, help="prompt tokens (default 2,304; --demo 704)")
    args = parser.parse_args()
    repeats, rounds = (3, 1) if args.quick else (9, 2)
    prompt_len = args.prompt or (704 if args.demo else 1024 if args.quick else 2304)
    new = 96 if args.demo else NEW

    import jax
    import jax.numpy as jnp
    from grouped_step import STEPS, GroupedStep, in_slots, per_step_ms
    from rmsweb_jax.models.qwen3_vl import Qwen3VLConfig, create, decode
    from rmsweb_jax.models.qwen3_vl.config import demo
    from rmsweb_jax.sampling.sampler import row_keys

    model = create(demo() if args.demo else Qwen3VLConfig.from_hf_dict(common.hf_bench_config().to_dict()))
    grouped = GroupedStep(model, prompt_len, new)
    layouts = {"dot": False, "fused": True}
    weights = {name: grouped.weights(fused) for name, fused in layouts.items()}
    cfg, rng, state = grouped.cfg, grouped.rng, grouped.state
    copied, own, prefix = grouped.copied, grouped.own, grouped.prefix
    rows, positions, sample = grouped.rows, grouped.positions, grouped.sample

    def hidden(shared):
        def body(text, weights, i, carry):
            step_cache, total = carry
            x, step_cache = decode.step_hidden(text, weights, in_slots(step_cache), rows + i, positions + i, shared)
            return step_cache, total + x.sum()  # all of x: XLA would drop work a slice does not need
        return body

    def head(text, weights, i, x):
        return x + 1e-9 * decode.step_logits(weights, x).sum(axis=1, keepdims=True)

    logits = jnp.asarray(rng.standard_normal((GROUP, cfg.vocab_size)), jnp.float32)

    def draw(text, weights, i, total):
        token, logprob = sample(logits + total, i)
        return total + 1e-9 * (token.sum() + logprob.sum())

    def categorical_draw(text, weights, i, total):  # the sampler's draw before: jax.random.categorical
        keys = row_keys(jax.random.fold_in(jax.random.key(0), i), rows)
        scaled = logits + total
        token = jax.vmap(jax.random.categorical)(keys, scaled)
        token = jnp.where(jnp.float32(1.0) <= 0, jnp.argmax(scaled, axis=-1), token)
        logprob = jnp.take_along_axis(jax.nn.log_softmax(scaled, axis=-1), token[:, None], axis=-1)
        return total + 1e-9 * (token.sum() + logprob.sum())

    parts = {}
    for layout in layouts:
        parts.update({(name, layout): (body, carry, weights[layout]) for name, body, carry in (
            ("weights", hidden(None), (own, jnp.float32(0))), ("copy", hidden(None), (copied, jnp.float32(0))),
            ("cascade", hidden(prefix), (own, jnp.float32(0))),
            ("head", head, jnp.ones((GROUP, cfg.hidden_size), jnp.float32)))})
    host = "fused" if decode.fused_rows_default() else "dot"
    for path, cache_, shared in (("copy", copied, None), ("cascade", own, prefix)):
        parts[(f"{path}_step", host)] = (grouped.whole_step(shared), (cache_, rows), weights[host])
    parts[("draw", "now")] = (draw, jnp.float32(0), weights["dot"])
    parts[("draw", "categorical")] = (categorical_draw, jnp.float32(0), weights["dot"])
    parts = {name: (grouped.loop(body), carry, step_weights) for name, (body, carry, step_weights) in parts.items()}
    ms = {name: [] for name in parts}  # each loop compiles once, in its first round
    for _ in range(rounds):  # rounds alternate the parts (this VM's speed drifts); each part keeps its best
        for name, (run, carry, step_weights) in parts.items():
            ms[name].append(per_step_ms(run, (state, step_weights, carry), repeats))
    ms = {name: min(t) for name, t in ms.items()}
    weight_mb = decode.copy_bytes(model.text) / 1e6
    head_mb = cfg.vocab_size * cfg.hidden_size * 4 / 1e6
    kv_mb_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4 / 1e6  # K and V, fp32
    cache_mb = {"copy": kv_mb_per_token * GROUP * (prompt_len + new),
                "cascade": kv_mb_per_token * (prompt_len + GROUP * new)}
    print(f"cpu: {cpu_model()}; this host's product: {host} (decode.fused_rows_default)")
    print(f"model: {'the demo policy' if args.demo else 'the bench config'}; step: G={GROUP} rows of one "
          f"{prompt_len}-token prompt, {new} new-token slots, {STEPS} steps a loop, best of {rounds} round(s) "
          f"of the median of {repeats} loops")
    print(f"{'part':>9}  {'dot [in, out]':>24}  {'fused [out, in]':>24}")

    def row(name, mb=None, note=""):
        cells = []
        for layout in layouts:
            t = ms[(name, layout)]
            cells.append(f"{t:6.2f} ms" + (f" ({mb / t:4.1f} GB/s)" if mb else " " * 12))
        print(f"{name:>9}  " + "  ".join(f"{c:>24}" for c in cells) + note)

    row("weights", weight_mb - head_mb, f"   text layers {weight_mb - head_mb:.0f} MB")
    for path in ("copy", "cascade"):
        row(path, note="   attention over the prompt: " + ", ".join(
            f"{layout} {ms[(path, layout)] - ms[('weights', layout)]:.2f} ms" for layout in layouts)
            + f"; KV read {cache_mb[path]:.0f} MB")
    row("head", head_mb, f"   {head_mb:.0f} MB")
    print(f"{'draw':>9}  {ms[('draw', 'now')]:6.2f} ms (first_argmax)  jax.random.categorical "
          f"{ms[('draw', 'categorical')]:.2f} ms ({ms[('draw', 'categorical')] / ms[('draw', 'now')]:.1f}x)")

    def step(path, layout, draw):
        return ms[(path, layout)] + ms[("head", layout)] + ms[("draw", draw)]

    now = {path: step(path, host, "now") for path in ("copy", "cascade")}
    before = {path: step(path, "fused", "categorical") for path in ("copy", "cascade")}
    for path in ("copy", "cascade"):
        parts_now = (("weights", ms[("weights", host)]), ("attention", ms[(path, host)] - ms[("weights", host)]),
                     ("head", ms[("head", host)]), ("draw", ms[("draw", "now")]))
        print(f"{path:>8} step: now {now[path]:6.2f} ms, before {before[path]:6.2f} ms "
              f"({before[path] / now[path]:.2f}x); now " + ", ".join(f"{k} {v / now[path]:.0%}" for k, v in parts_now))
    speedup, speedup_before = now["copy"] / now["cascade"], before["copy"] / before["cascade"]
    print(f"cascade / copy, per step: now {speedup:.2f}x, before {speedup_before:.2f}x (goal >= 2x)")
    whole = {path: ms[(f"{path}_step", host)] for path in ("copy", "cascade")}
    print("the whole step in one loop (hidden, head, draw, its token the next step's input): "
          + ", ".join(f"{path} {whole[path]:.2f} ms (parts' sum {now[path]:.2f})" for path in whole)
          + f"; cascade / copy {whole['copy'] / whole['cascade']:.2f}x")
    common.emit("decode_split", now["cascade"], now["copy"], "ms/step", 0.5, anchor_is="copy", product=host,
                model="demo" if args.demo else "bench", prompt_tokens=prompt_len,
                decode_speedup=round(speedup, 3), decode_speedup_before=round(speedup_before, 3),
                cascade_step_before_ms=round(before["cascade"], 2), copy_step_before_ms=round(before["copy"], 2),
                whole_step_speedup=round(whole["copy"] / whole["cascade"], 3),
                **{f"{name}_{layout}_ms": round(value, 3) for (name, layout), value in ms.items()})


if __name__ == "__main__":
    main()
