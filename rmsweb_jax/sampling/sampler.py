"""Batched sampling from Qwen3-VL: one prefill, then a `lax.while_loop` decode over a static KV cache.

Prompts are left-padded to a length bucket and the cache holds bucket + max_new_tokens slots, so a
(batch, prompt bucket, max_new_tokens, patch bucket) combination compiles once. Vision runs only in
the prefill; `generate_groups` draws G samples per prompt from one prefill. Its G rows decode over one copy of
the prompt's KV cache, read once per group per step, plus each row's own cache (cascade attention,
models/attention.py); RuntimeOptions.group_decode = "copy" copies the prompt's cache to the G rows instead.
Rows that finish stop costing: the decode loop halves its rows as they finish (RuntimeOptions.decode_compaction).
Every sampled token comes with its log-probability under the temperature-scaled model distribution
(before top-k / top-p truncation), which is what the RL losses need.
"""
from __future__ import annotations

import functools
import math
import time
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from rmsweb_jax.models import sharding
from rmsweb_jax.models.qwen3_vl import decode
from rmsweb_jax.models.qwen3_vl.model import ModelInputs, Qwen3VL, abstract_model, prepare_inputs, state_shardings
from rmsweb_jax.models.qwen3_vl.text import KVCache
from rmsweb_jax.models.qwen3_vl.layers import DTYPES
from rmsweb_jax.sampling.params import SamplingParams  # noqa: F401 — re-exported beside the sampler that reads it

