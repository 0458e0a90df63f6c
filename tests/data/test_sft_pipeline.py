"""The SFT Grain pipeline: masks, fixed shapes, images in token order, order, resume, host sharding."""
import json

import numpy as np
import pytest

from rmsweb_jax.data.batching import Buckets, OversizeError, iterate_examples
from configs.common import base_config
from rmsweb_jax.data.sft import EncodeSFTExample, SFTBatches, SFTDataConfig, host_indices, split_by_task
from rmsweb_jax.processing.prompt_tokens import load_tokenizer
from rmsweb_jax.train.batch import validate_batch
from tests.data.conftest import IMAGE_CONFIG, PROMPT
from tests.settings import sft_data

# Examples are 2179-2366 tokens with 96 or 192 patches (1 or 2 screenshots): two bucket shapes occur.
BUCKETS = dict(buckets=(2304, 2432), bucket_patches=(192, 192))
PACKED = dict(batching="pack", buckets=(4800,), bucket_patches=(384,))


def make(view, tokenizer_dir, indices=None, rows=4, epochs=None, feed_index=0, feed_count=1, **kw):
    cfg = sft_data(view.store_dir, **{**BUCKETS, **kw})
    indices = range(len(view)) if indices is None else indices
    encoder = EncodeSFTExample(tokenizer_dir, IMAGE_CONFIG, PROMPT, mask=cfg.mask)
    return SFTBatches(view, indices, cfg, encoder, rows=rows, epochs=epochs, feed_index=feed_index,
                      feed_count=feed_count)


def take(batches, n):
    return [next(batches) for _ in range(n)]


def same_batches(a, b) -> bool:
    return len(a) == len(b) and all(x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
                                    for x, y in zip(a, b))


def sequences(batch, encoded):
    """Returns the example name of every sequence in the batch, row-major, checking each is one of `encoded`."""
    by_ids = {}
    for name, ex in encoded.items():
        by_ids.setdefault(ex["input_ids"].tobytes(), []).append(name)
    names = []
    for r, a, b in iterate_examples(batch):
        found = by_ids.get(batch["input_ids"][r, a:b].tobytes())
        assert found, f"row {r} [{a}:{b}] is not an encoded example"
        names.append(found[0])
    return names


def test_the_loss_mask_covers_exactly_the_stored_turn(view, tokenizer_dir, encoder):
    tokenizer = load_tokenizer(tokenizer_dir)
    example = view[4]
    for mask, want in (("thought_and_action", example.target_text), ("action_only", example.target_action_text)):
        encoder.mask = mask
        try:
            enc = encoder.map(example)
        finally:
            encoder.mask = "thought_and_action"
        weighted = enc["input_ids"][enc["loss_mask"] == 1]
        assert tokenizer.decode(weighted) == want + "<|im_end|>"
        assert enc["loss_mask"][0] == 0
    # No reflection reaches a training prompt, though the store holds retried attempts with reflections.
    assert any(view[i].attempt > 1 for i in range(len(view)))
    assert all("Reflection" not in tokenizer.decode(e["input_ids"]) for e in [encoder.map(view[i]) for i in (0, 3)])


@pytest.mark.parametrize("mode", ["bucket", "pack"])
def test_batches_have_fixed_shapes_and_images_follow_their_tokens(view, tokenizer_dir, encoded, mode):
    kw = PACKED if mode == "pack" else {}
    rows = 3
    with make(view, tokenizer_dir, rows=rows, **kw) as batches:
        got = take(batches, 8)  # bucket: one epoch exactly; pack: more than one
    shapes = set()
    seen, packed_rows = [], 0
    for batch in got:
        width = batch["input_ids"].shape[1]
        assert width in (kw.get("buckets") or BUCKETS["buckets"])
        p = rows * (kw.get("bucket_patches") or BUCKETS["bucket_patches"])[0]
        assert batch["pixel_values"].shape == (p, IMAGE_CONFIG.patch_dim)
        shapes.add(width)
        validate_batch(batch, rows)  # the trainer's contract checks (first tokens, padding) pass
        names = sequences(batch, encoded)
        seen += names
        packed_rows += int((batch["segment_ids"].max(axis=1) > 1).sum())
        # Every image's patches sit in pixel_values in row-major token order, then zero rows.
        want_pixels = np.concatenate([encoded[n]["pixel_values"] for n in names])
        want_grids = np.concatenate([encoded[n]["image_grid_thw"] for n in names])
        np.testing.assert_array_equal(batch["pixel_values"][:len(want_pixels)], want_pixels)
        assert not batch["pixel_values"][len(want_pixels):].any()
        np.testing.assert_array_equal(batch["image_grid_thw"], want_grids)
        for (r, a, b), name in zip(iterate_examples(batch), names):
            np.testing.assert_array_equal(batch["loss_mask"][r, a + 1:b], encoded[name]["loss_mask"][1:])
            assert batch["loss_mask"][r, a] == 0
            image_tokens = int((batch["input_ids"][r, a:b] == 405).sum())
            assert image_tokens == int(np.prod(encoded[name]["image_grid_thw"], axis=1).sum()) // 4
    if mode == "bucket":
        assert shapes == {2304, 2432}  # both buckets used, never a third shape
    else:
        assert packed_rows > 0  # rows really hold several sequences
    assert sorted(seen[:len(view)]) == sorted(encoded)  # the first epoch: every example once


