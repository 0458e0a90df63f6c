"""HF checkpoints <-> NNX parameters: the key map, sliced sharded loading, and safetensors export.

Each of our parameters is described once by a `Mapping`: the HF key (with `{i}` for the layer of a
stacked parameter) and how the HF tensor is laid out relative to ours. Loading builds every array
with `jax.make_array_from_callback`, so each host reads only the slices its devices own.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from safetensors import safe_open
from safetensors.numpy import save_file

from rmsweb_jax.models import sharding
from rmsweb_jax.models.qwen3_vl.config import Qwen3VLConfig, RuntimeOptions
from rmsweb_jax.models.qwen3_vl.model import Qwen3VL, abstract_model, state_shardings

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "chat_template.jinja", "chat_template.json", "preprocessor_config.json",
                   "generation_config.json", "added_tokens.json")


@dataclasses.dataclass(frozen=True)
class Mapping:
    """How one of our parameters is stored in an HF checkpoint.

    kind: 'copy' (same layout), 'linear' (ours = W.T reshaped: [in, *out_split] from HF [out, in]),
    'linear_in' (ours = W.T reshaped: [*in_split, out] from HF [out, in]), 'reshape' (ours = W.reshape),
    'conv' (Conv3d [out, c, t, p, p] -> [c*t*p*p, out]).
    """
    key: str
    kind: str = "copy"
    stacked: bool = False


def key_map(config: Qwen3VLConfig) -> dict[str, Mapping]:
    """Returns {our parameter path: Mapping} for every parameter of the model."""
    t, v = "model.language_model.", "model.visual."
    lay, blk = t + "layers.{i}.", v + "blocks.{i}."
    m = {
        "text/embed": Mapping(t + "embed_tokens.weight"),
        "text/final_norm": Mapping(t + "norm.weight"),
        "text/input_norm": Mapping(lay + "input_layernorm.weight", stacked=True),
        "text/post_attention_norm": Mapping(lay + "post_attention_layernorm.weight", stacked=True),
        "text/q_kernel": Mapping(lay + "self_attn.q_proj.weight", "linear", True),
        "text/k_kernel": Mapping(lay + "self_attn.k_proj.weight", "linear", True),
        "text/v_kernel": Mapping(lay + "self_attn.v_proj.weight", "linear", True),
        "text/o_kernel": Mapping(lay + "self_attn.o_proj.weight", "linear_in", True),
        "text/q_norm": Mapping(lay + "self_attn.q_norm.weight", stacked=True),
        "text/k_norm": Mapping(lay + "self_attn.k_norm.weight", stacked=True),
        "text/gate_kernel": Mapping(lay + "mlp.gate_proj.weight", "linear", True),
        "text/up_kernel": Mapping(lay + "mlp.up_proj.weight", "linear", True),
        "text/down_kernel": Mapping(lay + "mlp.down_proj.weight", "linear", True),
        "visual/patch_kernel": Mapping(v + "patch_embed.proj.weight", "conv"),
        "visual/patch_bias": Mapping(v + "patch_embed.proj.bias"),
        "visual/pos_embed": Mapping(v + "pos_embed.weight"),
        "visual/norm1_scale": Mapping(blk + "norm1.weight", stacked=True),
        "visual/norm1_bias": Mapping(blk + "norm1.bias", stacked=True),
        "visual/norm2_scale": Mapping(blk + "norm2.weight", stacked=True),
        "visual/norm2_bias": Mapping(blk + "norm2.bias", stacked=True),
        "visual/qkv_kernel": Mapping(blk + "attn.qkv.weight", "linear", True),
        "visual/qkv_bias": Mapping(blk + "attn.qkv.bias", "reshape", True),
        "visual/proj_kernel": Mapping(blk + "attn.proj.weight", "linear_in", True),
        "visual/proj_bias": Mapping(blk + "attn.proj.bias", stacked=True),
        "visual/fc1_kernel": Mapping(blk + "mlp.linear_fc1.weight", "linear", True),
        "visual/fc1_bias": Mapping(blk + "mlp.linear_fc1.bias", stacked=True),
        "visual/fc2_kernel": Mapping(blk + "mlp.linear_fc2.weight", "linear", True),
        "visual/fc2_bias": Mapping(blk + "mlp.linear_fc2.bias", stacked=True),
    }
    mergers = {"visual/merger/": (v + "merger.", False)}
    if config.vision.deepstack_visual_indexes:
        mergers["visual/deepstack_mergers/"] = (v + "deepstack_merger_list.{i}.", True)
    for ours, (hf, stacked) in mergers.items():
        m[ours + "norm_scale"] = Mapping(hf + "norm.weight", stacked=stacked)
        m[ours + "norm_bias"] = Mapping(hf + "norm.bias", stacked=stacked)
        m[ours + "fc1_kernel"] = Mapping(hf + "linear_fc1.weight", "linear", stacked)
        m[ours + "fc1_bias"] = Mapping(hf + "linear_fc1.bias", stacked=stacked)
        m[ours + "fc2_kernel"] = Mapping(hf + "linear_fc2.weight", "linear", stacked)
        m[ours + "fc2_bias"] = Mapping(hf + "linear_fc2.bias", stacked=stacked)
    if not config.tie_word_embeddings:
        m["text/lm_head"] = Mapping("lm_head.weight", "linear")
    return m


def hf_shape(mapping: Mapping, ours: tuple[int, ...], config: Qwen3VLConfig) -> tuple[int, ...]:
    """Returns the HF tensor shape that maps onto one (per-layer) slice of ours of shape `ours`."""
    if mapping.kind == "copy":
        return ours
    if mapping.kind == "linear":
        return (int(np.prod(ours[1:])), ours[0])
    if mapping.kind == "linear_in":
        return (ours[-1], int(np.prod(ours[:-1])))
    if mapping.kind == "reshape":
        return (int(np.prod(ours)),)
    if mapping.kind == "conv":
        v = config.vision
        return (v.hidden_size, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)
    raise ValueError(f"unknown mapping kind {mapping.kind!r}")


def to_ours(mapping: Mapping, hf: np.ndarray, ours: tuple[int, ...]) -> np.ndarray:
    """Returns the HF tensor `hf` in our layout of shape `ours` (one layer)."""
    if mapping.kind in ("copy", "reshape"):
        return hf.reshape(ours)
    if mapping.kind in ("linear", "linear_in", "conv"):
        return hf.reshape(hf.shape[0], -1).T.reshape(ours)
    raise ValueError(f"unknown mapping kind {mapping.kind!r}")


def to_hf_layout(mapping: Mapping, ours: np.ndarray, hf: tuple[int, ...]) -> np.ndarray:
    """Returns our (one layer) array in the HF layout of shape `hf`."""
    if mapping.kind in ("copy", "reshape"):
        return ours.reshape(hf)
    flat_in = ours.shape[0] if mapping.kind in ("linear", "conv") else int(np.prod(ours.shape[:-1]))
    return np.ascontiguousarray(ours.reshape(flat_in, -1).T).reshape(hf)


# ---- reading -------------------------------------------------------------------------------------
class SafetensorsCheckpoint:
    """A checkpoint directory's safetensors files (single file or sharded with an index), read lazily."""

    def __init__(self, directory: str | os.PathLike):
        self.dir = pathlib.Path(directory)
        index = self.dir / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text()).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ValueError(f"{index}: missing 'weight_map'")
            files = sorted(set(weight_map.values()))
        else:
            files = sorted(p.name for p in self.dir.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"{self.dir}: no *.safetensors files and no model.safetensors.index.json")
            weight_map = None
        for name in files:
            if not (self.dir / name).is_file():
                raise FileNotFoundError(f"{self.dir}: shard file {name} listed in the index is missing")
        self._handles = {name: safe_open(str(self.dir / name), framework="numpy") for name in files}
        if weight_map is None:
            weight_map = {k: name for name, h in self._handles.items() for k in h.keys()}
        self.weight_map = weight_map

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._slice(key).get_shape())

    def read(self, key: str, index=None) -> np.ndarray:
        """Returns tensor `key` (optionally only `index`, a tuple of slices) as a numpy array."""
        sl = self._slice(key)
        return sl[index] if index is not None else sl[:]

    def _slice(self, key: str):
        if key not in self.weight_map:
            raise KeyError(f"{self.dir}: tensor {key!r} not found in the checkpoint")
        return self._handles[self.weight_map[key]].get_slice(key)


