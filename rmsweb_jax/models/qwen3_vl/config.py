"""Qwen3-VL architecture configs: read from / written to HF `config.json`, plus presets.

The fields and defaults follow transformers' `Qwen3VLConfig` (`models/qwen3_vl/configuration_qwen3_vl.py`).
Runtime choices that are not part of the architecture (dtypes, remat, attention kernel) live in
`RuntimeOptions`, so a checkpoint's config round-trips untouched.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

from rmsweb_jax.errors import UserError
from rmsweb_jax.models.sharding import DECODE_SHARDINGS

SUPPORTED_MODEL_TYPES = ("qwen3_vl",)
REMAT_POLICIES = ("none", "full", "dots", "dots_with_no_batch_dims", "save_attention_out")
ATTENTION_IMPLS = ("auto", "xla", "splash", "cudnn")
DECODE_LAYOUTS = ("auto", "stacked", "per_layer")
GROUP_DECODES = ("cascade", "copy")


@dataclasses.dataclass(frozen=True)
class VisionConfig:
    depth: int = 27
    hidden_size: int = 1152
    hidden_act: str = "gelu_pytorch_tanh"
    intermediate_size: int = 4304
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 16
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    out_hidden_size: int = 4096
    num_position_embeddings: int = 2304
    deepstack_visual_indexes: tuple[int, ...] = (8, 16, 24)
    rope_theta: float = 10000.0
    initializer_range: float = 0.02

    def __post_init__(self):
        _require(self.hidden_size % self.num_heads == 0, "vision_config.hidden_size",
                 f"divisible by num_heads={self.num_heads}", self.hidden_size)
        side = int(round(self.num_position_embeddings ** 0.5))
        _require(side * side == self.num_position_embeddings, "vision_config.num_position_embeddings",
                 "a perfect square", self.num_position_embeddings)
        for i in self.deepstack_visual_indexes:
            _require(0 <= i < self.depth, "vision_config.deepstack_visual_indexes",
                     f"indexes in [0, depth={self.depth})", self.deepstack_visual_indexes)
        _require(self.hidden_act in ("gelu_pytorch_tanh",), "vision_config.hidden_act",
                 "'gelu_pytorch_tanh'", self.hidden_act)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def merged_hidden_size(self) -> int:
        return self.hidden_size * self.spatial_merge_size ** 2

    @property
    def num_grid_per_side(self) -> int:
        return int(round(self.num_position_embeddings ** 0.5))


@dataclasses.dataclass(frozen=True)
class TextConfig:
    vocab_size: int = 151936
    hidden_size: int = 4096
    intermediate_size: int = 12288
    num_hidden_layers: int = 36
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128
    hidden_act: str = "silu"
    max_position_embeddings: int = 262144
    rms_norm_eps: float = 1e-6
    rope_theta: float = 5_000_000.0
    mrope_section: tuple[int, int, int] = (24, 20, 20)
    attention_bias: bool = False
    initializer_range: float = 0.02
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None

    def __post_init__(self):
        _require(self.num_attention_heads % self.num_key_value_heads == 0, "text_config.num_key_value_heads",
                 f"a divisor of num_attention_heads={self.num_attention_heads}", self.num_key_value_heads)
        _require(sum(self.mrope_section) == self.head_dim // 2, "text_config.rope_scaling.mrope_section",
                 f"sections summing to head_dim/2={self.head_dim // 2}", self.mrope_section)
        _require(self.hidden_act == "silu", "text_config.hidden_act", "'silu'", self.hidden_act)
        _require(not self.attention_bias, "text_config.attention_bias", "false (Qwen3-VL has none)",
                 self.attention_bias)


@dataclasses.dataclass(frozen=True)
class Qwen3VLConfig:
    text: TextConfig = dataclasses.field(default_factory=TextConfig)
    vision: VisionConfig = dataclasses.field(default_factory=VisionConfig)
    image_token_id: int = 151655
    video_token_id: int = 151656
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653
    tie_word_embeddings: bool = False

    def __post_init__(self):
        _require(self.vision.out_hidden_size == self.text.hidden_size, "vision_config.out_hidden_size",
                 f"equal to text_config.hidden_size={self.text.hidden_size}", self.vision.out_hidden_size)
        _require(len(self.vision.deepstack_visual_indexes) <= self.text.num_hidden_layers,
                 "vision_config.deepstack_visual_indexes", "no more entries than text layers",
                 self.vision.deepstack_visual_indexes)

    # ---- HF config.json <-> dataclasses -------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], source: str = "config") -> "Qwen3VLConfig":
        """Returns the config described by an HF `config.json` dict (either rope form)."""
        model_type = d.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"{source}: unknown model_type {model_type!r}; expected one of {SUPPORTED_MODEL_TYPES}")
        for key in ("text_config", "vision_config"):
            if not isinstance(d.get(key), dict):
                raise ValueError(f"{source}: missing or malformed {key!r} (expected an object)")
        t, v = d["text_config"], d["vision_config"]
        rope = _rope_fields(t, source)
        text = TextConfig(**_known(TextConfig, t, drop=("rope_theta", "mrope_section")), **rope)
        vis_rope = v.get("rope_parameters") or {}
        vision_kw = _known(VisionConfig, v, drop=("rope_theta",))
        if "deepstack_visual_indexes" in vision_kw:
            vision_kw["deepstack_visual_indexes"] = tuple(vision_kw["deepstack_visual_indexes"])
        vision = VisionConfig(**vision_kw, rope_theta=float(vis_rope.get("rope_theta", 10000.0)))
        top = _known(cls, d, drop=("text", "vision"))
        # Transformers stores tie_word_embeddings at the top level; older dumps also in text_config.
        top.setdefault("tie_word_embeddings", bool(t.get("tie_word_embeddings", False)))
        return cls(text=text, vision=vision, **top)

    def to_hf_dict(self) -> dict[str, Any]:
        """Returns the `config.json` dict transformers' `Qwen3VLConfig` reads (published rope form)."""
        t = dataclasses.asdict(self.text)
        t.pop("mrope_section")
        t.update(model_type="qwen3_vl_text", rope_theta=self.text.rope_theta,
                 rope_scaling={"rope_type": "default", "mrope_section": list(self.text.mrope_section),
                               "mrope_interleaved": True},
                 tie_word_embeddings=self.tie_word_embeddings)
        v = dataclasses.asdict(self.vision)
        v.pop("rope_theta")
        v.update(model_type="qwen3_vl_vision", deepstack_visual_indexes=list(self.vision.deepstack_visual_indexes))
        return {
            "architectures": ["Qwen3VLForConditionalGeneration"],
            "model_type": "qwen3_vl",
            "text_config": t,
            "vision_config": v,
            "image_token_id": self.image_token_id,
            "video_token_id": self.video_token_id,
            "vision_start_token_id": self.vision_start_token_id,
            "vision_end_token_id": self.vision_end_token_id,
            "tie_word_embeddings": self.tie_word_embeddings,
        }

    @classmethod
    def from_json_file(cls, path: str | pathlib.Path) -> "Qwen3VLConfig":
        """Returns the config read from a `config.json` file."""
        path = pathlib.Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no config.json at {path}")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from e
        return cls.from_hf_dict(data, source=str(path))


