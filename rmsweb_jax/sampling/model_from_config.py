"""The policy model a stage starts from, as the config says: an HF checkpoint or a random preset.

Above `models/`: a random preset is written to disk with a tokenizer (`processing/`) first, so that
the demo loads through the same `from_hf` path as a real checkpoint."""
from __future__ import annotations

import pathlib

import jax.numpy as jnp
from absl import logging

from rmsweb_jax.errors import UserError
from rmsweb_jax.models import qwen3_vl
from rmsweb_jax.models.from_config import mesh_from_config, rules_from_config, runtime_from_config
from rmsweb_jax.processing.tiny_tokenizer import build_tiny_tokenizer


def load_model(config, workdir: pathlib.Path) -> tuple[qwen3_vl.Qwen3VL, pathlib.Path]:
    """Returns (model, checkpoint dir) for `config.model.init`: 'hf:/path' or 'random:<preset>'.

    'random:tiny' writes a random checkpoint with the tiny tokenizer into the workdir first and then
    loads it through `from_hf`, so the demo exercises the same loading path as a real checkpoint.
    """
    init = config.model.init
    mesh, rules = mesh_from_config(config), rules_from_config(config)
    runtime = runtime_from_config(config.model)
    if init.startswith("hf:"):
        path = pathlib.Path(init[3:]).expanduser()
        if not (path / "config.json").is_file():
            raise UserError(f"model checkpoint {init!r}: {path} holds no config.json; expected an HF Qwen3-VL "
                            "checkpoint folder (config.json, *.safetensors, tokenizer files) or 'random:tiny'")
        logging.info("loading HF checkpoint %s", path)
        return qwen3_vl.from_hf(path, mesh=mesh, runtime=runtime, rules=rules), path
    if init.startswith("random:"):
        name = init[len("random:"):]
        path = workdir / "checkpoints" / f"random_{name}"
        if not (path / "config.json").is_file():
            _write_random_checkpoint(name, path, config.seed)
        return qwen3_vl.from_hf(path, mesh=mesh, runtime=runtime, rules=rules), path
    raise UserError(f"config.model.init = {init!r}: expected 'hf:/path/to/checkpoint' or 'random:<preset>'")


def _write_random_checkpoint(name: str, path: pathlib.Path, seed: int) -> None:
    if name != "tiny":
        raise UserError(f"random init writes a checkpoint to disk; only 'random:tiny' is supported, got {name!r} "
                         "(for 8B/32B use hf:/path)")
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(path.name + ".tokenizer")
    ids = build_tiny_tokenizer(staging)
    config = qwen3_vl.tiny(image_token_id=ids["image_token_id"], video_token_id=ids["video_token_id"],
                           vision_start_token_id=ids["vision_start_token_id"],
                           vision_end_token_id=ids["vision_end_token_id"])
    model = qwen3_vl.create(config, seed=seed)
    qwen3_vl.to_hf(model, path, tokenizer_dir=staging, dtype=jnp.float32)
    logging.info("wrote a random tiny checkpoint (with the tiny tokenizer) to %s", path)