def from_hf(checkpoint_dir: str | os.PathLike, mesh=None, dtype=jnp.float32, *, runtime: RuntimeOptions | None = None,
            rules=sharding.DEFAULT_RULES) -> Qwen3VL:
    """Returns the model of an HF Qwen3-VL checkpoint directory, each array placed (and sharded) on load."""
    directory = pathlib.Path(checkpoint_dir)
    config = Qwen3VLConfig.from_json_file(directory / "config.json")
    dtype_name = jnp.dtype(dtype).name
    runtime = runtime or RuntimeOptions(param_dtype=dtype_name, compute_dtype=dtype_name)
    ckpt = SafetensorsCheckpoint(directory)
    graphdef, abstract_state = nnx.split(abstract_model(config, runtime, mesh=mesh, rules=rules))
    shardings = state_shardings(abstract_state, mesh, rules) if mesh is not None else None
    mappings = key_map(config)
    flat = dict(nnx.to_flat_state(abstract_state))
    loaded = {}
    for path, var in flat.items():
        name = "/".join(str(p) for p in path)
        mapping = mappings[name]
        target = jnp.dtype(var.dtype)
        shape = tuple(var.shape)
        _check_shapes(ckpt, mapping, shape, config, name)
        # Without a mesh, this process's first device (on several processes jax.devices()[0] may be another's).
        sh = (_leaf(shardings, path) if shardings is not None
              else jax.sharding.SingleDeviceSharding(jax.local_devices()[0]))
        loaded[path] = var.replace(jax.make_array_from_callback(
            shape, sh, lambda idx, m=mapping, s=shape, t=target: _read_block(ckpt, m, s, idx).astype(t)))
    state = nnx.from_flat_state(loaded)
    model = nnx.merge(graphdef, state)
    model.checkpoint_dir = str(directory)
    return model


