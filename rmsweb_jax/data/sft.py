"""The SFT data pipeline: trajectory store -> prompts -> tokens, loss mask, patches -> fixed-shape batches.

    view = SFTView("workdir/store")
    split = split_by_task(view, held_out_fraction=0.2, seed=0)
    encoder = EncodeSFTExample(ckpt, images, prompt_config_from(config), mask=data_config.mask)
    with SFTBatches(view, split.train, data_config, encoder, rows=8) as batches:
        trainer.fit(batches)                # batches: the trainer's BatchSource (get_state / set_state)

A Grain pipeline over `SFTView` (the successful steps, reflection-free):

    MapDataset.source(this host's examples).seed(seed).shuffle().repeat()   # reshuffled every epoch
      .map(EncodeSFTExample)      # StepContext -> PromptBuilder.messages -> encode_for_training
      .to_iter_dataset(ReadOptions)
      -> BucketBatchDataset | PackBatchDataset                              (data/batching.py)
      -> mp_prefetch(worker_count)                                          (when worker_count > 0)

Feeds (train/feeds.py: the processes that hold the same rows of the batch) read disjoint, equal slices of
the training examples (strided by feed index; the remainder of n / feed_count is left out), each yielding its
own rows of the global batch; the processes of one feed read the same slice.
The iterator state is Grain's (JSON), saved with every checkpoint; a resumed run continues with
the batches the uninterrupted run would have seen, given the same store, config and worker count
(Grain gives each worker a fixed slice, so the worker count is part of the order).

Grain's worker processes read absl flags: under the `rmsweb_jax.main` entry point they are
parsed; elsewhere (notebooks, scripts) `SFTBatches` marks them parsed with their defaults.
"""
from __future__ import annotations

import dataclasses
import pathlib
import threading
from typing import Any, Sequence

import grain
import numpy as np
from absl import flags, logging

from rmsweb_jax import storage
from rmsweb_jax.agents.prompt import PromptBuilder, PromptConfig
from rmsweb_jax.collect.sft_view import ATTEMPT_CHOICES, SFTExample, SFTView
from rmsweb_jax.collect.store_provenance import check_provenance, provenance
from rmsweb_jax.config_block import block_fields
from rmsweb_jax.data.batching import BATCHING_MODES, TOO_LONG_MODES, Buckets, batch_dataset
from rmsweb_jax.errors import UserError
from rmsweb_jax.processing.chat import MASK_MODES, encode_for_training
from rmsweb_jax.processing.image import ImageProcessorConfig


@dataclasses.dataclass(frozen=True)
class SFTDataConfig:
    """config.data, validated: where the store is, which successful attempts, the loss mask, batch
    shapes, order, workers. No defaults: configs/common.py holds them (`from_config`)."""

    store_dir: str
    attempts: str
    mask: str
    batching: str
    buckets: tuple[int, ...]
    bucket_patches: tuple[int, ...]
    too_long: str
    seed: int
    held_out_fraction: float
    split_seed: int
    worker_count: int
    worker_buffer_size: int
    read_threads: int
    read_buffer_size: int

    def __post_init__(self):
        for name, allowed in (("attempts", tuple(ATTEMPT_CHOICES)), ("mask", MASK_MODES),
                              ("batching", BATCHING_MODES), ("too_long", TOO_LONG_MODES)):
            if getattr(self, name) not in allowed:
                raise UserError(f"config.data.{name} = {getattr(self, name)!r}; expected one of {list(allowed)}")
        if not 0.0 <= self.held_out_fraction < 1.0:
            raise UserError(f"config.data.held_out_fraction = {self.held_out_fraction!r}; expected 0 <= f < 1")
        for name in ("worker_count", "read_threads", "worker_buffer_size", "read_buffer_size", "seed", "split_seed"):
            value = getattr(self, name)
            low = 1 if name in ("read_threads", "worker_buffer_size", "read_buffer_size") else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise UserError(f"config.data.{name} = {value!r}; expected an integer >= {low}")
        object.__setattr__(self, "buckets", tuple(int(b) for b in self.buckets))
        object.__setattr__(self, "bucket_patches", tuple(int(p) for p in self.bucket_patches))

    @classmethod
    def from_config(cls, data, workdir: str | pathlib.Path) -> "SFTDataConfig":
        """Returns the settings of `config.data` (store_dir "" = <workdir>/store, collect's store)."""
        if data is None:
            raise UserError("config has no 'data' block (see configs/common.py)")
        d = block_fields(cls, data, "config.data", exact=True, optional=("store_dir",))
        d["store_dir"] = str(d.get("store_dir") or storage.as_path(workdir) / "store")
        return cls(**d)

    def view(self) -> SFTView:
        """Returns the SFT view of store_dir: the steps of the successful attempts `attempts` picks."""
        return SFTView(self.store_dir, attempts=self.attempts)

    def bucket_spec(self, image_config: ImageProcessorConfig) -> Buckets:
        """Returns the batch shapes for a model whose patches are `image_config`'s."""
        return Buckets(self.buckets, self.bucket_patches, image_config.patch_dim, image_config.merge_size ** 2)


