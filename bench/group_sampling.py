"""G = 8 sampled responses of one state, samples/s: shared-prefix group sampling vs 8 independent prompts
through the same sampler vs transformers' `generate(num_return_sequences=8, do_sample=True)`, same weights.

The state is demo-sized: one screenshot of 512 patches (a 256x512 crop, 128 image tokens) in a 2,304-token
prompt (`--quick`: 1,024 tokens), 64 new tokens per response, temperature 1 with no top-k / top-p, no stop
token; the model-issue bench config (fp32 CPU). The JSON line's anchor is the slower of the two to beat.
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
    parser.add_argument("--quick", action="store_true", help="a 1,024-token prompt, one timed run each")
    args = parser.parse_args()
    runs, prompt_len = (1, 1024) if args.quick else (3, 2304)
    ids, pixels, grid = common.image_batch(np.random.default_rng(0), 1, prompt_len, GRID)
    prompt = ids[0].tolist()

    import torch
    from rmsweb_jax.models.qwen3_vl import from_hf
    from rmsweb_jax.sampling.sampler import Sampler, SamplingParams

    with tempfile.TemporaryDirectory() as d:
        torch_model = common.write_bench_checkpoint(d).eval()
        model = from_hf(d)
    torch_model.generation_config.eos_token_id = None
    torch_model.generation_config.pad_token_id = 0

    sampler = Sampler(model, length_buckets=(prompt_len,), patch_bucket=pixels.shape[0])
    params = SamplingParams(max_new_tokens=NEW, temperature=1.0)
    hf_kw = dict(input_ids=torch.from_numpy(ids), attention_mask=torch.ones(ids.shape, dtype=torch.long),
                 pixel_values=torch.from_numpy(pixels), image_grid_thw=torch.from_numpy(grid),
                 mm_token_type_ids=torch.from_numpy((ids == common.IMAGE_TOKEN).astype(np.int64)),
                 max_new_tokens=NEW, min_new_tokens=NEW, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                 num_return_sequences=GROUP)
    seeds = iter(range(1000))

    def run_grouped():
        return sampler.generate_groups([prompt], GROUP, params, pixel_values=pixels, image_grid_thw=grid,
                                       seed=next(seeds))

    def run_independent():
        return sampler.generate([prompt] * GROUP, params, pixel_values=np.concatenate([pixels] * GROUP),
                                image_grid_thw=np.concatenate([grid] * GROUP), seed=next(seeds))

    def run_hf():
        with torch.no_grad():
            return torch_model.generate(**hf_kw)

    # Compile / warm up, and check the contract on the way: the same seed gives the same samples.
    grouped = sampler.generate_groups([prompt], GROUP, params, pixel_values=pixels, image_grid_thw=grid, seed=7)
    independent = sampler.generate([prompt] * GROUP, params, pixel_values=np.concatenate([pixels] * GROUP),
                                   image_grid_thw=np.concatenate([grid] * GROUP), seed=7)
    same = float((grouped.tokens == independent.tokens).mean())
    lp_diff = float(np.abs(grouped.logprobs - independent.logprobs).max())
    hf = run_hf() if not args.quick else None
    # The sides alternate run by run and each keeps its median (this VM's speed drifts over seconds).
    times = {"grouped": [], "independent": [], "hf": []}
    for _ in range(runs):
        for name, fn in (("grouped", run_grouped), ("independent", run_independent), ("hf", run_hf)):
            out, seconds = timed(fn)
            times[name].append(seconds)
            if name == "hf":
                hf = out
    assert hf.shape == (GROUP, prompt_len + NEW), hf.shape
    rate = {name: GROUP / float(np.median(t)) for name, t in times.items()}
    print(f"cpu: {cpu_model()}")
    print(f"state: {prompt_len}-token prompt, one {GRID[1] * 16}x{GRID[2] * 16} image ({pixels.shape[0]} patches), "
          f"G={GROUP} x {NEW} new tokens, {runs} timed run(s) each")
    print(f"grouped vs independent, seed 7: tokens identical {same:.1%}, log-probs max |diff| {lp_diff:.1e}")
    for name, t in times.items():
        print(f"{name:>12}: median {np.median(t):.2f} s  ({rate[name]:.2f} samples/s)  runs {[round(x, 2) for x in t]}")
    vs_independent, vs_hf = rate["grouped"] / rate["independent"], rate["grouped"] / rate["hf"]
    print(f"grouped / independent {vs_independent:.2f}x   grouped / HF generate {vs_hf:.2f}x   (goal >= 3x each)")
    anchor = "independent" if vs_independent <= vs_hf else "hf"
    common.emit("group_sampling", rate["grouped"], rate[anchor], "samples/s", 3.0, anchor_is=anchor,
                ratio_vs_independent=round(vs_independent, 3), ratio_vs_hf=round(vs_hf, 3),
                identical_tokens=round(same, 4))


if __name__ == "__main__":
    main()