DECODE_LOOP_SCOPE = "decode_loop"
DEFAULT_LENGTH_BUCKETS = (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


class SampleOutput(NamedTuple):
    tokens: np.ndarray     # [B, N] int32; after a stop token, pad_id
    logprobs: np.ndarray   # [B, N] f32; 0 after the stop
    lengths: np.ndarray    # [B] int32: generated tokens, the stop token included
    finished: np.ndarray   # [B] bool: a stop token was produced
    row_steps: np.ndarray  # [] int32: rows x steps the decode loop ran, over its phases (what decoding cost)


class Sampler:
    """Generates continuations for batches of (optionally multimodal) prompts with one model."""

    def __init__(self, model: Qwen3VL, *, pad_id: int = 0, length_buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS,
                 patch_bucket: int = 1024, device_bytes: int | None = None, abstract: bool = False):
        """`device_bytes`: one device's memory, for the "auto" decode sharding (default: what the device
        reports, where it does). `abstract`: the model holds ShapeDtypeStructs (only `abstract_program` works).

        "auto" on a multi-device mesh is resolved at the first call (`decode_sharding` is None until then): its
        cost depends on the call's rows and KV slots (models/sharding.py decode_costs), and one decode copy then
        serves every later call."""
        self.model, self.pad_id = model, pad_id
        self.length_buckets = tuple(sorted(length_buckets))
        self.patch_bucket = patch_bucket
        self._per_layer = decode.use_per_layer(model)
        self._step_weights, self._step_source = None, ()
        mesh = model.mesh
        if device_bytes is None and not abstract:
            device_bytes = _device_bytes(mesh)
        self._device_bytes = device_bytes
        self.decode_sharding: str | None = None
        self.decode_costs: dict[str, sharding.DecodeCost] = {}  # what "auto" compared, when it did
        self._decode: _DecodeCopy | None = None
        if model.runtime.decode_sharding != "auto" or mesh is None or mesh.size == 1:
            self._set_decode_sharding(None)
        self._decode_text, self._decode_source = None, ()
        self.resync_seconds: float | None = None  # the last remake of the decode copy (per set of weights)
        if not abstract:
            self.refresh()

    def _set_decode_sharding(self, work: sharding.DecodeWork | None) -> None:
        """Resolves the decode layout (priced on `work`, the first call's step) and makes its copy's program."""
        model, mesh = self.model, self.model.mesh
        chip = None if mesh is None else sharding.chip_of(mesh.devices.flat[0].device_kind)
        self.decode_sharding = sharding.pick_decode_sharding(
            model.runtime.decode_sharding, mesh, decode.copy_bytes(model.text), self._device_bytes, work=work,
            chip=chip)
        if work is not None:
            self.decode_costs = sharding.decode_costs(mesh, work, sharding.BANDWIDTHS.get(chip,
                                                                                       sharding.DEFAULT_BANDWIDTH))
        self._decode = None if self.decode_sharding == "training" else _DecodeCopy(model, self.decode_sharding)

    def _resolve(self, rows: int, prompt_slots: int, max_new: int, group: int) -> None:
        """Resolves "auto" on the first call: `rows` decode rows (prompts x `group`) over `prompt_slots` + `max_new`."""
        if self.decode_sharding is None:
            runtime = self.model.runtime
            cascade = group > 1 and runtime.group_decode == "cascade"
            self._set_decode_sharding(sharding.DecodeWork.of(
                self.model.config.text, jnp.dtype(DTYPES[runtime.compute_dtype]).itemsize, rows, prompt_slots,
                max_new, group, cascade))

    def refresh(self) -> None:
        """Re-reads the model's parameters (call after a training update)."""
        self._graphdef, self._state = nnx.split(self.model)

    def _decode_weights(self) -> decode.StepWeights | None:
        """Returns the per-layer decode copy of the text weights (None on the stacked layout).

        The copy is remade when any text parameter array is no longer the one it was made from, so
        decode steps never run on older weights than the prefill (which reads the model's own).
        """
        if not self._per_layer:
            return None
        source = jax.tree.leaves(nnx.state(self.model.text, nnx.Param))
        if _changed(source, self._step_source):
            self._step_weights = _step_weights(self._graphdef, self._state)
            self._step_source = source
        return self._step_weights

    def _decode_text_state(self):
        """Returns the text weights in the decode layout (None: decode reads the training layout), remade,
        and timed in `resync_seconds`, whenever a text parameter array changed (as `_decode_weights`)."""
        if self._decode is None:
            return None
        source = jax.tree.leaves(nnx.state(self.model.text, nnx.Param))
        if _changed(source, self._decode_source):
            start = time.perf_counter()
            self._decode_text = jax.block_until_ready(self._decode.copy(nnx.state(self.model.text, nnx.Param)))
            self.resync_seconds = time.perf_counter() - start
            self._decode_source = source
        return self._decode_text

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams = SamplingParams(), *,
                 pixel_values: np.ndarray | None = None, image_grid_thw: np.ndarray | None = None,
                 seed: int = 0) -> SampleOutput:
        """Returns sampled continuations of `prompts` (lists of token ids; images in prompt order)."""
        args = self._program_args(prompts, 1, params, pixel_values, image_grid_thw, seed)
        return SampleOutput(*(_host(x) for x in _generate(*args)))

    def generate_groups(self, prompts: Sequence[Sequence[int]], group_size: int,
                        params: SamplingParams = SamplingParams(), *, pixel_values: np.ndarray | None = None,
                        image_grid_thw: np.ndarray | None = None, seed: int = 0) -> SampleOutput:
        """Returns `group_size` continuations of every prompt, rows prompt-major ([p0 s0..s(G-1), p1 s0, ...]).

        Each prompt, its images included, is prefilled once; its last hidden state is repeated to G rows and
        all P*G rows decode in one loop, attending to the prompt's one KV cache and their own (group_decode
        "cascade"; "copy" repeats the prompt's cache to the G rows). The result equals `generate` on the list
        with each prompt repeated G times in a row (its images repeated per copy) and the same seed: the
        random keys are split exactly as there (one key per step, folded with each row's place: row_keys; the
        first token drawn from the prefill's last logits) and every array from the last hidden state on has the
        repeated list's shape (until rows finish: model.decode_compaction then drops finished rows, in both).
        Tokens agree; log-probs agree to about one float32 ulp (measured <= 2e-6): the prefill's GEMMs on P rows
        sum in another order than on P*G rows. One program compiles per
        (P, G, prompt bucket, max_new_tokens, patch bucket).
        """
        return SampleOutput(*(_host(x) for x in _generate(
            *self._program_args(prompts, group_size, params, pixel_values, image_grid_thw, seed))))

    def program(self, prompts: Sequence[Sequence[int]], group_size: int, params: SamplingParams = SamplingParams(),
                *, pixel_values: np.ndarray | None = None, image_grid_thw: np.ndarray | None = None,
                seed: int = 0) -> jax.stages.Traced:
        """Returns the traced (not compiled) program `generate_groups` runs for these inputs: its jaxpr
        shows which shapes the prefill and the vision tower run at; `.lower().compile()` compiles it."""
        return _generate.trace(*self._program_args(prompts, group_size, params, pixel_values, image_grid_thw, seed))

    def _program_args(self, prompts, group_size, params: SamplingParams, pixel_values, image_grid_thw,
                      seed: int) -> tuple:
        """Returns `_generate`'s arguments: the prompts left-padded to a length bucket, patches to a patch bucket."""
        if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) or group_size < 1:
            raise ValueError(f"group_size must be an int >= 1, got {group_size!r}")
        if not prompts or any(len(p) == 0 for p in prompts):
            empty = [i for i, p in enumerate(prompts) if len(p) == 0]
            raise ValueError("generate needs at least one prompt and no empty prompt"
                             + (f" (prompts {empty} are empty)" if empty else " (got no prompts)"))
        length = self._bucket(max(len(p) for p in prompts))
        # Prefill rows split over the mesh's batch axes: pad the prompt list to a multiple of them with
        # one-token rows (no images), dropped right after the prefill. Replicated rows would make every
        # device prefill every prompt (8 prompts x 8k tokens on fsdp = 16: 40 GiB of temporaries each).
        real = len(prompts)
        prompts = list(prompts) + [[self.pad_id]] * (-real % self.batch_shards)
        ids = np.full((len(prompts), length), self.pad_id, np.int32)
        mask = np.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, length - len(p):] = p
            mask[i, length - len(p):] = 1
        pad_to = None
        if pixel_values is not None:
            merge = self.model.config.vision.spatial_merge_size ** 2
            n = int(np.asarray(pixel_values).shape[0])
            pad_to = max(self.patch_bucket, -(-n // self.patch_bucket) * self.patch_bucket)
            pad_to = -(-pad_to // merge) * merge
        inputs = prepare_inputs(self.model.config, ids, attention_mask=mask, pixel_values=pixel_values,
                                image_grid_thw=image_grid_thw, pad_patches_to=pad_to,
                                vision_window=self.model.runtime.vision_window)
        # Whole on every device (_generate says why); left to XLA, these host arrays would arrive split by rows.
        inputs = inputs._replace(**{name: _whole_on(np.asarray(getattr(inputs, name)), self.model.mesh)
                                    for name in ("position_ids", "rope_deltas", "segment_ids")})
        self._resolve(real * int(group_size), length, params.max_new_tokens, int(group_size))
        return self._args(inputs, int(group_size), params, seed, real, self._graphdef, self._state,
                          self._decode_weights(), self._decode_text_state())

    def _args(self, inputs: ModelInputs, group_size: int, params: SamplingParams, seed: int, real: int, graphdef,
              state, step_weights, decode_text) -> tuple:
        stop = np.asarray(params.stop_token_ids or (-1,), np.int32)
        knobs = (np.float32(params.temperature), np.float32(params.top_p), np.int32(params.top_k))
        mode = (params.temperature == 0, params.top_k > 0, params.top_p < 1)
        decode_graphdef = None if self._decode is None else self._decode.graphdef
        cascade = group_size > 1 and self.model.runtime.group_decode == "cascade"
        # None: nothing suppressed, no mask in the program (ids past the vocabulary are dropped by the scatter)
        suppress = np.asarray(sorted(set(params.suppress_token_ids)), np.int32) if params.suppress_token_ids else None
        return (graphdef, state, step_weights, decode_graphdef, decode_text, inputs, params.max_new_tokens,
                self.pad_id, stop, knobs, jax.random.key(seed), mode, group_size, real, cascade, suppress,
                self.model.runtime.decode_compaction)

    @property
    def batch_shards(self) -> int:
        """Returns how many ways the model's mesh splits rows (its 'batch' axes; 1 without a mesh)."""
        return _batch_shards(self.model)

    def abstract_program(self, inputs: ModelInputs, group_size: int, params: SamplingParams = SamplingParams(),
                         real: int | None = None):
        """Returns (the jitted generate program, its abstract arguments) for abstract `inputs` (ShapeDtypeStructs;
        rows a multiple of batch_shards, the first `real` of them prompts, default all) on an abstract model:
        what `plan --compile` compiles."""
        abstract = _abstract_state(nnx.state(self.model), self.model.mesh, self.model.rules)
        real = int(inputs.input_ids.shape[0]) if real is None else int(real)
        self._resolve(real * int(group_size), int(inputs.input_ids.shape[1]), params.max_new_tokens, int(group_size))
        decode_text = None if self._decode is None else self._decode.abstract()
        return _generate, self._args(inputs, int(group_size), params, 0, real, nnx.graphdef(self.model), abstract,
                                     None, decode_text)

    def _bucket(self, n: int) -> int:
        for b in self.length_buckets:
            if b >= n:
                return b
        raise ValueError(f"prompt of {n} tokens exceeds the largest length bucket {self.length_buckets[-1]}")


def _host(x: jax.Array) -> np.ndarray:
    """Returns the whole of an output as numpy. On several processes (every one sampling the same prompts on
    the global mesh) XLA may shard it over other hosts' devices: gathered then (every process calls this)."""
    if x.is_fully_addressable:
        return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def never_sampled(config) -> tuple[int, ...]:
    """Returns the vision placeholder ids of a model config (image and video pads, vision start and end): what
    Salvage-DS's rollouts and mining's replay suppress. Sampled, they stand for an image the sequence does not
    have, and a training row holding them is refused (train/image_batch.py); a random or early policy draws them
    at temperature 1."""
    return tuple(sorted({int(config.image_token_id), int(config.video_token_id), int(config.vision_start_token_id),
                         int(config.vision_end_token_id)}))


def rollout_params(config, max_new_tokens: int, temperature: float, top_p: float = 1.0) -> SamplingParams:
    """Returns the SamplingParams of RL's rollouts for a model config: Salvage-DS's draws, mining's replay (which
    measures the policy RL samples) and the planner's compiled program of both, one rule for all three (copies of
    it had drifted: the pods then compiled two sampler programs). The vision placeholders are never drawn
    (never_sampled). Not the server's or the agents' sampling: those sample the model as transformers does."""
    return SamplingParams(max_new_tokens=int(max_new_tokens), temperature=float(temperature), top_p=float(top_p),
                          suppress_token_ids=never_sampled(config))


def sample_token(logits: jax.Array, rng: jax.Array, temperature, top_p, top_k, *,
                 mode: tuple[bool, bool, bool] | None = None) -> tuple[jax.Array, jax.Array]:
    """Returns (token [B], logprob [B]) from fp32 logits [B, V]: greedy when temperature == 0. `rng`: one key for
    the whole batch, or one per row [B] (row_keys).

    `mode` = (greedy, use_top_k, use_top_p) as static flags skips the vocabulary sorts that unused
    filters would cost on every decode step, and with greedy False the argmax for rows at temperature 0 (the flags
    must agree with the values: `Sampler` derives both from one SamplingParams); None decides from the (traced)
    values instead.
    """
    greedy, use_k, use_p = mode if mode is not None else (None, True, True)
    if greedy is True:
        token, top = first_argmax(logits)
        # log_softmax at the max: -log(sum(exp(logits - max))).
        return token, -jnp.log(jnp.sum(jnp.exp(logits - top[:, None]), axis=-1))
    is_greedy = temperature <= 0
    scaled = logits / jnp.where(is_greedy, 1.0, temperature)
    logp = jax.nn.log_softmax(scaled, axis=-1)
    vocab = logits.shape[-1]
    filtered = scaled
    if use_k:  # drop everything below the k-th largest logit (k = 0 keeps all)
        kth = jnp.sort(scaled, axis=-1)[:, ::-1][:, jnp.clip(top_k - 1, 0, vocab - 1)]
        filtered = jnp.where((top_k > 0) & (scaled < kth[:, None]), -jnp.inf, filtered)
    if use_p:  # keep the smallest prefix of the sorted distribution whose mass reaches p (>= 1 token)
        order = jnp.argsort(-filtered, axis=-1)
        probs = jax.nn.softmax(jnp.take_along_axis(filtered, order, axis=-1), axis=-1)
        drop_sorted = (jnp.cumsum(probs, axis=-1) - probs) >= top_p
        drop = jnp.zeros_like(drop_sorted).at[jnp.arange(order.shape[0])[:, None], order].set(drop_sorted)
        filtered = jnp.where(drop, -jnp.inf, filtered)
    # jax.random.categorical's draw, argmax(Gumbel noise + logits), with its noise and tie-break (the first
    # index) but first_argmax in place of jnp.argmax: the same tokens; a decode step's draw at [8, 32k] takes 2.4x
    # less time on CPU (bench/decode_split.py).
    if jnp.ndim(rng) == 1:  # one key per row (row_keys)
        noise = jax.vmap(lambda key: jax.random.gumbel(key, filtered.shape[1:], filtered.dtype))(rng)
    else:
        noise = jax.random.gumbel(rng, filtered.shape, filtered.dtype)
    token, _ = first_argmax(noise + filtered)
    if greedy is None:  # temperature traced: a row at 0 takes the argmax
        token = jnp.where(is_greedy, first_argmax(logits)[0], token)
    return token, jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0]


def first_argmax(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Returns (jnp.argmax(x, axis=-1) as int32, the max) for x [B, V]: the first index holding the max, found
    with two vectorised reductions instead of XLA's (value, index) reduce, several times slower on CPU at a decode
    step's [8, 32k]. A row holding a NaN gives V - 1 (argmax: the NaN's index); a row of -inf, 0 (as argmax)."""
    top = jnp.max(x, axis=-1)
    vocab = x.shape[-1]
    token = jnp.min(jnp.where(x >= top[:, None], jnp.arange(vocab, dtype=jnp.int32), vocab), axis=-1)
    return jnp.minimum(token, vocab - 1), top


@functools.partial(jax.jit, static_argnums=0)
def _step_weights(graphdef, state) -> decode.StepWeights:
    return decode.step_weights(nnx.merge(graphdef, state).text)


@functools.partial(jax.jit, static_argnums=(0, 3, 6, 7, 11, 12, 13, 14, 16))
def _generate(graphdef, state, step_weights: decode.StepWeights | None, decode_graphdef, decode_text,
              inputs: ModelInputs, max_new: int, pad_id: int, stop_ids, knobs, rng, mode, group: int, real: int,
              cascade: bool, suppress_ids=None, compaction: int = 0):
    """Prefill, then decode steps: through the model's stacked layers, over `step_weights` when given, or over
    `decode_text` (the text weights in the decode layout, with `decode_graphdef`'s rules) when given.

    The prefill's rows are split over the mesh's batch axes; rows past `real` are padding, dropped after it.
    With group > 1 every prompt row's last hidden state and positions are repeated `group` times (prompt-major)
    right after the prefill, so the head, the first draw and every decode step run on the arrays `generate`
    would build for the repeated prompts. The prompt's cache: with `cascade` the prefill's cache holds the
    prompt only and stays one copy per prompt (the `prefix` of every decode step); each row's new tokens go to
    a cache of max_new slots of its own. Without, the cache (prompt + max_new slots) is repeated `group` times.
    Tokens of `suppress_ids` (None: none) are never drawn. `compaction`: how many times the decode rows may halve
    as they finish (RuntimeOptions.decode_compaction; without a mesh only). Each row draws with its own key
    (row_keys), so the tokens do not depend on it.
    """
    model = nnx.merge(graphdef, state)
    mesh, rules = model.mesh, model.rules
    temperature, top_p, top_k = knobs
    # The decode rows' positions, rope deltas and prompt segment ids are taken from the inputs as the host placed
    # them, whole on every device (Sampler._program_args), and kept whole until repeated: moving them to the
    # real*group decode rows then needs no collective. Taken from the prefill's row-split copies, their collectives
    # (collective-permutes, an all-reduce within pairs of devices on a (1, 8, 1) mesh at 4 prompts x G = 2) depended
    # on the inputs alone, not on the prefill's layer loop, and XLA:CPU does not order a collective against a loop
    # that holds collectives: one device waited in that all-reduce while its partner waited in the loop's weight
    # all-gather over all 8, for ever (tests/sampling/test_mesh_group_decode.py).
    # Next MRoPE position for every axis: one past the prompt's largest position (HF: cumsum + rope delta).
    whole = functools.partial(_whole, mesh=mesh, rules=rules)
    next_pos = whole(jnp.max(whole(inputs.position_ids), axis=(0, 2))[:real] + 1)
    rope_deltas, prompt_segments = whole(inputs.rope_deltas[:real]), whole(inputs.segment_ids[:real].astype(jnp.int32))
    inputs = inputs._replace(**{name: _rows(getattr(inputs, name), axis, mesh, rules) for name, axis in
                                (("input_ids", 0), ("segment_ids", 0), ("position_ids", 1), ("rope_deltas", 0))})
    cache_dtype = DTYPES[model.runtime.compute_dtype]
    prompt_slots = inputs.input_ids.shape[1] + (0 if cascade else max_new)
    hidden, cache = model.hidden_states(
        inputs, KVCache.zeros(model.config.text, inputs.input_ids.shape[0], prompt_slots, cache_dtype))
    last_hidden = hidden[:, -1:]
    # The cache's segment ids are the prompt's (then 0 in the new tokens' slots): rebuilt from the host's copy.
    segments = jnp.pad(prompt_segments, ((0, 0), (0, cache.segment_ids.shape[1] - prompt_segments.shape[1])))
    if real < last_hidden.shape[0]:  # the prefill's padding rows
        last_hidden, cache = last_hidden[:real], KVCache(cache.k[:, :real], cache.v[:, :real], None, cache.index)
    cache = cache._replace(segment_ids=segments)
    if decode_text is not None:
        _, _, rest = nnx.split(model, nnx.PathContains("text"), ...)
        model = nnx.merge(decode_graphdef, nnx.State({"text": decode_text}), rest)  # the copy at the text's path
        rules = model.rules
    # The decode rows are padded to a multiple of the devices that split them (models/sharding.py row_shards; whole
    # prompts under cascade, so every group keeps its prefix row): rows that do not divide would otherwise be left
    # whole on every device, each decoding all of them. Padding rows copy the last real one and start finished.
    wanted, shards = real * group, sharding.row_shards(mesh, rules)
    extra = -real % (shards // math.gcd(shards, group)) if cascade else 0
    prompts = real + extra
    last_hidden, next_pos, rope_deltas = (_pad_rows(x, extra, 0) for x in (last_hidden, next_pos, rope_deltas))
    cache = KVCache(_pad_rows(cache.k, extra, 1), _pad_rows(cache.v, extra, 1), _pad_rows(cache.segment_ids, extra, 0),
                    cache.index)
    prefix = None
    if group > 1:
        last_hidden, next_pos, rope_deltas = (jnp.repeat(x, group, axis=0)
                                              for x in (last_hidden, next_pos, rope_deltas))
        if cascade:
            prefix, cache = cache, KVCache.zeros(model.config.text, prompts * group, max_new, cache_dtype)
        else:
            cache = KVCache(jnp.repeat(cache.k, group, axis=1), jnp.repeat(cache.v, group, axis=1),
                            jnp.repeat(cache.segment_ids, group, axis=0), cache.index)
    if not cascade:
        extra = -wanted % shards
        last_hidden, next_pos, rope_deltas = (_pad_rows(x, extra, 0) for x in (last_hidden, next_pos, rope_deltas))
        cache = KVCache(_pad_rows(cache.k, extra, 1), _pad_rows(cache.v, extra, 1),
                        _pad_rows(cache.segment_ids, extra, 0), cache.index)
    last_hidden = _rows(last_hidden, 0, mesh, rules)
    cache, prefix = _place_cache(cache, mesh, rules), _place_cache(prefix, mesh, rules)
    b = last_hidden.shape[0]
    def allowed(logits):  # the suppressed tokens out: the draws and their log-probs are over the others
        return logits if suppress_ids is None else logits.at[:, suppress_ids].set(-jnp.inf, mode="drop")

    rng, sub = jax.random.split(rng)
    every_row = jnp.arange(b, dtype=jnp.int32)
    first, first_lp = sample_token(allowed(model.logits(last_hidden)[:, 0]), row_keys(sub, every_row), temperature,
                                   top_p, top_k, mode=mode)
    tokens = jnp.full((b, max_new), pad_id, jnp.int32).at[:, 0].set(first)
    logprobs = jnp.zeros((b, max_new), jnp.float32).at[:, 0].set(first_lp)
    done = jnp.isin(first, stop_ids) | (every_row >= wanted)  # the padding rows: finished from the start
    lengths = jnp.ones((b,), jnp.int32)
    if step_weights is not None:
        cache = decode.step_cache(cache)
        prefix = None if prefix is None else decode.prefix_cache(prefix)

    def step_logits(last, pos, cache, rope):
        if step_weights is not None:
            hidden, cache = decode.step_hidden(model.text, step_weights, cache, last, pos, prefix)
            return decode.step_logits(step_weights, hidden), cache
        n = last.shape[0]
        step_inputs = ModelInputs(last[:, None], jnp.ones((n, 1), jnp.int32), pos, None, rope)
        hidden, cache = model.hidden_states(step_inputs, cache, prefix)
        return model.logits(hidden)[:, 0], _place_cache(cache, mesh, rules)

    # `rows`: the places in the output of the rows a step runs, None for all of them in order (the first phase: no
    # gather or scatter by index, which on a mesh would add collectives to the loop).
    def body(carry):
        step, tokens, logprobs, done, lengths, cache, last, rng, rows, row_steps = carry
        of = (lambda x: x) if rows is None else (lambda x: x[rows])
        n = last.shape[0]
        pos = jnp.broadcast_to((of(next_pos) + step - 1)[None, :, None], (3, n, 1)).astype(jnp.int32)
        logits, cache = step_logits(last, pos, cache, of(rope_deltas))
        rng, sub = jax.random.split(rng)
        tok, lp = sample_token(allowed(logits), row_keys(sub, every_row if rows is None else rows), temperature,
                               top_p, top_k, mode=mode)
        was = of(done)
        tok = jnp.where(was, pad_id, tok)
        lp = jnp.where(was, 0.0, lp)
        now = was | jnp.isin(tok, stop_ids)
        if rows is None:
            tokens = jax.lax.dynamic_update_index_in_dim(tokens, tok, step, axis=1)
            logprobs = jax.lax.dynamic_update_index_in_dim(logprobs, lp, step, axis=1)
            lengths, done = lengths + (~was).astype(jnp.int32), now
        else:
            tokens, logprobs = tokens.at[rows, step].set(tok), logprobs.at[rows, step].set(lp)
            lengths, done = lengths.at[rows].add((~was).astype(jnp.int32)), done.at[rows].set(now)
        return step + 1, tokens, logprobs, done, lengths, cache, tok, rng, rows, row_steps + n

    # Rows that finish stop costing: the loop runs in phases of halving width (decode_widths). A phase ends once no
    # segment has more live rows than the next width; its live rows (and enough finished ones to fill the width) then
    # go on with their caches, the rest are dropped. Segments are the groups under cascade (their rows share a
    # prefix row, so a group halves within itself), else all rows are one segment.
    segments = prompts if prefix is not None else 1
    widths = decode_widths(b // segments, compaction if mesh is None or mesh.size == 1 else 0)
    carry = (jnp.int32(1), tokens, logprobs, done, lengths, cache, first, rng, None, jnp.int32(0))
    for phase, width in enumerate(widths):
        following = widths[phase + 1] if phase + 1 < len(widths) else None

        def cond(carry, width=width, following=following):
            step, done, rows = carry[0], carry[3], carry[8]
            live = ~(done if rows is None else done[rows])
            more = (step < max_new) & jnp.any(live)
            if following is not None:
                more &= jnp.max(jnp.sum(live.reshape(segments, width), axis=1)) > following
            return more

        with jax.named_scope(DECODE_LOOP_SCOPE):  # names the loop in the HLO (plan/tpu_aot.py finds its body)
            carry = jax.lax.while_loop(cond, body, carry)
        if following is not None:
            step, tokens, logprobs, done, lengths, cache, last, rng, rows, row_steps = carry
            rows = every_row if rows is None else rows
            keep = live_first(~done[rows], segments, width, following)
            carry = (step, tokens, logprobs, done, lengths, _take_rows(cache, keep), last[keep], rng, rows[keep],
                     row_steps)
    _, tokens, logprobs, done, lengths, _, _, _, _, row_steps = carry
    return tokens[:wanted], logprobs[:wanted], lengths[:wanted], done[:wanted], row_steps


def row_keys(key: jax.Array, rows: jax.Array) -> jax.Array:
    """Returns one random key per row [R] for a step's draw: `key` folded with each row's place in the output, so a
    row's draws do not depend on which other rows the step runs (compacted or not, grouped or repeated)."""
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, rows)


def decode_widths(width: int, compaction: int) -> tuple[int, ...]:
    """Returns the row widths (per segment) of the decode loop's phases: `width`, then halved (rounded up)
    `compaction` times at most, down to 1."""
    widths = [int(width)]
    while len(widths) <= compaction and widths[-1] > 1:
        widths.append(-(-widths[-1] // 2))
    return tuple(widths)


def live_first(live: jax.Array, segments: int, width: int, keep: int) -> jax.Array:
    """Returns the places [segments * keep] of the rows to keep: in each segment of `width` rows, its live rows in
    order, then finished ones, `keep` in all (every live row fits: the phase ended when none had more)."""
    order = jnp.argsort((~live).reshape(segments, width).astype(jnp.int32), axis=1, stable=True)[:, :keep]
    return (jnp.arange(segments, dtype=jnp.int32)[:, None] * width + order).reshape(-1)


def _take_rows(cache, keep: jax.Array):
    """Returns the decode cache (stacked KVCache [L, B, ...] or per-layer StepCache [B, ...]) of rows `keep`."""
    if isinstance(cache, KVCache):
        return KVCache(cache.k[:, keep], cache.v[:, keep], cache.segment_ids[keep], cache.index)
    return decode.StepCache(tuple(k[keep] for k in cache.k), tuple(v[keep] for v in cache.v),
                            cache.segment_ids[keep], cache.index)


def _rows(x: jax.Array, row_axis: int, mesh, rules) -> jax.Array:
    """Returns `x` constrained to have its rows (axis `row_axis`) split over the mesh's batch axes."""
    axes = [None] * x.ndim
    axes[row_axis] = "batch"
    return sharding.constrain(x, tuple(axes), mesh, rules)


def _pad_rows(x: jax.Array, extra: int, axis: int) -> jax.Array:
    """Returns `x` with `extra` copies of its last row (along `axis`) appended."""
    if not extra:
        return x
    return jnp.pad(x, [(0, extra if i == axis else 0) for i in range(x.ndim)], mode="edge")


def _whole_on(x: np.ndarray, mesh) -> np.ndarray | jax.Array:
    """Returns host array `x` placed whole (replicated) on every device of `mesh` (as it is without a mesh). Every
    process passes the same `x`; each places the copies on its own devices."""
    if mesh is None or mesh.size == 1:
        return x
    return jax.make_array_from_callback(x.shape, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()),
                                        lambda index: x[index])


def _whole(x: jax.Array, mesh, rules) -> jax.Array:
    """Returns `x` constrained to be whole (replicated) on every device of the mesh."""
    return sharding.constrain(x, (None,) * x.ndim, mesh, rules)


def _place_cache(cache, mesh, rules):
    """Returns the stacked KV cache constrained to its layout under `rules`: rows over the batch axes, KV heads
    over theirs (a no-op for the per-layer CPU cache and without a mesh)."""
    if not isinstance(cache, KVCache) or mesh is None or mesh.size == 1:
        return cache
    kv = ("layers", "batch", "kv_seq", "kv_heads", "head_dim")
    return KVCache(sharding.constrain(cache.k, kv, mesh, rules), sharding.constrain(cache.v, kv, mesh, rules),
                   sharding.constrain(cache.segment_ids, ("batch", "kv_seq"), mesh, rules), cache.index)


def _batch_shards(model: Qwen3VL) -> int:
    """Returns how many ways the model's mesh splits rows (its 'batch' axes; 1 without a mesh)."""
    return sharding.row_shards(model.mesh, model.rules)


def _device_bytes(mesh) -> int | None:
    """Returns the memory one device of `mesh` reports (None: it reports none, e.g. a CPU)."""
    if mesh is None:
        return None
    # One of this process's devices: another host's device cannot be asked (several processes share the mesh).
    local = next(d for d in mesh.devices.flat if d.process_index == jax.process_index())
    stats = local.memory_stats() or {}
    return stats.get("bytes_limit")


def _changed(source: list, made_from) -> bool:
    """Returns whether any array of `source` is not the one a copy was made from."""
    return len(source) != len(made_from) or any(a is not b for a, b in zip(source, made_from))


def _abstract_state(state, mesh, rules):
    """Returns ShapeDtypeStructs of an nnx state with the shardings its logical axes give on `mesh`."""
    shardings = state_shardings(state, mesh, rules)
    return jax.tree.map(lambda v, s: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=s), state, shardings,
                        is_leaf=lambda x: isinstance(x, nnx.Variable))


class _DecodeCopy:
    """The text weights in a decode layout (models/sharding.py decode_rules), in the compute dtype: the
    graph of a model whose constraints use the decode rules, and the jitted copy that reshards into it."""

    def __init__(self, model: Qwen3VL, layout: str):
        self.rules = sharding.decode_rules(model.rules, layout)
        decode_model = abstract_model(model.config, model.runtime, mesh=model.mesh, rules=self.rules)
        self.graphdef = nnx.graphdef(decode_model)
        self.dtype = DTYPES[model.runtime.compute_dtype]
        self.mesh = model.mesh
        self.shardings = state_shardings(nnx.state(decode_model.text, nnx.Param), model.mesh, self.rules)
        self._template = nnx.state(decode_model.text, nnx.Param)
        self.copy = jax.jit(self._cast, out_shardings=self.shardings)

    def _cast(self, text_state):
        return jax.tree.map(lambda x: x.astype(self.dtype), text_state)

    def abstract(self):
        """Returns the copy's ShapeDtypeStructs with their shardings (no allocation)."""
        return jax.tree.map(lambda v, s: jax.ShapeDtypeStruct(v.shape, self.dtype, sharding=s), self._template,
                            self.shardings, is_leaf=lambda x: isinstance(x, nnx.Variable))
