"""An in-process chat model: OpenAI-format conversations in, completions out, over our Flax Qwen3-VL sampler.

`ChatModel.complete` is what `FlaxPolicy` and the OpenAI-compatible server (`sampling/serve.py`)
both call, so a checkpoint answers the same way in-process and over HTTP.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import threading
from typing import Any, Sequence

import ml_collections
import numpy as np

from rmsweb_jax import storage
from rmsweb_jax.models import qwen3_vl
from rmsweb_jax.processing.chat import END_OF_TURN, EncodedChat, encode_chat
from rmsweb_jax.processing.image import ImageProcessorConfig
from rmsweb_jax.sampling.sampler import DEFAULT_LENGTH_BUCKETS, Sampler, SamplingParams

FINISH_REASONS = ("stop", "length")
# Bytes hashed from each end of every weight file: the safetensors header (names, shapes, offsets)
# and the first and last tensors' values, so a fine-tuned copy of the same shapes differs.
_FINGERPRINT_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class Completion:
    """One generated assistant turn.

    `text` is decoded without special tokens and without the stop token; `token_ids` and
    `logprobs` cover every generated token, the stop token included, so `completion_tokens`
    equals len(token_ids). `finish_reason` is "stop" (a stop token ended it) or "length".
    """

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict."""
        return dataclasses.asdict(self)


def _length_sorted_chunks(encoded: Sequence[EncodedChat], size: int) -> list[list[int]]:
    """Returns the indices of `encoded` sorted by prompt length, in chunks of `size` (similar lengths
    share a batch, so less of each batch is padding)."""
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i].input_ids))
    return [order[start:start + size] for start in range(0, len(order), size)]


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """Returns the batch sizes compiled for: powers of two below max_batch, then max_batch."""
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    return (*sizes, max_batch)


