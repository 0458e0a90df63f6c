"""salvage.batches: policy rows hold the exact sampled ids with loss on them, anchor rows only the reference
tool call; images repeat per row; fixed shapes, zero padding rows, the trainer's contract checks pass."""
import dataclasses

import numpy as np
import pytest

from rmsweb_jax.agents.prompt import PromptBuilder
from rmsweb_jax.data.batching import Buckets, OversizeError
from rmsweb_jax.processing.chat import END_OF_TURN, action_token_span, encode_chat, encode_for_training
from rmsweb_jax.salvage.batches import OLD_LOGPROBS, PromptTokens, anchor_row, policy_rows, salvage_batch
from rmsweb_jax.train.batch import validate_batch
from tests.salvage.conftest import IMAGE_CONFIG, PROMPT

PATCH_DIM = IMAGE_CONFIG.patch_dim
# Examples here are ~2200 tokens with 1-2 screenshots of 96 patches.
BUCKETS = Buckets((2304, 2560), (192, 192), PATCH_DIM, IMAGE_CONFIG.merge_size ** 2)


@dataclasses.dataclass(frozen=True)
class Sample:
    token_ids: tuple[int, ...]


@pytest.fixture(scope="module")
def state(view, tokenizer):
    """Returns (prompt tokens, reference encoding, G samples) of one stored step."""
    ex = view[1]
    messages = PromptBuilder(PROMPT).messages(ex.context())
    prompt = PromptTokens.from_encoded(encode_chat(tokenizer, messages, IMAGE_CONFIG), "s1", PATCH_DIM)
    reference = encode_for_training(tokenizer, messages, ex.target_text, IMAGE_CONFIG)
    end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    texts = ["Click it.\n<tool_call>\n{}\n</tool_call>", ex.target_text, "no call at all", "x" * 5]
    samples = [Sample(tuple(tokenizer.encode(t)) + ((end,) if i < 3 else ())) for i, t in enumerate(texts)]
    return prompt, reference, samples


def test_policy_rows_are_prompt_plus_exact_sampled_ids(state):
    prompt, _, samples = state
    advantages = np.array([0.5, -1.5, 0.0, 2.0], np.float32)
    valid = np.array([True, True, False, True])
    rows = policy_rows(prompt, samples, advantages, valid)
    assert [r["advantage"] for r in rows] == [0.5, -1.5, 2.0]
    for row, sample in zip(rows, [samples[0], samples[1], samples[3]]):
        n = len(prompt.input_ids)
        np.testing.assert_array_equal(row["input_ids"][:n], prompt.input_ids)
        np.testing.assert_array_equal(row["input_ids"][n:], sample.token_ids)
        assert np.all(row["loss_mask"][:n] == 0) and np.all(row["loss_mask"][n:] == 1)
        assert row["anchor"] == 0.0
        np.testing.assert_array_equal(row["pixel_values"], prompt.pixel_values)


def test_anchor_row_weights_only_the_reference_tool_call(state, tokenizer, view):
    _, reference, _ = state
    row = anchor_row(reference, tokenizer, "s1", PATCH_DIM)
    weighted = row["input_ids"][row["loss_mask"] == 1]
    assert tokenizer.decode(weighted) == view[1].target_action_text
    lo, hi = action_token_span(reference.input_ids, reference.prompt_length, tokenizer)
    assert row["loss_mask"].sum() == hi - lo and row["anchor"] == 1.0 and row["advantage"] == 0.0


def test_batch_layout_padding_and_contract(state, tokenizer):
    prompt, reference, samples = state
    policy = policy_rows(prompt, samples, np.array([1.0, -1.0, 0.5, -0.5]), np.ones(4, bool))
    anchors = [anchor_row(reference, tokenizer, f"a{i}", PATCH_DIM) for i in range(2)]
    batch, info = salvage_batch(policy, anchors, BUCKETS, 8, pad_id=0)
    assert (info.policy_rows, info.anchor_rows, info.anchor_rows_dropped, info.padding_rows) == (4, 2, 0, 2)
    length = batch["input_ids"].shape[1]
    assert length == info.length in BUCKETS.lengths
    checked = validate_batch(batch, 8)  # first tokens, padding, per-token fields: the trainer's checks
    assert checked[OLD_LOGPROBS].shape == (8, length) and not checked[OLD_LOGPROBS].any()
    np.testing.assert_array_equal(batch["advantage"], [1.0, -1.0, 0.5, -0.5, 0, 0, 0, 0])
    np.testing.assert_array_equal(batch["anchor"], [0, 0, 0, 0, 1, 1, 0, 0])
    assert not batch["loss_mask"][6:].any() and not batch["segment_ids"][6:].any()
    # The prompt's images repeat once per non-padding row, in row order.
    per_row = len(prompt.pixel_values)
    assert batch["image_grid_thw"].shape[0] == 6 * len(prompt.image_grid_thw)
    assert batch["pixel_values"].shape == (8 * BUCKETS.patches[BUCKETS.lengths.index(length)], PATCH_DIM)
    for r in range(6):
        np.testing.assert_array_equal(batch["pixel_values"][r * per_row:(r + 1) * per_row], prompt.pixel_values)
    assert not batch["pixel_values"][6 * per_row:].any()
    for r, row in enumerate(policy + anchors):
        n = len(row["input_ids"])
        np.testing.assert_array_equal(batch["input_ids"][r, :n], row["input_ids"])
        np.testing.assert_array_equal(batch["loss_mask"][r, :n], row["loss_mask"])


def test_anchor_rows_fill_what_is_left_and_the_rest_is_counted(state, tokenizer):
    prompt, reference, samples = state
    policy = policy_rows(prompt, samples, np.ones(4), np.ones(4, bool))
    anchors = [anchor_row(reference, tokenizer, f"a{i}", PATCH_DIM) for i in range(3)]
    batch, info = salvage_batch(policy, anchors, BUCKETS, 6)
    assert (info.anchor_rows, info.anchor_rows_dropped, info.padding_rows) == (2, 1, 0)
    with pytest.raises(ValueError, match="groups_per_step x group_size"):
        salvage_batch(policy, [], BUCKETS, 3)
    small = Buckets((1024,), (192,), PATCH_DIM, 4)
    with pytest.raises(OversizeError, match="s1#0"):
        salvage_batch(policy, [], small, 4)


def test_processes_take_their_share_of_the_same_rows(state, tokenizer):
    prompt, reference, samples = state
    policy = policy_rows(prompt, samples, np.arange(4.0), np.ones(4, bool))
    anchors = [anchor_row(reference, tokenizer, "a", PATCH_DIM)]
    whole, _ = salvage_batch(policy, anchors, BUCKETS, 8)
    halves = [salvage_batch(policy, anchors, BUCKETS, 8, feed_index=i, feed_count=2)[0] for i in range(2)]
    for key in ("input_ids", "loss_mask", "advantage", "anchor", OLD_LOGPROBS):
        np.testing.assert_array_equal(np.concatenate([h[key] for h in halves]), whole[key])
