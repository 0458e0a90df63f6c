"""The `model` stage: load the policy, run one multimodal generation, report it (a smoke test)."""
from __future__ import annotations

import json
import pathlib
import time

from absl import logging
from flax import nnx
from PIL import Image, ImageDraw

from rmsweb_jax.model_init import load_model
from rmsweb_jax.models.qwen3_vl.layers import num_params
from rmsweb_jax.processing.image import ImageProcessorConfig, preprocess_images
from rmsweb_jax.processing.prompt_tokens import encode_multimodal, load_tokenizer
from rmsweb_jax.sampling.sampler import Sampler, SamplingParams

# What the stage reads and writes (rmsweb_jax/stages/manifest.py decides from these whether it is up to date).
CONFIG_READS = ("smoke", "model", "mesh", "sharding_rules", "seed")
INPUT_STAGES: dict = {}
OUTPUTS = {"model_smoke.json": None}


def synthetic_screenshot(width: int = 256, height: int = 160) -> Image.Image:
    """Returns a small drawn 'web page' (title, text field, two buttons) for the smoke prompt."""
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    draw.rectangle([0, 0, width, 24], fill=(40, 90, 160))
    draw.text((8, 6), "Sign up", fill="white")
    draw.rectangle([16, 48, width - 16, 72], outline=(120, 120, 120))
    draw.text((22, 54), "email", fill=(150, 150, 150))
    draw.rectangle([16, 100, 110, 128], fill=(30, 140, 60))
    draw.text((36, 108), "Submit", fill="white")
    draw.rectangle([130, 100, 230, 128], fill=(180, 50, 50))
    draw.text((152, 108), "Cancel", fill="white")
    return img


def check_config(config, workdir) -> None:
    """Returns None: the model stage's settings are model.init's checkpoint and config.smoke's sampling, which only
    loading the model checks. The pipeline calls it before any stage runs (stages/pipeline.py check_stages)."""


def run(config, workdir: pathlib.Path) -> dict:
    """Loads the model, generates for one screenshot + instruction, writes workdir/model_smoke.json."""
    model, ckpt_dir = load_model(config, workdir)
    tokenizer = load_tokenizer(ckpt_dir)
    smoke = config.smoke
    proc = ImageProcessorConfig(min_pixels=smoke.min_pixels, max_pixels=smoke.max_pixels)
    pixels, grid = preprocess_images([synthetic_screenshot()], proc)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": smoke.instruction}]}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids, _ = encode_multimodal(tokenizer, text, grid, merge_size=proc.merge_size,
                               image_token_id=model.config.image_token_id)
    sampler = Sampler(model, pad_id=tokenizer.pad_token_id or 0)
    params = SamplingParams(max_new_tokens=smoke.max_new_tokens, temperature=smoke.temperature,
                            stop_token_ids=tuple(t for t in [tokenizer.eos_token_id] if t is not None))
    start = time.time()
    out = sampler.generate([ids.tolist()], params, pixel_values=pixels, image_grid_thw=grid, seed=config.seed)
    compile_and_run = time.time() - start
    start = time.time()
    out = sampler.generate([ids.tolist()], params, pixel_values=pixels, image_grid_thw=grid, seed=config.seed)
    run_s = time.time() - start
    n = int(out.lengths[0])
    completion = tokenizer.decode(out.tokens[0, :n])
    report = {
        "checkpoint": str(ckpt_dir),
        "parameters": num_params(nnx.state(model, nnx.Param)),
        "prompt_tokens": int(len(ids)),
        "image_grid_thw": grid.tolist(),
        "generated_tokens": n,
        "completion": completion,
        "mean_logprob": float(out.logprobs[0, :n].mean()),
        "first_call_seconds": round(compile_and_run, 2),
        "tokens_per_second": round(n / max(run_s, 1e-9), 1),
    }
    (workdir / "model_smoke.json").write_text(json.dumps(report, indent=2))
    logging.info("model smoke: %d prompt tokens + image %s -> %d tokens at %.1f tok/s", report["prompt_tokens"],
                 grid.tolist(), n, report["tokens_per_second"])
    print(f"[model] {ckpt_dir}: {report['parameters']:,} parameters")
    print(f"[model] prompt: {smoke.instruction!r} + screenshot {grid.tolist()}")
    print(f"[model] generation ({n} tokens, {report['tokens_per_second']} tok/s after compile): {completion!r}")
    return report

