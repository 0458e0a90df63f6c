"""Batched greedy decode tokens/s: our KV-cache sampler vs transformers `generate`, same weights, one run.

Batch 8, 64-token prompts, 64 new tokens, the model-issue bench config (fp32 CPU).
    python bench/decode.py [--quick]
"""
from __future__ import annotations

import argparse
import tempfile
import time

import common
import numpy as np


def timed(fn, settle_s: float = 0.5):
    """Returns (fn(), wall seconds), after a pause that lets the other side's spinning worker threads
    (torch's OpenMP pool spins ~200 ms after each op) go idle."""
    time.sleep(settle_s)
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="two timed runs each (well under a minute)")
    args = parser.parse_args()
    runs = 2 if args.quick else 7
    batch, prompt_len, new = 8, 64, 64
    rng = np.random.default_rng(0)
    prompts = rng.integers(10, 30_000, (batch, prompt_len))

    import torch
    from rmsweb_jax.models.qwen3_vl import from_hf
    from rmsweb_jax.sampling.sampler import Sampler, SamplingParams

    with tempfile.TemporaryDirectory() as d:
        torch_model = common.write_bench_checkpoint(d).eval()
        model = from_hf(d)
    torch_model.generation_config.eos_token_id = None
    torch_model.generation_config.pad_token_id = 0

    sampler = Sampler(model, length_buckets=(prompt_len,))
    params = SamplingParams(max_new_tokens=new)
    ids = torch.from_numpy(prompts)
    kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
              do_sample=False)

    def run_ours():
        return sampler.generate(prompts.tolist(), params)

    def run_hf():
        with torch.no_grad():
            return torch_model.generate(**kw)

    ours, ref = run_ours(), run_hf()  # compile / warm up
    # The sides alternate run by run and each keeps its median: this VM's memory bandwidth drifts by
    # tens of percent over seconds, which back-to-back blocks would book to one side.
    ours_times, torch_times = [], []
    for _ in range(runs):
        ours, seconds = timed(run_ours)
        ours_times.append(seconds)
        ref, seconds = timed(run_hf)
        torch_times.append(seconds)
    ours_s, torch_s = float(np.median(ours_times)), float(np.median(torch_times))
    same = float((ref[:, prompt_len:].numpy() == ours.tokens).mean())
    tokens = batch * new
    print(f"greedy tokens identical to HF generate: {same:.1%} of {tokens}")
    print(f"decode: ours {ours_s:.2f} s ({tokens / ours_s:.0f} tok/s)  HF generate {torch_s:.2f} s "
          f"({tokens / torch_s:.0f} tok/s)  ratio {torch_s / ours_s:.2f}x")
    common.emit("decode", tokens / ours_s, tokens / torch_s, "tokens/s", 4.0, identical_tokens=round(same, 4))


if __name__ == "__main__":
    main()