def test_order_is_fixed_by_the_seed_and_each_epoch_reshuffles(view, tokenizer_dir, encoded):
    with make(view, tokenizer_dir, seed=3) as a, make(view, tokenizer_dir, seed=3) as b, \
            make(view, tokenizer_dir, seed=4) as c:
        first, again, other = take(a, 12), take(b, 12), take(c, 6)
    assert same_batches(first, again)
    assert not same_batches(first[:6], other)
    order = [n for batch in first for n in sequences(batch, encoded)]
    epoch1, epoch2 = order[:len(view)], order[len(view):2 * len(view)]
    assert sorted(epoch1) == sorted(epoch2) == sorted(encoded)
    assert epoch1 != epoch2


@pytest.mark.parametrize("mode,workers", [("bucket", 0), ("pack", 0),
                                          pytest.param("bucket", 2, marks=pytest.mark.slow)])
def test_iterator_state_round_trip_resumes_exactly(view, tokenizer_dir, mode, workers):
    kw = {**(PACKED if mode == "pack" else {}), "worker_count": workers}
    with make(view, tokenizer_dir, rows=3, **kw) as run:
        take(run, 5)
        state = json.loads(json.dumps(run.get_state()))  # checkpoints store it as JSON
        want = take(run, 4)
    if mode == "pack":
        # A batch ended on an example that did not fit: the state points at it, not past it.
        assert state["parent"]["next_index"] < 5 * 3 * 2 + 1
    with make(view, tokenizer_dir, rows=3, **kw) as resumed:
        resumed.set_state(state)
        assert same_batches(take(resumed, 4), want)


def test_hosts_read_disjoint_equal_slices(view, tokenizer_dir, encoded):
    for count in (2, 3, 5):
        parts = [set(host_indices(range(len(view)), i, count).tolist()) for i in range(count)]
        assert len({len(p) for p in parts}) == 1
        assert sum(len(p) for p in parts) == len(set().union(*parts)) > len(view) - count
    seen = []
    for host in range(2):
        with make(view, tokenizer_dir, rows=4, epochs=1, feed_index=host, feed_count=2) as batches:
            seen.append([n for batch in batches for n in sequences(batch, encoded)])
    assert len(seen[0]) == len(seen[1]) == len(view) // 2
    assert not set(seen[0]) & set(seen[1])
    assert set(seen[0]) | set(seen[1]) == set(encoded)


def test_split_holds_out_whole_task_groups_the_same_way_every_time(view):
    split = split_by_task(view, 0.25, seed=1)
    again = split_by_task(view, 0.25, seed=1)
    assert np.array_equal(split.train, again.train) and np.array_equal(split.held_out, again.held_out)
    assert len(split.held_out_keys) == 2 and len(split.train) + len(split.held_out) == len(view)
    held_keys = {view.task_key(i) for i in split.held_out}
    assert held_keys == set(split.held_out_keys)
    assert not held_keys & {view.task_key(i) for i in split.train}
    assert split_by_task(view, 0.25, seed=2).held_out_keys != split.held_out_keys
    assert len(split_by_task(view, 0.0, seed=0).held_out) == 0
    with pytest.raises(ValueError, match=r"held_out_fraction = 0.99 holds out 8 of the 8 task groups"):
        split_by_task(view, 0.99, seed=0)


def test_examples_no_bucket_holds_are_refused_by_name_or_dropped_and_counted(view, tokenizer_dir):
    with make(view, tokenizer_dir, buckets=(2304,), bucket_patches=(192,)) as batches:
        with pytest.raises(OversizeError, match=r"SFT example synthetic\.form-\d#\d@\d/\d: \d+ tokens > the largest "
                                                r"bucket's 2304.*too_long='drop'"):
            take(batches, 4)
    with make(view, tokenizer_dir, buckets=(2304,), bucket_patches=(192,), too_long="drop") as batches:
        got = take(batches, 3)
        dropped = batches.get_state()["dropped"]
    assert all(b["input_ids"].shape == (4, 2304) for b in got) and dropped > 0
    with make(view, tokenizer_dir, buckets=(2432,), bucket_patches=(96,)) as batches:
        with pytest.raises(OversizeError, match=r"192 image patches > the row budget 96"):
            take(batches, 4)


@pytest.mark.parametrize("kw,message", [
    (dict(mask="everything"), r"config.data.mask = 'everything'; expected one of"),
    (dict(batching="zip"), r"config.data.batching = 'zip'"),
    (dict(too_long="truncate"), r"config.data.too_long = 'truncate'"),
    (dict(held_out_fraction=1.0), r"config.data.held_out_fraction = 1.0"),
    (dict(worker_count=-1), r"config.data.worker_count = -1"),
])
def test_bad_data_config_names_the_key(kw, message):
    with pytest.raises(ValueError, match=message):
        sft_data("x", **kw)


@pytest.mark.parametrize("lengths,patches,message", [
    ((), (), r"config.data.buckets is empty"),
    ((2048, 1024), (8, 8), r"strictly increasing"),
    ((2048,), (6,), r"multiples of 4"),
    ((2048, 4096), (8,), r"one patch budget per bucket"),
])
def test_bad_buckets_are_named(lengths, patches, message):
    with pytest.raises(ValueError, match=message):
        Buckets(lengths, patches, patch_dim=1536)


def test_unknown_data_key_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"config.data has unknown key\(s\) \['bucket'\]"):
        SFTDataConfig.from_config({"bucket": (1,)}, tmp_path)
    assert SFTDataConfig.from_config(base_config().data, tmp_path).store_dir == str(tmp_path / "store")
