"""The policy model a stage starts from, as config.model.init says: an HF checkpoint or a random preset.

Beside `models/` on the lowest layer, not inside it: a random preset is written to disk with a tokenizer
(`processing/`) first, so that the demo loads through the same `from_hf` path as a real checkpoint, and
models/ never imports processing/ (.importlinter). The trainer (train/), the sampler (sampling/) and the
stages all load their model here."""
from __future__ import annotations

import functools
import pathlib

import jax
import jax.numpy as jnp
from absl import logging

from rmsweb_jax import storage
from rmsweb_jax.errors import UserError
from rmsweb_jax.models import qwen3_vl
from rmsweb_jax.models.qwen3_vl.config import demo, tiny
from rmsweb_jax.models.from_config import mesh_from_config, rules_from_config, runtime_from_config
from rmsweb_jax.processing.agent_bpe import build_agent_bpe_tokenizer
from rmsweb_jax.processing.byte_tokenizer import build_byte_tokenizer
from rmsweb_jax.processing.tiny_tokenizer import build_tiny_tokenizer

# Random presets a stage can start from, each with the tokenizer written beside its weights: 'tiny'
# (tests: the tiny BPE), 'demo' (the demo's policy trained from scratch: the agent BPE, ~2.5x shorter
# prompts than bytes), 'demo_bytes' (the same model over one token per byte) and 'demo_coords' (the agent
# BPE with one token per coordinate value 0..1000, a grounding lever tried and not adopted: bench/README.md).
RANDOM_PRESETS = {"tiny": (tiny, build_tiny_tokenizer), "demo": (demo, build_agent_bpe_tokenizer),
                  "demo_bytes": (functools.partial(demo, vocab_size=272), build_byte_tokenizer),
                  "demo_coords": (functools.partial(demo, vocab_size=1792),
                                  functools.partial(build_agent_bpe_tokenizer, coordinate_tokens=True)),
                  # The base policy's shape (configs/base.py): head dim 64 leaves 32 rotary pairs per head to match a
                  # name across a 500-token element list; one token per coordinate value, so a point is copied whole.
                  "base": (functools.partial(demo, vocab_size=1792, hidden_size=192, num_hidden_layers=4,
                                             num_attention_heads=3, num_key_value_heads=3, head_dim=64),
                           functools.partial(build_agent_bpe_tokenizer, coordinate_tokens=True))}


def load_model(config, workdir: pathlib.Path, *, devices=None) -> tuple[qwen3_vl.Qwen3VL, pathlib.Path]:
    """Returns (model, checkpoint dir) for `config.model.init`: 'hf:/path' or 'random:<preset>'.

    'random:tiny' / 'random:demo' write a random checkpoint with its tokenizer (RANDOM_PRESETS) into
    the workdir first and then load it through `from_hf`, so the demo exercises the same loading path
    as a real checkpoint (and every checkpoint trained from it carries the same tokenizer); on several
    processes process 0 writes it while the others wait. `devices` (default: the global mesh's) are the
    devices the model is placed on, e.g. jax.local_devices() for a policy each host samples alone.
    """
    init = config.model.init
    mesh, rules = mesh_from_config(config, devices), rules_from_config(config)
    runtime = runtime_from_config(config.model)
    if init.startswith("hf:"):
        # A checkpoint on a bucket is read from its local mirror (safetensors and tokenizers read local files).
        path = storage.pull_tree(storage.user_path(init[3:]))
        if not (path / "config.json").is_file():
            raise UserError(f"model checkpoint {init!r}: {path} holds no config.json; expected an HF Qwen3-VL "
                            "checkpoint folder (config.json, *.safetensors, tokenizer files) or 'random:tiny'")
        logging.info("loading HF checkpoint %s", path)
        return qwen3_vl.from_hf(path, mesh=mesh, runtime=runtime, rules=rules), path
    if init.startswith("random:"):
        path = _random_checkpoint(init[len("random:"):], storage.as_path(workdir), config.seed)
        return qwen3_vl.from_hf(path, mesh=mesh, runtime=runtime, rules=rules), path
    raise UserError(f"config.model.init = {init!r}: expected 'hf:/path/to/checkpoint' or 'random:<preset>'")


def _random_checkpoint(name: str, workdir, seed: int) -> pathlib.Path:
    """Returns the local folder of random preset `name`'s checkpoint in the workdir, written when absent.

    On several processes every one loads it at once: process 0 writes it, the others wait at a barrier and
    then read it (a host that does not share the workdir finds none and writes its own: the same seed gives
    the same weights). Writing concurrently would let one process read another's half-written files."""
    folder = workdir / "checkpoints" / f"random_{name}"
    first = jax.process_index() == 0
    if first:
        path = _ensure_random_checkpoint(name, folder, seed)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(f"random checkpoint {folder}")
        if not first:
            path = _ensure_random_checkpoint(name, folder, seed)
    return path


def _ensure_random_checkpoint(name: str, path, seed: int) -> pathlib.Path:
    local = storage.pull_tree(path)  # on a bucket: written and read in the local mirror, kept on the bucket
    if not (local / "config.json").is_file():
        _write_random_checkpoint(name, local, seed)
        storage.push_folder(local, path, last="config.json")  # config.json, the file looked for, last
    return local


def _write_random_checkpoint(name: str, path: pathlib.Path, seed: int) -> None:
    if name not in RANDOM_PRESETS:
        raise UserError(f"random init writes a checkpoint to disk; the presets are {sorted(RANDOM_PRESETS)} "
                         f"('random:tiny', 'random:demo'), got {name!r} (for 8B/32B use hf:/path)")
    make_config, build_tokenizer = RANDOM_PRESETS[name]
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(path.name + ".tokenizer")
    ids = build_tokenizer(staging)
    config = make_config(image_token_id=ids["image_token_id"], video_token_id=ids["video_token_id"],
                         vision_start_token_id=ids["vision_start_token_id"],
                         vision_end_token_id=ids["vision_end_token_id"])
    if config.text.vocab_size < ids["vocab_size"]:
        raise UserError(f"random:{name}: the preset's vocab_size {config.text.vocab_size} is smaller than its "
                        f"tokenizer's {ids['vocab_size']} ids")
    model = qwen3_vl.create(config, seed=seed)
    qwen3_vl.to_hf(model, path, tokenizer_dir=staging, dtype=jnp.float32)
    logging.info("wrote a random %s checkpoint (with its tokenizer) to %s", name, path)
