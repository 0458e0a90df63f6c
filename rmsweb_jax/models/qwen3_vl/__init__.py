"""Qwen3-VL in Flax NNX: `from_hf`, `to_hf`, `create`, and the config presets."""
from rmsweb_jax.models.qwen3_vl.config import (Qwen3VLConfig, RuntimeOptions, TextConfig, VisionConfig,
                                               preset, tiny)
from rmsweb_jax.models.qwen3_vl.model import (ModelInputs, ModelOutput, Qwen3VL, VisionInputs, abstract_model,
                                              create, parameter_count, prepare_inputs)
from rmsweb_jax.models.qwen3_vl.text import KVCache
from rmsweb_jax.models.qwen3_vl.params import from_hf, to_hf
