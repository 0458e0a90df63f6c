"""Grounding anchor rows: the ground stage's rows as anchor rows of Salvage-DS's updates, in the room the policy and
anchor rows leave; loss on the tool call only; the rows of update t are fixed by the seed (a resume takes the same)."""
import numpy as np
import pytest

from rmsweb_jax.agents.prompt import PromptBuilder
from rmsweb_jax.data.batching import Buckets
from rmsweb_jax.data.grounding import GroundingRows
from rmsweb_jax.processing.chat import encode_chat, encode_for_training
from rmsweb_jax.salvage.batches import PromptTokens, anchor_row, policy_rows, salvage_batch
from rmsweb_jax.salvage.grounding_anchor import GroundingAnchors
from rmsweb_jax.web.action_text import parse_action
from tests.salvage.conftest import IMAGE_CONFIG, PROMPT
from tests.salvage.test_batches import Sample

BUCKETS = Buckets((2304, 2560), (192, 192), IMAGE_CONFIG.patch_dim, IMAGE_CONFIG.merge_size ** 2)


def _anchors(view, tokenizer, per_update, seed=0, weight=1.0):
    rows = GroundingRows(view, np.arange(len(view)), PROMPT, ("click", "type"))
    return rows, GroundingAnchors(rows, per_update, tokenizer, IMAGE_CONFIG, PromptBuilder(PROMPT), seed=seed,
                                  weight=weight)


def test_each_update_takes_its_own_rows_of_one_seeded_order(view, tokenizer):
    rows, anchors = _anchors(view, tokenizer, per_update=3)
    names = [[r["name"] for r in anchors.for_update(t, room=10)] for t in range(4)]
    assert all(len(n) == 3 for n in names)
    flat = [n for update in names for n in update]
    assert len(set(flat)) == len(flat)  # consecutive updates take the next rows, none twice (while rows last)
    assert flat == [f"ground:{rows[int(i)].name}#anchor" for i in anchors.order[:12]]
    _, again = _anchors(view, tokenizer, per_update=3)
    assert [r["name"] for r in again.for_update(2, room=10)] == names[2]  # a resumed run's update 2
    _, other = _anchors(view, tokenizer, per_update=3, seed=1)
    assert [r["name"] for r in other.for_update(0, room=10)] != names[0]
    assert len(anchors.for_update(0, room=1)) == 1 and anchors.for_update(0, room=0) == []


def test_a_grounding_row_weights_only_its_tool_call(view, tokenizer):
    rows, anchors = _anchors(view, tokenizer, per_update=1)
    row = anchors.for_update(5, room=1)[0]
    source = rows[int(anchors.order[5])]
    assert row["anchor"] == 1.0 and row["advantage"] == 0.0
    learned = tokenizer.decode(row["input_ids"][row["loss_mask"] > 0])
    assert learned.startswith("<tool_call>") and learned.endswith("</tool_call>")
    assert parse_action("I act.\n" + learned).action == source.action
    prompt = encode_chat(tokenizer, PromptBuilder(PROMPT).messages(source.context()), IMAGE_CONFIG)
    np.testing.assert_array_equal(row["input_ids"][:len(prompt.input_ids)], prompt.input_ids)


def test_the_grounding_weight_scales_the_tool_call_tokens_weight_and_their_share_of_the_loss(view, tokenizer):
    import jax.numpy as jnp

    from rmsweb_jax.train.rl_loss import RLLossSettings, salvage_terms
    _, plain = _anchors(view, tokenizer, per_update=1)
    _, heavy = _anchors(view, tokenizer, per_update=1, weight=10.0)
    one, ten = plain.for_update(3, room=1)[0], heavy.for_update(3, room=1)[0]
    np.testing.assert_array_equal(one["input_ids"], ten["input_ids"])
    np.testing.assert_array_equal(ten["loss_mask"], 10.0 * one["loss_mask"])
    assert "weighted 10" in repr(heavy) and "weighted" not in repr(plain)
    # In the loss (token mean): a state anchor row's NLL a and a grounding row's g, each over n tool-call tokens,
    # average to (a + w g) / (1 + w) with the grounding row weighted w.
    n, a, g = 4, 2.0, 0.5
    logp = jnp.asarray([[-a] * n, [-g] * n])
    extras = {"advantage": jnp.zeros(2), "anchor": jnp.ones(2), "token_old_logprobs": jnp.zeros((2, n))}
    settings = RLLossSettings(clip_low=0.2, clip_high=0.28, aggregation="token_mean", kl_beta=0.0, anchor_weight=0.1)
    for w in (1.0, 10.0):
        weights = jnp.asarray([[1.0] * n, [w] * n])
        parts, _ = salvage_terms(logp, weights, extras, settings)
        assert float(parts.value()) == pytest.approx(0.1 * (a + w * g) / (1 + w), rel=1e-6)


def test_grounding_rows_fill_only_the_room_the_others_leave(view, tokenizer):
    ex = view[1]
    messages = PromptBuilder(PROMPT).messages(ex.context())
    prompt = PromptTokens.from_encoded(encode_chat(tokenizer, messages, IMAGE_CONFIG), "s1", IMAGE_CONFIG.patch_dim)
    _, anchors = _anchors(view, tokenizer, per_update=4)
    policy = policy_rows(prompt, [Sample(tuple(tokenizer.encode("x")))] * 2, np.ones(2), np.ones(2, bool))
    grounding = anchors.for_update(0, room=4)
    reference = encode_for_training(tokenizer, messages, ex.target_text, IMAGE_CONFIG)
    state_anchor = anchor_row(reference, tokenizer, "a", IMAGE_CONFIG.patch_dim)
    batch, info = salvage_batch(policy, [state_anchor], BUCKETS, 6, grounding=grounding)
    assert (info.policy_rows, info.anchor_rows, info.grounding_rows, info.padding_rows) == (2, 1, 3, 0)
    assert list(batch["anchor"]) == [0, 0, 1, 1, 1, 1]
    batch, info = salvage_batch(policy, [state_anchor] * 4, BUCKETS, 6, grounding=grounding)  # no room left
    assert (info.anchor_rows, info.anchor_rows_dropped, info.grounding_rows) == (4, 0, 0)
    batch, info = salvage_batch(policy, [], BUCKETS, 8, grounding=grounding)
    assert (info.grounding_rows, info.padding_rows) == (4, 2)