@dataclasses.dataclass(frozen=True)
class RuntimeOptions:
    """How to run the architecture: dtypes, remat, attention kernel, sharding."""
    param_dtype: str = "float32"
    compute_dtype: str = "float32"
    remat_policy: str = "none"
    attention_impl: str = "auto"
    # False: a Python loop over the layers (MaxText's scan_layers). Compile time then grows with depth,
    # but no stacked residual buffers are zero-filled and written per step: 6-11% off the CPU bench's
    # 4-layer train step. Keep True for deep models.
    scan_layers: bool = True
    # How the sampler's decode steps read the text weights (see models/qwen3_vl/decode.py): "per_layer"
    # has the Sampler copy them into per-layer [out, in] matrices (2-3x faster steps on CPU, a second
    # copy of the text weights); "stacked" reads the training layout; "auto": per_layer on one CPU
    # device when the copy is at most 2 GiB, stacked elsewhere.
    decode_layout: str = "auto"
    # How the sampler lays the text weights over a mesh for its decode steps (models/sharding.py decode_rules):
    # "training" reads the training layout (FSDP weights all-gathered on every generated token); "tensor" and
    # "replicated" use a copy made once per set of weights; "auto": the cheaper decode step of the two
    # (models/sharding.py decode_costs; replicated only when its copy fits a quarter of a device's memory), training
    # without a multi-device mesh or, for tensor, without an FSDP axis (the weights already lie so).
    decode_sharding: str = "auto"
    # How the sampler decodes G samples of one prompt (Sampler.generate_groups): "cascade" keeps one copy of the
    # prompt's KV cache that the G rows read together, plus each row's own cache (models/attention.py); "copy"
    # copies the prompt's cache to the G rows (G reads of it per step; kept for the bench's comparison).
    group_decode: str = "cascade"
    # How many times the decode loop may halve its rows as they finish (sampling/sampler.py `_generate`): the
    # finished rows are dropped and the live ones go on in a bucket half the size, so a batch of short tool calls
    # with a few long rows stops paying for the short ones. Rows sharing a prompt's cache ("cascade") halve within
    # their group. 0: never (every row decodes until all are done). Single-device programs only: on a mesh the
    # rows keep their places (a compaction would move KV caches between devices).
    decode_compaction: int = 2
    # The most patches one image (one frame) given to the vision tower may have: its attention then runs
    # over the band of this many patches around each patch, exact and linear in the number of images
    # (models/attention.py). 0: over the whole microbatch, quadratic. A larger image is refused on the host
    # (model.check_vision_window).
    vision_window: int = 0

    def __post_init__(self):
        _require(not isinstance(self.vision_window, bool) and isinstance(self.vision_window, int)
                 and self.vision_window >= 0, "vision_window", "an int >= 0 (0: no window)", self.vision_window)
        _require(isinstance(self.scan_layers, bool), "scan_layers", "True or False", self.scan_layers)
        _require(self.decode_layout in DECODE_LAYOUTS, "decode_layout", f"one of {DECODE_LAYOUTS}",
                 self.decode_layout)
        _require(self.decode_sharding in DECODE_SHARDINGS, "decode_sharding", f"one of {DECODE_SHARDINGS}",
                 self.decode_sharding)
        _require(not isinstance(self.decode_compaction, bool) and isinstance(self.decode_compaction, int)
                 and self.decode_compaction >= 0, "decode_compaction", "an int >= 0 (0: never)",
                 self.decode_compaction)
        _require(self.group_decode in GROUP_DECODES, "group_decode", f"one of {GROUP_DECODES}", self.group_decode)
        _require(self.remat_policy in REMAT_POLICIES, "remat_policy", f"one of {REMAT_POLICIES}", self.remat_policy)
        _require(self.attention_impl in ATTENTION_IMPLS, "attention_impl", f"one of {ATTENTION_IMPLS}",
                 self.attention_impl)
        for name in ("param_dtype", "compute_dtype"):
            _require(getattr(self, name) in ("float32", "bfloat16", "float16"), name,
                     "'float32', 'bfloat16' or 'float16'", getattr(self, name))