# ---- which examples ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Split:
    """Example indices of the view for training and held out, split by task group (task id, seed)."""

    train: np.ndarray
    held_out: np.ndarray
    held_out_keys: tuple[tuple[str, int], ...]


def split_by_task(view: SFTView, held_out_fraction: float, seed: int) -> Split:
    """Returns the split holding out round(fraction x groups) task groups (at least one when fraction > 0),
    chosen by a seeded permutation of the sorted (task id, seed) keys: the same store and seed give the
    same split. Raises ValueError when nothing would be left to train on."""
    keys = sorted(view.task_keys)
    groups = view.group_index()
    n_out = 0 if held_out_fraction <= 0 else max(1, int(round(held_out_fraction * len(keys))))
    if n_out >= len(keys):
        raise UserError(f"config.data.held_out_fraction = {held_out_fraction} holds out {n_out} of the "
                        f"{len(keys)} task groups in {view.store_dir}, leaving none to train on")
    order = np.random.default_rng(seed).permutation(len(keys))
    out_keys = tuple(sorted(keys[i] for i in order[:n_out]))
    position = {k: i for i, k in enumerate(view.task_keys)}
    out_groups = np.asarray([position[k] for k in out_keys], np.int64)
    held = np.isin(groups, out_groups)
    return Split(np.flatnonzero(~held), np.flatnonzero(held), out_keys)


def host_indices(indices: Sequence[int], feed_index: int, feed_count: int) -> np.ndarray:
    """Returns this feed's share of `indices`: every feed_count-th from feed_index, all feeds
    the same number (the remainder is left out, so every host's epoch has the same length)."""
    if feed_count < 1 or not 0 <= feed_index < feed_count:
        raise ValueError(f"feed_index {feed_index} / feed_count {feed_count}: expected 0 <= index < count")
    indices = np.asarray(indices, np.int64)
    per_host = len(indices) // feed_count
    if per_host == 0:
        raise ValueError(f"{len(indices)} training examples cannot be shared by {feed_count} feeds")
    return indices[feed_index::feed_count][:per_host]


class IndexedSource:
    """A random-access source over the chosen examples of an SFTView (picklable, for Grain workers)."""

    def __init__(self, view: SFTView, indices: Sequence[int]):
        self.view, self.indices = view, np.asarray(indices, np.int64)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index) -> SFTExample:
        return self.view[int(self.indices[int(index)])]

    def __repr__(self) -> str:
        return f"IndexedSource({len(self)} of {self.view!r})"


# ---- one example ----------------------------------------------------------------------------------------
def encode_example(tokenizer, builder: PromptBuilder, image_config: ImageProcessorConfig, example: SFTExample,
                   mask: str) -> dict[str, Any]:
    """Returns the encoded example (see data/batching.py): the prompt every stage samples with (no
    reflections) + the stored assistant turn, tokenized through the chat template with its loss mask."""
    return encode_turn(tokenizer, builder.messages(example.context()), example.target_text, image_config, mask,
                       name=example_name(example))