def _leaf(tree, path):
    node = tree
    for p in path:
        node = node[p]
    return node


def _check_shapes(ckpt, mapping, shape, config, name):
    per_layer = shape[1:] if mapping.stacked else shape
    expected = hf_shape(mapping, per_layer, config)
    keys = [mapping.key.format(i=i) for i in range(shape[0])] if mapping.stacked else [mapping.key]
    for key in keys:
        got = ckpt.shape(key)
        if got != expected:
            raise ValueError(f"{ckpt.dir}: tensor {key!r} has shape {got}, expected {expected} (for our {name} "
                             f"of shape {shape})")


def _read_block(ckpt: SafetensorsCheckpoint, mapping: Mapping, shape, index) -> np.ndarray:
    """Returns our block `index` of the parameter, reading only the needed HF slices where possible."""
    index = tuple(index) + (slice(None),) * (len(shape) - len(index))
    if mapping.stacked:
        layers = range(*index[0].indices(shape[0]))
        return np.stack([_read_layer(ckpt, mapping, mapping.key.format(i=i), shape[1:], index[1:]) for i in layers])
    return _read_layer(ckpt, mapping, mapping.key, shape, index)


def _read_layer(ckpt, mapping, key, shape, index) -> np.ndarray:
    if mapping.kind == "copy":
        return ckpt.read(key, index)
    if mapping.kind == "linear" and all(_is_full(s, n) for s, n in zip(index[2:], shape[2:])):
        # ours[in, out0, *rest] = W.T: a slice of `in` is a column range; of out0, a contiguous row range.
        inner = int(np.prod(shape[2:])) if len(shape) > 2 else 1
        o0 = index[1].indices(shape[1]) if len(shape) > 1 else (0, 1, 1)
        rows = slice(o0[0] * inner, o0[1] * inner)
        block = ckpt.read(key, (rows, index[0]))
        out_shape = (block.shape[1],) + ((o0[1] - o0[0],) + tuple(shape[2:]) if len(shape) > 1 else ())
        return block.T.reshape(out_shape)
    layer = to_ours(mapping, ckpt.read(key), shape)
    return layer[index]


