"""Rows that finish stop costing (issue 28, part 2): the decode loop with finished rows compacted away
(`model.decode_compaction = 2`, the default: the loop's rows halve, twice at most, as they finish) against the loop
that keeps every row until the last one stops (`decode_compaction = 0`), in the same run, same weights.

The batch is a synthetic one where most samples are short and a few run long, like an RL batch of short tool calls
with the odd rambling sample: the model-issue bench config (fp32 CPU) with random weights, text-only 768-token
prompts (the demo's element prompts are ~700), 96 new tokens (the demo's budget), temperature 1, and a stop set of
1/24 of the vocabulary, so a random model stops after ~24 tokens on average and a row now and then runs to the
budget. Two shapes:
  grouped: 4 prompts x G = 8 (mining's and Salvage-DS's group sampling, cascade: rows halve within their group);
  flat: 16 prompts, one sample each (evaluation, the server: all rows halve together).
And the grouped shape with no stop token at all (every row runs to the budget: what compaction costs when nothing
finishes). Each side's samples/s is the median over alternating timed runs (the same seed for both sides in a
run: the same samples), and its decode phase that median less the median of a call with one new token (the prefill
and the first draw, timed in the same rotation); the share of decode row-steps spent on rows already finished is read
off the loop's own count (`SampleOutput.row_steps`) and the rows' lengths. The
tokens of both sides are checked identical (every row draws with its own key).
Ends with one JSON line: ours = compacted grouped samples/s, anchor = uncompacted. `--quick`: grouped only,
2 prompts x G = 8, 256-token prompts, 48 new tokens, one timed run (under a minute; checks the script).
    python bench/finished_rows.py [--quick]
"""
from __future__ import annotations

import argparse
import dataclasses

import common
import numpy as np
from decode import timed
from gpu_sampling import with_runtime
from group_sampling import cpu_model

GROUP, STOP_SHARE = 8, 1 / 24


def finished_share(out) -> float:
    """Returns the share of the loop's decode row-steps spent on rows already finished."""
    live = int((out.lengths - 1).sum())  # the steps each row still had to decode (its first token is the prefill's)
    return 1.0 - live / max(int(out.row_steps), 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="grouped only, 2 prompts x G=8, short: checks the script")
    args = parser.parse_args()
    runs, prompt_len, new, prompts_n = (1, 256, 48, 2) if args.quick else (3, 768, 96, 4)
    flat_n = 16

    from rmsweb_jax.models.qwen3_vl import Qwen3VLConfig, create
    from rmsweb_jax.sampling.sampler import Sampler, SamplingParams

    model = create(Qwen3VLConfig.from_hf_dict(common.hf_bench_config().to_dict()))
    samplers = {c: Sampler(with_runtime(model, decode_compaction=c), length_buckets=(prompt_len,))
                for c in (0, 2)}
    rng = np.random.default_rng(0)
    prompts = [rng.integers(10, 30_000, prompt_len).tolist() for _ in range(max(prompts_n, flat_n))]
    stops = tuple(range(1000, 1000 + int(common.VOCAB * STOP_SHARE)))
    short = SamplingParams(max_new_tokens=new, temperature=1.0, stop_token_ids=stops)
    endless = SamplingParams(max_new_tokens=new, temperature=1.0)
    cases = {"grouped": (prompts[:prompts_n], GROUP, short), "grouped, no stop": (prompts[:prompts_n], GROUP, endless)}
    if not args.quick:
        cases["flat"] = (prompts[:flat_n], 1, short)
    seeds = iter(range(1, 10_000))

    def call(c, case, seed=None, first_only=False):
        batch, group, settings = cases[case]
        if first_only:  # the prefill and the first draw, no decode step
            settings = dataclasses.replace(settings, max_new_tokens=1)
        return lambda: samplers[c].generate_groups(batch, group, settings, seed=next(seeds) if seed is None else seed)

    results = {}
    for case in cases:
        # Compile and check on the way: the same seed gives the same samples on both sides.
        kept, compacted = call(0, case, 0)(), call(2, case, 0)()
        assert np.array_equal(kept.tokens, compacted.tokens) and np.array_equal(kept.lengths, compacted.lengths), case
        call(0, case, 0, first_only=True)()
        times = {0: [], 2: [], "first": []}
        shares = {0: [], 2: []}
        for _ in range(runs):  # alternating (this VM's speed drifts over seconds), one seed for both sides per run
            seed = next(seeds)
            for c in (0, 2):
                out, seconds = timed(call(c, case, seed))
                times[c].append(seconds)
                shares[c].append(finished_share(out))
            times["first"].append(timed(call(0, case, seed, first_only=True))[1])
        rows = len(cases[case][0]) * cases[case][1]
        first = float(np.median(times["first"]))
        results[case] = {c: {"samples_per_s": rows / float(np.median(times[c])), "runs": times[c],
                             "decode_s": float(np.median(times[c])) - first,
                             "finished_share": float(np.mean(shares[c]))} for c in (0, 2)}
        results[case].update(mean_length=float(kept.lengths.mean()), first_s=first)

    print(f"cpu: {cpu_model()}")
    print(f"state: {prompt_len}-token text prompts, {new} new tokens, temperature 1, stop set {len(stops)} of "
          f"{common.VOCAB} tokens ({STOP_SHARE:.1%}); {runs} timed run(s) per side, alternating")
    for case, r in results.items():
        batch, group, _ = cases[case]
        speedup = r[2]["samples_per_s"] / r[0]["samples_per_s"]
        r["speedup"], r["decode_speedup"] = speedup, r[0]["decode_s"] / max(r[2]["decode_s"], 1e-9)
        print(f"{case:>16} ({len(batch)} prompts x {group}, mean length {r['mean_length']:.1f}, prefill + first draw "
              f"{r['first_s']:.2f} s): kept {r[0]['samples_per_s']:.2f} samples/s "
              f"{[round(x, 2) for x in r[0]['runs']]} s, finished rows {r[0]['finished_share']:.0%} of row-steps | "
              f"compacted {r[2]['samples_per_s']:.2f} samples/s {[round(x, 2) for x in r[2]['runs']]} s, finished "
              f"rows {r[2]['finished_share']:.0%} | whole call {speedup:.2f}x, decode phase "
              f"{r[0]['decode_s']:.2f} -> {r[2]['decode_s']:.2f} s ({r['decode_speedup']:.2f}x)")
    g = results["grouped"]
    common.emit("finished_rows", g[2]["samples_per_s"], g[0]["samples_per_s"], "samples/s", 1.0,
                anchor_is="decode_compaction=0", finished_share_kept=round(g[0]["finished_share"], 3),
                finished_share_compacted=round(g[2]["finished_share"], 3), decode_speedup=round(g["decode_speedup"], 3),
                no_stop_speedup=round(results["grouped, no stop"]["speedup"], 3),
                flat_speedup=round(results["flat"]["speedup"], 3) if "flat" in results else None)


if __name__ == "__main__":
    main()