def encode_turn(tokenizer, messages: list[dict[str, Any]], target_text: str, image_config: ImageProcessorConfig,
                mask: str, *, name: str, more_turns: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    """Returns the encoded row (see data/batching.py) of chat `messages` + the assistant turn `target_text` (+ the
    (user text, target) turns of `more_turns`), with its loss mask; a ValueError names the row `name`."""
    try:
        enc = encode_for_training(tokenizer, messages, target_text, image_config, mask=mask, more_turns=more_turns)
    except ValueError as err:
        raise ValueError(f"SFT example {name}: {err}") from err
    patch_dim = image_config.patch_dim
    pixels = enc.pixel_values if enc.pixel_values is not None else np.zeros((0, patch_dim), np.float32)
    grids = enc.image_grid_thw if enc.image_grid_thw is not None else np.zeros((0, 3), np.int64)
    return {"input_ids": np.asarray(enc.input_ids, np.int32), "loss_mask": np.asarray(enc.loss_mask, np.float32),
            "pixel_values": np.asarray(pixels, np.float32), "image_grid_thw": np.asarray(grids, np.int64),
            "name": name}


def example_name(example: SFTExample) -> str:
    """Returns "<request id>/<step>": which stored step an example is."""
    return f"{example.request_id}/{example.step.step}"


_LOAD_LOCK = threading.Lock()


class EncodeSFTExample(grain.transforms.Map):
    """Grain map SFTExample -> encoded example; loads the tokenizer once per reading thread.

    Grain's read threads call `map` concurrently; a Rust tokenizer is not safe to share across
    threads (it raises "Already borrowed"), and importing transformers from several threads at once
    fails, hence one tokenizer per thread, loaded under a lock.
    """

    def __init__(self, tokenizer_dir: str | pathlib.Path, image_config: ImageProcessorConfig,
                 prompt_config: PromptConfig, mask: str):
        if mask not in MASK_MODES:
            raise UserError(f"config.data.mask = {mask!r}; expected one of {list(MASK_MODES)}")
        self.tokenizer_dir, self.image_config = str(tokenizer_dir), image_config
        self.builder, self.mask = PromptBuilder(prompt_config), mask
        self._local = threading.local()

    def __getstate__(self):
        state = dict(self.__dict__)
        del state["_local"]  # workers load their own tokenizers
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._local = threading.local()

    @property
    def tokenizer(self):
        tokenizer = getattr(self._local, "tokenizer", None)
        if tokenizer is None:
            from rmsweb_jax.processing.prompt_tokens import load_tokenizer
            with _LOAD_LOCK:
                tokenizer = self._local.tokenizer = load_tokenizer(self.tokenizer_dir)
        return tokenizer

    def map(self, example: SFTExample) -> dict[str, Any]:
        return encode_example(self.tokenizer, self.builder, self.image_config, example, self.mask)


# ---- the pipeline -----------------------------------------------------------------------------------------
def example_dataset(view: SFTView, indices: Sequence[int], encoder: EncodeSFTExample, *, seed: int,
                    feed_index: int = 0, feed_count: int = 1, epochs: int | None = None) -> grain.MapDataset:
    """Returns this host's encoded examples, shuffled with `seed` (a new order each epoch), repeated
    `epochs` times (None: forever)."""
    source = IndexedSource(view, host_indices(indices, feed_index, feed_count))
    ds = grain.MapDataset.source(source).seed(seed).shuffle()
    return ds.repeat(epochs).map(encoder)


def ensure_flags_parsed() -> None:
    """Marks absl flags parsed (with their defaults) when no entry point parsed them: Grain's worker
    processes read flags and fail on unparsed ones."""
    if not flags.FLAGS.is_parsed():
        logging.info("absl flags were not parsed (not under absl.app.run); marking them parsed with defaults "
                     "for Grain's worker processes")
        flags.FLAGS.mark_as_parsed()


class SFTBatches:
    """The trainer's batch source over SFT examples: contract batches of `rows` rows, resumable.

    `encoder` turns a stored step into tokens (the model's tokenizer and image processor, the prompt
    every stage builds, config.data.mask); `rows` is this feed's share of the global batch
    (config.train.batch_size / feed count, Trainer.local_rows).
    Iterating starts the Grain pipeline (worker processes when config.data.worker_count > 0);
    `close()` (or the context manager) stops them.
    """

    def __init__(self, view: SFTView, indices: Sequence[int], cfg: SFTDataConfig, encoder: EncodeSFTExample, *,
                 rows: int, pad_id: int = 0, feed_index: int = 0, feed_count: int = 1,
                 epochs: int | None = None):
        if encoder.mask != cfg.mask:
            raise ValueError(f"the encoder masks {encoder.mask!r} but config.data.mask = {cfg.mask!r}: build it "
                             "with mask=config.data.mask")
        self.cfg, self.rows = cfg, rows
        image_config = encoder.image_config
        if view.store_dir is not None:  # synthetic pages (data/synthetic_pages.py) come from no store
            check_provenance(view.store_dir, provenance(encoder.builder.config, encoder.tokenizer, image_config))
        examples = example_dataset(view, indices, encoder, seed=cfg.seed, feed_index=feed_index,
                                   feed_count=feed_count, epochs=epochs)
        self.examples_per_epoch = len(indices) // feed_count  # this feed's
        read = grain.ReadOptions(num_threads=cfg.read_threads, prefetch_buffer_size=cfg.read_buffer_size)
        ds = batch_dataset(examples.to_iter_dataset(read), cfg.batching, rows=rows,
                           buckets=cfg.bucket_spec(image_config), pad_id=pad_id, too_long=cfg.too_long)
        if cfg.worker_count > 0:
            ensure_flags_parsed()
            ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=cfg.worker_count,
                                                             per_worker_buffer_size=cfg.worker_buffer_size))
        self.dataset = ds
        self._iterator = None

    def _it(self):
        if self._iterator is None:
            self._iterator = iter(self.dataset)
        return self._iterator

    def __iter__(self) -> "SFTBatches":
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        return next(self._it())

    def get_state(self) -> Any:
        """Returns the JSON iterator state after the batch just returned."""
        return self._it().get_state()

    def set_state(self, state: Any) -> None:
        """Continues from a state of `get_state` (same store, config and worker count)."""
        try:
            self._it().set_state(state)
        except (KeyError, TypeError, ValueError, IndexError) as err:
            raise ValueError(f"the checkpoint's data-iterator state does not fit this SFT pipeline (config.data "
                             f"changed? worker_count {self.cfg.worker_count}, batching {self.cfg.batching!r}): "
                             f"{type(err).__name__}: {err}") from err

    def close(self) -> None:
        """Stops Grain's worker processes (if any)."""
        it, self._iterator = self._iterator, None
        if it is not None and hasattr(it, "close"):
            it.close()

    def __enter__(self) -> "SFTBatches":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