# ---- presets ---------------------------------------------------------------------------------
def preset(name: str) -> Qwen3VLConfig:
    """Returns a named preset: '8b', '32b' (the published Instruct configs), 'tiny' (tests) or 'demo'
    (the demo's policy trained from scratch, byte-level vocabulary)."""
    presets = {"8b": _qwen3_vl_8b, "32b": _qwen3_vl_32b, "tiny": tiny, "demo": demo}
    if name not in presets:
        raise ValueError(f"unknown preset {name!r}; expected one of {sorted(presets)}")
    return presets[name]()


def _qwen3_vl_8b() -> Qwen3VLConfig:
    return Qwen3VLConfig(
        text=TextConfig(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                        num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                        bos_token_id=151643, eos_token_id=151645),
        vision=VisionConfig(out_hidden_size=4096))


def _qwen3_vl_32b() -> Qwen3VLConfig:
    return Qwen3VLConfig(
        text=TextConfig(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64,
                        num_attention_heads=64, num_key_value_heads=8, head_dim=128,
                        bos_token_id=151643, eos_token_id=151645),
        vision=VisionConfig(out_hidden_size=5120))


def tiny(*, vocab_size: int = 512, tie_word_embeddings: bool = False, head_dim: int = 16,
         num_attention_heads: int = 4, num_key_value_heads: int = 2, hidden_size: int = 64,
         num_hidden_layers: int = 3, deepstack_visual_indexes: tuple[int, ...] = (0, 1),
         image_token_id: int = 5, video_token_id: int = 6, vision_start_token_id: int = 3,
         vision_end_token_id: int = 4) -> Qwen3VLConfig:
    """Returns a small random-init-friendly config for tests (every code path, seconds to run)."""
    return Qwen3VLConfig(
        text=TextConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size + 16,
                        num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
                        num_key_value_heads=num_key_value_heads, head_dim=head_dim,
                        mrope_section=_mrope_section(head_dim), rope_theta=10000.0,
                        max_position_embeddings=4096),
        vision=VisionConfig(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=hidden_size,
                            num_position_embeddings=64, deepstack_visual_indexes=deepstack_visual_indexes),
        image_token_id=image_token_id, video_token_id=video_token_id,
        vision_start_token_id=vision_start_token_id, vision_end_token_id=vision_end_token_id,
        tie_word_embeddings=tie_word_embeddings)


