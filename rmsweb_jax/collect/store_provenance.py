"""What a store's steps were produced with: the prompt settings, tokenizer and image preprocessing.

SFT rebuilds each stored step's prompt (PromptBuilder over the stored observation and history)
and tokenizes it. Rebuilt with other prompt settings, another tokenizer (vocabulary, special
tokens, chat template) or other image preprocessing than the collecting policy saw, the model
learns from prompts it was never sampled with, and nothing fails. So StoreWriter records
`provenance(...)` in store.json when it creates a store, and the SFT pipeline compares its own
with `check_provenance`, which logs a warning naming the keys that differ.

The prompt settings are stored as they are (PromptConfig's fields); tokenizer and image processor
as sha256 hashes of their canonical JSON (first 16 hex digits), so store.json stays small. None
means unknown — the scripted teacher reads no prompt, an HTTP endpoint's tokenizer is not ours to
see — and is never compared.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any

from absl import logging

from rmsweb_jax.collect.store_layout import pull_store, read_meta


KEYS = ("prompt", "tokenizer", "image_processor")


def provenance(prompt_config=None, tokenizer=None, image_config=None) -> dict[str, Any]:
    """Returns {"prompt": PromptConfig fields, "tokenizer": hash, "image_processor": hash}, None for
    what is not given."""
    return {"prompt": dataclasses.asdict(prompt_config) if prompt_config is not None else None,
            "tokenizer": tokenizer_hash(tokenizer) if tokenizer is not None else None,
            "image_processor": _digest(dataclasses.asdict(image_config)) if image_config is not None else None}


def policy_provenance(policy) -> dict[str, Any]:
    """Returns the provenance of a policy's steps: its prompt builder's settings (FlaxPolicy,
    HttpPolicy) and, for an in-process model (FlaxPolicy), its tokenizer and image config."""
    builder = getattr(policy, "prompt_builder", None)
    chat_model = getattr(policy, "chat_model", None)
    return provenance(builder.config if builder is not None else None,
                      chat_model.tokenizer if chat_model is not None else None,
                      chat_model.image_config if chat_model is not None else None)


def tokenizer_hash(tokenizer) -> str:
    """Returns the identity of a transformers tokenizer: a hash of its vocabulary (added tokens
    included), special tokens and chat template."""
    return _digest({"vocab": sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]),
                    "special": sorted(tokenizer.all_special_tokens),
                    "chat_template": getattr(tokenizer, "chat_template", None)})


def differing_keys(stored: dict[str, Any] | None, expected: dict[str, Any] | None) -> list[str]:
    """Returns the keys ("tokenizer", "prompt.history_steps", ...) where both sides are known and differ."""
    keys = []
    for key in KEYS:
        a, b = (stored or {}).get(key), (expected or {}).get(key)
        if a is None or b is None:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            keys += [f"{key}.{k}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        elif a != b:
            keys.append(key)
    return keys


def warn_if_differs(directory: str | os.PathLike, stored: dict[str, Any] | None,
                    expected: dict[str, Any]) -> list[str]:
    """Returns differing_keys(stored, expected), logging a warning naming them and both values."""
    keys = differing_keys(stored, expected)
    if keys:
        logging.warning("trajectory store %s: its steps were produced with other settings than its prompts are "
                        "rebuilt with (%s): stored %s, now %s", directory, ", ".join(keys),
                        {k: _lookup(stored, k) for k in keys}, {k: _lookup(expected, k) for k in keys})
    return keys


def check_provenance(store_dir: str | os.PathLike, expected: dict[str, Any]) -> list[str]:
    """Returns the keys where `expected` differs from the provenance recorded in the store at
    `store_dir` (a warning names them); [] when they agree or nothing was recorded."""
    local = pull_store(store_dir)  # a gs:// store's local mirror; a local one as it is
    return warn_if_differs(store_dir, read_meta(local).get("provenance"), expected)


def _lookup(d: dict[str, Any] | None, dotted: str) -> Any:
    for part in dotted.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]
