"""G = 8 sampled responses of one state, samples/s: cascade group decoding (one copy of the prompt's KV cache read
once per group per step, plus each row's own cache) against the old grouped path (the prompt's cache copied to the
G rows, `model.group_decode = "copy"`) in the same run, same weights; the full run also against 8 independent
prompts through the same sampler and transformers' `generate(num_return_sequences=8, do_sample=True)`.

The state is demo-sized: one screenshot of 512 patches (a 256x512 crop, 128 image tokens) in a 2,304-token
prompt (`--quick`: 1,024 tokens, cascade and copy only: under a minute), 64 new tokens per response, temperature
1 with no top-k / top-p, no stop token; the model-issue bench config (fp32 CPU). The decode phase of a path is
its time with 64 new tokens less its time with 1 (prefill, vision and the first draw, no decode step). The JSON
line's anchor is the copy path (issue 28's goals: decode phase >= 2x, whole samples/s >= 1.3x).
    python bench/group_sampling.py [--quick]
"""
from __future__ import annotations

import argparse
import subprocess
import tempfile

import common
import numpy as np
from decode import timed

GROUP, NEW, GRID = 8, 64, (1, 16, 32)


def cpu_model() -> str:
    """Returns lscpu's "Model name" and whether AVX-512 is there (the ratios differ by machine type)."""
    info = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("Model name")), "?")
    return f"{name} ({'AVX-512' if 'avx512f' in info else 'no AVX-512'})"


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true",
                        help="a 1,024-token prompt, cascade vs copy only, one timed run each")
    args = parser.parse_args()
    runs, prompt_len = (1, 1024) if args.quick else (3, 2304)
    ids, pixels, grid = common.image_batch(np.random.default_rng(0), 1, prompt_len, GRID)
    prompt = ids[0].tolist()

    import torch
    from gpu_sampling import with_group_decode
    from rmsweb_jax.models.qwen3_vl import Qwen3VLConfig, create, from_hf
    from rmsweb_jax.sampling.sampler import Sampler, SamplingParams

    if args.quick:  # no transformers side: our random weights, no checkpoint round trip
        model, torch_model = create(Qwen3VLConfig.from_hf_dict(common.hf_bench_config().to_dict())), None
    else:
        with tempfile.TemporaryDirectory() as d:
            torch_model = common.write_bench_checkpoint(d).eval()
            model = from_hf(d)
        torch_model.generation_config.eos_token_id = None
        torch_model.generation_config.pad_token_id = 0
    # Both paths over the same parameter arrays (shared, not copied).
    samplers = {path: Sampler(with_group_decode(model, path), length_buckets=(prompt_len,),
                              patch_bucket=pixels.shape[0]) for path in ("cascade", "copy")}

    params = SamplingParams(max_new_tokens=NEW, temperature=1.0)
    first_only = SamplingParams(max_new_tokens=1, temperature=1.0)
    hf_kw = dict(input_ids=torch.from_numpy(ids), attention_mask=torch.ones(ids.shape, dtype=torch.long),
                 pixel_values=torch.from_numpy(pixels), image_grid_thw=torch.from_numpy(grid),
                 mm_token_type_ids=torch.from_numpy((ids == common.IMAGE_TOKEN).astype(np.int64)),
                 max_new_tokens=NEW, min_new_tokens=NEW, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                 num_return_sequences=GROUP)
    seeds = iter(range(1000))

    def grouped(path, settings, seed=None):
        return lambda: samplers[path].generate_groups([prompt], GROUP, settings, pixel_values=pixels,
                                                      image_grid_thw=grid, seed=next(seeds) if seed is None else seed)

    def run_independent(seed=None):
        return samplers["cascade"].generate([prompt] * GROUP, params, pixel_values=np.concatenate([pixels] * GROUP),
                                            image_grid_thw=np.concatenate([grid] * GROUP),
                                            seed=next(seeds) if seed is None else seed)

    def run_hf():
        with torch.no_grad():
            return torch_model.generate(**hf_kw)

    sides = {"cascade": grouped("cascade", params), "copy": grouped("copy", params),
             "cascade_first": grouped("cascade", first_only), "copy_first": grouped("copy", first_only)}
    if not args.quick:
        sides.update(independent=run_independent, hf=run_hf)
    # Compile / warm up, and check the contract on the way: the same seed gives the same samples.
    cascade, copy = grouped("cascade", params, 7)(), grouped("copy", params, 7)()
    for name in ("cascade_first", "copy_first"):
        sides[name]()
    contract = {"copy": copy}
    if not args.quick:
        contract["independent"] = run_independent(7)
        run_hf()
    # The sides alternate run by run and each keeps its median (this VM's speed drifts over seconds).
    times = {name: [] for name in sides}
    for _ in range(runs):
        for name, fn in sides.items():
            out, seconds = timed(fn)
            times[name].append(seconds)
            if name == "hf":
                assert out.shape == (GROUP, prompt_len + NEW), out.shape
    median = {name: float(np.median(t)) for name, t in times.items()}
    rate = {name: GROUP / median[name] for name in sides if not name.endswith("_first")}
    decode = {path: median[path] - median[f"{path}_first"] for path in ("cascade", "copy")}
    print(f"cpu: {cpu_model()}")
    print(f"state: {prompt_len}-token prompt, one {GRID[1] * 16}x{GRID[2] * 16} image ({pixels.shape[0]} patches), "
          f"G={GROUP} x {NEW} new tokens, {runs} timed run(s) each")
    for name, other in contract.items():
        same = float((cascade.tokens == other.tokens).mean())
        print(f"cascade vs {name}, seed 7: tokens identical {same:.1%}, log-probs max |diff| "
              f"{float(np.abs(cascade.logprobs - other.logprobs).max()):.1e}")
    for name, t in times.items():
        print(f"{name:>14}: median {median[name]:.2f} s  runs {[round(x, 2) for x in t]}"
              + (f"  ({rate[name]:.2f} samples/s)" if name in rate else ""))
    for path in ("copy", "cascade"):
        print(f"{path:>8}: decode phase {decode[path]:.2f} s = {decode[path] / median[path]:.0%} of the call")
    decode_speedup, whole = decode["copy"] / decode["cascade"], rate["cascade"] / rate["copy"]
    print(f"cascade / copy: decode phase {decode_speedup:.2f}x (goal >= 2x), samples/s {whole:.2f}x (goal >= 1.3x)")
    extra = dict(anchor_is="copy", decode_speedup=round(decode_speedup, 3),
                 decode_share_copy=round(decode["copy"] / median["copy"], 3),
                 decode_share_cascade=round(decode["cascade"] / median["cascade"], 3))
    if not args.quick:
        vs_independent, vs_hf = rate["cascade"] / rate["independent"], rate["cascade"] / rate["hf"]
        print(f"cascade / independent {vs_independent:.2f}x   cascade / HF generate {vs_hf:.2f}x   (goal >= 3x each)")
        extra.update(ratio_vs_independent=round(vs_independent, 3), ratio_vs_hf=round(vs_hf, 3))
    common.emit("group_sampling", rate["cascade"], rate["copy"], "samples/s", 1.3, **extra)


if __name__ == "__main__":
    main()