# The demo's shape, chosen by train-step tokens/s on the 2-core CPU (README's demo section): hidden 64,
# 4 layers, 4 query / 2 KV heads of 16; a one-block vision tower (the demo's prompts are text).
DEMO_SHAPE = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  rope_theta=10000.0)


def demo(*, vocab_size: int = 768, image_token_id: int = 751, video_token_id: int = 752,
         vision_start_token_id: int = 749, vision_end_token_id: int = 750, **shape) -> Qwen3VLConfig:
    """Returns the demo preset: Qwen3-VL's architecture sized for minutes of CPU training. The default
    vocabulary and token ids are the agent BPE's (processing/agent_bpe.py: 755 ids, padded to 768);
    with the byte-level tokenizer (265 ids) pass vocab_size=272 and its ids. `shape` overrides
    DEMO_SHAPE's keys."""
    unknown = sorted(set(shape) - set(DEMO_SHAPE))
    if unknown:
        raise ValueError(f"demo preset: unknown shape key(s) {unknown}; expected some of {sorted(DEMO_SHAPE)}")
    s = {**DEMO_SHAPE, **shape}
    d, head_dim = s["hidden_size"], s["head_dim"]
    return Qwen3VLConfig(
        text=TextConfig(vocab_size=vocab_size, hidden_size=d, intermediate_size=3 * d,
                        num_hidden_layers=s["num_hidden_layers"], num_attention_heads=s["num_attention_heads"],
                        num_key_value_heads=s["num_key_value_heads"], head_dim=head_dim,
                        mrope_section=_mrope_section(head_dim), rope_theta=float(s["rope_theta"]),
                        max_position_embeddings=8192),
        vision=VisionConfig(depth=1, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=d,
                            num_position_embeddings=64, deepstack_visual_indexes=(0,)),
        image_token_id=image_token_id, video_token_id=video_token_id,
        vision_start_token_id=vision_start_token_id, vision_end_token_id=vision_end_token_id,
        tie_word_embeddings=True)


def _mrope_section(head_dim: int) -> tuple[int, int, int]:
    half = head_dim // 2
    hw = (half * 20) // 64
    return (half - 2 * hw, hw, hw)


# ---- helpers ---------------------------------------------------------------------------------
def _require(ok: bool, key: str, expected: str, got: Any) -> None:
    if not ok:
        raise UserError(f"config key {key}: expected {expected}, got {got!r}")


def _known(cls, d: dict[str, Any], drop: tuple[str, ...] = ()) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)} - set(drop)
    out = {k: d[k] for k in names if k in d and (d[k] is not None or k.endswith("token_id"))}
    # HF uses a list for eos_token_id sometimes; keep the first (the chat stop token is handled by the sampler).
    if isinstance(out.get("eos_token_id"), list):
        out["eos_token_id"] = out["eos_token_id"][0] if out["eos_token_id"] else None
    return out


def _rope_fields(t: dict[str, Any], source: str) -> dict[str, Any]:
    """Returns rope_theta and mrope_section from either `rope_parameters` or `rope_theta`+`rope_scaling`."""
    params = t.get("rope_parameters") or {}
    scaling = t.get("rope_scaling") or {}
    theta = params.get("rope_theta", t.get("rope_theta"))
    if theta is None:
        raise ValueError(f"{source}: text_config has neither rope_parameters.rope_theta nor rope_theta")
    rope_type = params.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    if rope_type not in ("default", "mrope"):
        raise ValueError(f"{source}: text_config rope_type {rope_type!r} is not supported (expected 'default')")
    section = params.get("mrope_section", scaling.get("mrope_section", (24, 20, 20)))
    return {"rope_theta": float(theta), "mrope_section": tuple(int(s) for s in section)}