class ChatModel:
    """Completes batches of chat conversations with one Qwen3-VL model; safe to call from threads.

    Conversations are rendered by the tokenizer's chat template (`processing.chat.encode_chat`),
    grouped by length into batches of at most `max_batch` (padded with one-token dummy rows to a
    power of two, so few batch shapes compile), and sampled until a stop token (the checkpoint's
    `<|im_end|>` / eos ids, plus the request's) or `max_new_tokens`.

    `name` identifies the weights (policy names in the trajectory store, the served model id):
    `load` sets it to checkpoint_name(checkpoint dir); give one when building from a model in memory.
    """

    def __init__(self, model, tokenizer, *, name: str = "rmsweb", image_config: ImageProcessorConfig | None = None,
                 length_buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS, max_batch: int = 8,
                 stop_token_ids: Sequence[int] | None = None, patch_bucket: int = 1024):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.name = name
        self.model, self.tokenizer = model, tokenizer
        self.image_config = image_config or ImageProcessorConfig()
        vision = model.config.vision
        ours = (self.image_config.patch_size, self.image_config.merge_size, self.image_config.temporal_patch_size)
        theirs = (vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size)
        if ours != theirs:
            raise ValueError(f"image_config patch/merge/temporal sizes {ours} differ from the model's vision config "
                             f"{theirs}")
        image_token = tokenizer.convert_tokens_to_ids("<|image_pad|>")
        if image_token != model.config.image_token_id:
            raise ValueError(f"tokenizer's <|image_pad|> id {image_token} differs from the model's image_token_id "
                             f"{model.config.image_token_id}: tokenizer and checkpoint do not belong together")
        self.max_batch = int(max_batch)
        self.stop_token_ids = tuple(sorted(set(stop_token_ids if stop_token_ids is not None
                                               else default_stop_token_ids(tokenizer))))
        if not self.stop_token_ids:
            raise ValueError("no stop token ids: the tokenizer has neither <|im_end|> nor an eos token; "
                             "pass stop_token_ids")
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.stop_token_ids[0])
        self._sampler = Sampler(model, pad_id=self.pad_id, length_buckets=length_buckets, patch_bucket=patch_bucket)
        # The longest prompt complete() takes (its largest length bucket); servers check it up front.
        self.max_prompt_tokens = int(self._sampler.length_buckets[-1])
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def load(cls, spec: str, workdir: str | pathlib.Path, *, config: ml_collections.ConfigDict | None = None,
             devices=None, **kw) -> "ChatModel":
        """Returns the chat model of `spec` ('hf:/path' or 'random:tiny', as rmsweb_jax/model_init.py reads it).

        `config` is the run's config (its model dtypes, mesh and sharding rules are used; `spec`
        replaces config.model.init); without one the model loads float32 on a single device. `devices`
        (default: the global mesh's) are where it is placed, e.g. jax.local_devices() for a model each host
        samples with alone (rmsweb_jax/model_init.py load_model). The
        checkpoint's preprocessor_config.json and generation_config.json set the image config and
        stop tokens unless `image_config` / `stop_token_ids` are given.
        """
        from rmsweb_jax.model_init import load_model  # heavy (jax, safetensors); only loaders pay
        from rmsweb_jax.processing.prompt_tokens import load_tokenizer

        cfg = loading_config(spec, config)
        model, checkpoint_dir = load_model(cfg, storage.as_path(workdir), devices=devices)  # local, or gs://
        tokenizer = load_tokenizer(checkpoint_dir)
        kw.setdefault("image_config", image_config_from_checkpoint(checkpoint_dir))
        kw.setdefault("stop_token_ids", default_stop_token_ids(tokenizer, checkpoint_dir))
        kw.setdefault("name", checkpoint_name(checkpoint_dir))
        return cls(model, tokenizer, **kw)

    def encode(self, conversation: Sequence[dict]) -> EncodedChat:
        """Returns the conversation as the model will see it (template, images, expanded placeholders)."""
        return encode_chat(self.tokenizer, conversation, self.image_config, add_generation_prompt=True)

    def complete(self, conversations: Sequence[Sequence[dict]], params: SamplingParams = SamplingParams(), *,
                 seed: int = 0) -> list[Completion]:
        """Returns one Completion per conversation, in order.

        Raises ValueError naming the conversation at fault (bad message, undecodable image, prompt
        longer than the largest length bucket). The request's `params.stop_token_ids` add to the
        model's own stop tokens.
        """
        with self._lock:
            encoded, params = self._prepare(conversations, params)
            results: list[Completion | None] = [None] * len(encoded)
            for b, chunk in enumerate(_length_sorted_chunks(encoded, self.max_batch)):
                for i, completion in zip(chunk, self._generate([encoded[i] for i in chunk], params, seed + b)):
                    results[i] = completion
            return results  # type: ignore[return-value]

    def sample_groups(self, conversations: Sequence[Sequence[dict]], group_size: int,
                      params: SamplingParams = SamplingParams(), *, seed: int = 0) -> list[list[Completion]]:
        """Returns `group_size` Completions of every conversation (one list per conversation, in order).

        Each conversation is prefilled once and its G samples decode from copies of its KV cache
        (`Sampler.generate_groups`). Batching rule: a sampler call takes max(1, max_batch // G)
        conversations, i.e. at most max(max_batch, G) rows; a group is never split across calls (that
        would prefill its prompt twice), so G > max_batch gives one conversation of G rows per call.
        Conversations are sorted by length into calls as in `complete`, call b uses seed + b, and a
        call's conversation count is padded like `complete`'s batches (dummy one-token prompts), so
        the result equals `complete` on each conversation repeated G times whenever both form the
        same batches (G a power of two dividing max_batch), up to the prefill's summation order in the
        log-probs. Raises ValueError for group_size < 1, and as `complete` for bad conversations.
        """
        if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) or group_size < 1:
            raise ValueError(f"group_size must be an int >= 1, got {group_size!r}")
        with self._lock:
            encoded, params = self._prepare(conversations, params)
            per_call = max(1, self.max_batch // group_size)
            results: list[list[Completion] | None] = [None] * len(encoded)
            for b, chunk in enumerate(_length_sorted_chunks(encoded, per_call)):
                samples = self._generate([encoded[i] for i in chunk], params, seed + b, group_size=group_size,
                                         max_prompts=per_call)
                for n, i in enumerate(chunk):
                    results[i] = samples[n * group_size:(n + 1) * group_size]
            return results  # type: ignore[return-value]

    def _prepare(self, conversations: Sequence[Sequence[dict]], params: SamplingParams
                 ) -> tuple[list[EncodedChat], SamplingParams]:
        """Returns the encoded conversations and `params` with the model's stop tokens added (lock held)."""
        if self._closed:
            raise RuntimeError(f"ChatModel {self.name!r} is closed")
        encoded = []
        for i, conversation in enumerate(conversations):
            try:
                encoded.append(self.encode(conversation))
            except (ValueError, TypeError) as err:
                raise type(err)(f"conversation {i}: {err}") from err
        longest = self.max_prompt_tokens
        for i, enc in enumerate(encoded):
            if len(enc.input_ids) > longest:
                raise ValueError(f"conversation {i}: prompt of {len(enc.input_ids)} tokens exceeds the largest "
                                 f"length bucket ({longest} tokens)")
        stops = sorted(set(self.stop_token_ids) | set(params.stop_token_ids))
        # The stop list's length is part of the compiled program's shape: pad it (with a repeat)
        # to a multiple of 4 so requests with their own stop tokens reuse the compiled sampler.
        stops += stops[:1] * (-len(stops) % 4)
        return encoded, dataclasses.replace(params, stop_token_ids=tuple(stops))

    def _generate(self, batch: list[EncodedChat], params: SamplingParams, seed: int, *, group_size: int = 1,
                  max_prompts: int | None = None) -> list[Completion]:
        """Returns the completions of one batch (at most max_prompts prompts, max_batch by default), group_size
        per prompt, prompt-major."""
        size = next(s for s in batch_buckets(max_prompts or self.max_batch) if s >= len(batch))
        prompts = [enc.input_ids.tolist() for enc in batch] + [[self.pad_id]] * (size - len(batch))
        with_images = [enc for enc in batch if enc.num_images]
        pixels = np.concatenate([enc.pixel_values for enc in with_images]) if with_images else None
        grids = np.concatenate([enc.image_grid_thw for enc in with_images]) if with_images else None
        # generate_groups with a group of 1 is generate (one program, the same arrays).
        out = self._sampler.generate_groups(prompts, group_size, params, pixel_values=pixels, image_grid_thw=grids,
                                            seed=seed)
        batch = [enc for enc in batch for _ in range(group_size)]
        completions = []
        for row, enc in enumerate(batch):
            n = int(out.lengths[row])
            ids = tuple(int(t) for t in out.tokens[row, :n])
            finished = bool(out.finished[row])
            # The stop token ends the turn; like an OpenAI stop sequence it is not part of the text.
            text_ids = list(ids[:-1] if finished else ids)
            completions.append(Completion(
                text=self.tokenizer.decode(text_ids, skip_special_tokens=True),
                prompt_tokens=int(len(enc.input_ids)), completion_tokens=n,
                finish_reason="stop" if finished else "length",
                token_ids=ids, logprobs=tuple(float(x) for x in out.logprobs[row, :n])))
        return completions

    @property
    def resync_seconds(self) -> float | None:
        """Returns the seconds the sampler last took to lay new weights out for decoding (None: it keeps none)."""
        return self._sampler.resync_seconds

    def refresh(self) -> None:
        """Re-reads the model's parameters (after a training update changed them in place)."""
        with self._lock:
            self._sampler.refresh()

    def close(self) -> None:
        """Drops the model and sampler; later `complete` calls raise RuntimeError."""
        with self._lock:
            self._closed = True
            self._sampler = None
            self.model = None


def checkpoint_name(checkpoint_dir: str | pathlib.Path) -> str:
    """Returns "<folder name>@<10 hex digits>" naming an HF checkpoint folder's weights: a sha256 of
    config.json, the weight index (if any), and each *.safetensors file's name, size and first and
    last MiB. Two folders with other weights get other names, however the folders are called."""
    path = pathlib.Path(checkpoint_dir)
    config = path / "config.json"
    weights = sorted(path.glob("*.safetensors"))
    if not config.is_file() or not weights:
        raise FileNotFoundError(f"{path} is not an HF checkpoint folder: expected config.json and *.safetensors")
    digest = hashlib.sha256(config.read_bytes())
    index = path / "model.safetensors.index.json"
    if index.is_file():
        digest.update(index.read_bytes())
    for file in weights:
        size = file.stat().st_size
        digest.update(f"{file.name}:{size}".encode())
        with open(file, "rb") as f:
            digest.update(f.read(_FINGERPRINT_BYTES))
            f.seek(max(size - _FINGERPRINT_BYTES, 0))
            digest.update(f.read(_FINGERPRINT_BYTES))
    return f"{path.resolve().name}@{digest.hexdigest()[:10]}"


def default_stop_token_ids(tokenizer, checkpoint_dir: str | pathlib.Path | None = None) -> tuple[int, ...]:
    """Returns the ids that end an assistant turn: `<|im_end|>`, the tokenizer's eos, and the eos ids
    of the checkpoint's generation_config.json (Qwen3-VL lists `<|im_end|>` and `<|endoftext|>`)."""
    ids = set()
    end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    if end is not None and end != tokenizer.unk_token_id:
        ids.add(int(end))
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    if checkpoint_dir is not None:
        path = pathlib.Path(checkpoint_dir) / "generation_config.json"
        if path.is_file():
            eos = json.loads(path.read_text()).get("eos_token_id")
            ids.update(int(t) for t in (eos if isinstance(eos, list) else [eos]) if t is not None)
    return tuple(sorted(ids))


def image_config_from_checkpoint(checkpoint_dir: str | pathlib.Path) -> ImageProcessorConfig:
    """Returns the image config of the checkpoint's preprocessor_config.json (defaults when absent).

    Reads Qwen3-VL's form (`size.shortest_edge` / `size.longest_edge` as pixel counts) and the older
    `min_pixels` / `max_pixels` form.
    """
    path = pathlib.Path(checkpoint_dir) / "preprocessor_config.json"
    if not path.is_file():
        return ImageProcessorConfig()
    d = json.loads(path.read_text())
    size = d.get("size") or {}
    kw: dict[str, Any] = {}
    for ours, theirs in (("patch_size", "patch_size"), ("merge_size", "merge_size"),
                         ("temporal_patch_size", "temporal_patch_size"), ("min_pixels", "min_pixels"),
                         ("max_pixels", "max_pixels"), ("mean", "image_mean"), ("std", "image_std")):
        if d.get(theirs) is not None:
            kw[ours] = d[theirs]
    if "shortest_edge" in size:
        kw["min_pixels"] = size["shortest_edge"]
    if "longest_edge" in size:
        kw["max_pixels"] = size["longest_edge"]
    try:
        return ImageProcessorConfig(**kw)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: {err}") from err


def loading_config(spec: str, config: ml_collections.ConfigDict | None) -> ml_collections.ConfigDict:
    """Returns a config for rmsweb_jax/model_init.py: the run's, or float32 on one device, with model.init = spec."""
    if config is not None:
        cfg = ml_collections.ConfigDict(config.to_dict())
    else:
        cfg = ml_collections.ConfigDict()
        cfg.seed = 0
        cfg.model = ml_collections.ConfigDict(dataclasses.asdict(qwen3_vl.RuntimeOptions()))  # its defaults
        cfg.mesh = ml_collections.ConfigDict(dict(shape=(1, 1, 1)))
        cfg.sharding_rules = None  # one device: the rules place nothing (None = models.sharding.DEFAULT_RULES)
    cfg.model.init = spec
    return cfg