def _is_full(s: slice, n: int) -> bool:
    return s.indices(n) == (0, n, 1)


# ---- writing -------------------------------------------------------------------------------------
def to_hf(model: Qwen3VL, out_dir: str | os.PathLike, *, dtype=None, max_shard_bytes: int = 5 * 2 ** 30,
          tokenizer_dir: str | os.PathLike | None = None) -> pathlib.Path:
    """Writes config.json + safetensors (+ index when sharded, + tokenizer files if known); returns the dir.

    The directory is written to a temporary sibling and renamed at the end, so a crash never leaves a
    half-written checkpoint under `out_dir`. Only process 0 writes; all processes take part in gathers.
    The checkpoint gets the umask's permissions (not the temporary directory's 0700), so a serving
    container or a colleague can read it.
    """
    out_dir = pathlib.Path(out_dir)
    config = model.config
    mappings = key_map(config)
    state = nnx.state(model, nnx.Param)
    tensors: dict[str, np.ndarray] = {}
    for path, var in nnx.to_flat_state(state):
        name = "/".join(str(p) for p in path)
        mapping = mappings[name]
        arr = _gather(var[...])
        if dtype is not None:
            arr = arr.astype(jnp.dtype(dtype))
        layers = list(arr) if mapping.stacked else [arr]
        for i, layer in enumerate(layers):
            tensors[mapping.key.format(i=i)] = to_hf_layout(mapping, layer, hf_shape(mapping, layer.shape, config))
    if jax.process_index() != 0:
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=out_dir.name + ".tmp-", dir=out_dir.parent))
    try:
        _write_shards(tensors, tmp, max_shard_bytes)
        (tmp / "config.json").write_text(json.dumps(config.to_hf_dict(), indent=2))
        source = tokenizer_dir or getattr(model, "checkpoint_dir", None)
        if source:
            for fname in TOKENIZER_FILES:
                if (pathlib.Path(source) / fname).is_file():
                    shutil.copy2(pathlib.Path(source) / fname, tmp / fname)
        _apply_umask(tmp)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _apply_umask(folder: pathlib.Path) -> None:
    """Gives `folder` and its files the permissions a plain mkdir / open would (mkdtemp makes 0700, copy2
    keeps the source's mode)."""
    mask = _umask()
    folder.chmod(0o777 & ~mask)
    for path in folder.iterdir():
        path.chmod(0o666 & ~mask)


def _umask() -> int:
    """Returns the process umask without changing it (Linux reports it in /proc; elsewhere set and reset)."""
    try:
        for line in pathlib.Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _gather(x: jax.Array) -> np.ndarray:
    if not x.is_fully_addressable:
        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(jax.device_get(x))


def _write_shards(tensors: dict[str, np.ndarray], out: pathlib.Path, max_bytes: int) -> None:
    shards, current, size = [], {}, 0
    for key in sorted(tensors):
        nbytes = tensors[key].nbytes
        if current and size + nbytes > max_bytes:
            shards.append(current)
            current, size = {}, 0
        current[key] = tensors[key]
        size += nbytes
    shards.append(current)
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map = {}
    for n, shard in enumerate(shards, 1):
        name = f"model-{n:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in shard})
    total = int(sum(t.nbytes for t in tensors.values()))
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
