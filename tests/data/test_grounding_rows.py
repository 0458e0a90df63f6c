"""Grounding rows on the synthetic store (tests/data/conftest.py): each names one listed element and acts at the
centre the agent's element list prints for it, in the agent's own prompt; held-out task groups never appear."""
import dataclasses
import json
import re

import numpy as np
import pytest

from configs.common import base_config
from configs.demo import get_config as demo_config
from rmsweb_jax.agents.prompt import PromptBuilder, prompt_config_from
from rmsweb_jax.data.grounding import (TEXT_INPUT_ROLES, EncodeGroundingRow, GroundingExamples, GroundingRows,
                                       follow_up, listed_elements, page_rows, parse_kinds)
from rmsweb_jax.data.sft import split_by_task
from rmsweb_jax.errors import UserError
from rmsweb_jax.web.action_text import parse_action
from rmsweb_jax.web.elements import BBox, Element
from tests.data.conftest import IMAGE_CONFIG


@pytest.fixture(scope="module")
def prompt():
    return prompt_config_from(demo_config())  # the demo's: element list, compact system prompt, 0-1000 grid


@pytest.fixture(scope="module")
def rows(view, prompt):
    return GroundingRows(view, np.arange(len(view)), prompt, ("click", "type"))


def test_every_row_acts_at_the_listed_centre_of_the_element_it_names(rows, prompt):
    builder = PromptBuilder(prompt)
    assert len(rows) > 0
    kinds = set()
    for i in range(len(rows)):
        row = rows[i]
        kinds.add(row.kind)
        obs = row.observation
        element = next(e for e in obs.elements if e.id == row.element_id)
        # The point is the element's box centre in the 0-1000 grid, computed here from the box itself.
        vw, vh = obs.viewport
        cx, cy = element.bbox.x + element.bbox.width / 2, element.bbox.y + element.bbox.height / 2
        expected = (round(cx / vw * 1000), round(cy / vh * 1000))
        parsed = parse_action(row.target_text)
        assert parsed.action.coordinate == expected, row.name
        assert parsed.action.name == ("left_click" if row.kind == "click" else "type")
        # The instruction names the element as the prompt's list shows it, and the list prints that point.
        messages = builder.messages(row.context())
        user = "".join(p["text"] for p in messages[1]["content"] if p["type"] == "text")
        assert f"Task: {row.instruction}" in user
        assert f'{element.role} {json.dumps(element.name)}' in row.instruction
        line = re.escape(f"] {element.role} {json.dumps(element.name)}") + r"[^\n]* at " + \
            re.escape(f"[{expected[0]}, {expected[1]}]\n")
        assert len(re.findall(line, user)) == 1, (line, user)
        assert "Previous steps" not in user  # no history: short rows
        assert messages[0]["content"].startswith("Web agent:")  # the compact system prompt
        if row.kind == "type":
            assert element.role in TEXT_INPUT_ROLES and parsed.action.text in row.instruction
    assert kinds == {"click", "type"}


def test_rows_cover_each_listed_element_of_each_page_once_per_kind(view, rows, prompt):
    ex = view[0]
    obs = ex.step.observation()
    page = page_rows(ex.task_id, ex.seed, ex.request_id, ex.step.step, obs, prompt, ("click", "type"))
    listed = listed_elements(obs, prompt)
    assert sorted(r.element_id for r in page if r.kind == "click") == sorted(e.id for e in listed)
    assert [r.element_id for r in page if r.kind == "type"] == [e.id for e in listed if e.role == "textbox"]
    # Every step of the view is a page with rows: the count is the sum of the pages' rows.
    total = sum(len(page_rows(view[i].task_id, view[i].seed, view[i].request_id, view[i].step.step,
                              view[i].step.observation(), prompt, ("click", "type"))) for i in range(len(view)))
    assert len(rows) == total and rows.num_pages == len(view)


def test_an_element_the_instruction_cannot_single_out_gets_no_row(prompt, view):
    obs = view[0].step.observation()
    twin = Element(id=99, role="button", name="Submit", bbox=BBox(5, 5, 20, 10), focusable=True, z=2)
    doubled = dataclasses.replace(obs, elements=(*obs.elements, twin))
    page = page_rows("t", 0, "r", 0, doubled, prompt, ("click",))
    assert not any(r.instruction == 'Click the button "Submit".' for r in page)
    assert any(r.instruction == 'Click the button "Cancel".' for r in page)


def test_only_the_training_split_pages_are_used(view, prompt):
    split = split_by_task(view, held_out_fraction=0.25, seed=0)
    assert split.held_out_keys
    rows = GroundingRows(view, split.train, prompt, ("click",))
    seen = {(rows[i].task_id, rows[i].seed) for i in range(len(rows))}
    assert seen == set(rows.task_keys)
    assert not seen & set(split.held_out_keys)
    assert seen == {view.task_key(i) for i in split.train}


def test_rows_encode_with_the_loss_on_the_turn_only(rows, tokenizer_dir, prompt):
    encoder = EncodeGroundingRow(tokenizer_dir, IMAGE_CONFIG, prompt, mask=base_config().data.mask)
    enc = encoder.map((rows[0],))
    assert enc["name"] == rows[0].name and re.fullmatch(r".+/\d+#click:\d+", enc["name"])
    target = enc["input_ids"][enc["loss_mask"] > 0]
    assert 0 < len(target) < len(enc["input_ids"]) / 2
    assert enc["pixel_values"].shape[0] == 0  # the element list alone: no screenshot


@pytest.mark.parametrize("k", [1, 3, 100])
def test_examples_hold_each_row_once_with_up_to_k_targets_of_one_page(rows, k):
    examples = GroundingExamples(rows, k)
    seen = []
    for i in range(len(examples)):
        ex = examples[i]
        assert 1 <= len(ex) <= k
        assert len({(r.request_id, r.page_step) for r in ex}) == 1  # one page
        seen += [r.name for r in ex]
    assert sorted(seen) == sorted(rows[i].name for i in range(len(rows)))  # every row, once
    assert examples.num_targets == len(rows)
    assert len(examples) == sum(-(-n // k) for n in rows.page_sizes)
    if k == 1:  # one target a row: GroundingRows' own order
        assert seen == [rows[i].name for i in range(len(rows))]
    if k == 100:  # a whole page a row, in an order drawn per page, not the list's
        assert len(examples) == rows.num_pages
        assert any([r.name for r in examples[i]] != [r.name for r in rows.page(i)] for i in range(len(examples)))
        again = GroundingExamples(rows, k)  # the draw repeats
        assert all([r.name for r in again[i]] == [r.name for r in examples[i]] for i in range(len(examples)))


def test_a_row_of_several_targets_trains_each_after_its_own_question(rows, tokenizer_dir, prompt):
    encoder = EncodeGroundingRow(tokenizer_dir, IMAGE_CONFIG, prompt, mask=base_config().data.mask)
    examples = GroundingExamples(rows, 4)
    i = next(i for i in range(len(examples)) if len(examples[i]) >= 3)
    ex = examples[i]
    enc = encoder.map(ex)
    assert enc["name"] == f"{ex[0].name}+{len(ex) - 1}"
    masked = np.flatnonzero(enc["loss_mask"])
    spans = np.split(masked, np.flatnonzero(np.diff(masked) > 1) + 1)
    tokenizer = encoder.tokenizer
    # One learned span per target, each its own row's action; the follow-up asks for that row's element.
    assert [parse_action(tokenizer.decode(enc["input_ids"][s])).action for s in spans] == [r.action for r in ex]
    for span, row in zip(spans[1:], ex[1:]):
        before = tokenizer.decode(enc["input_ids"][span[0] - 40:span[0]])
        assert follow_up(row) in before
    alone = encoder.map((ex[0],))  # the first target is encoded as a one-target row, then the rest follow
    n = len(alone["input_ids"])
    np.testing.assert_array_equal(enc["input_ids"][:n - 1], alone["input_ids"][:n - 1])


def test_steps_with_grounding_are_the_steps_then_the_drawn_examples(view, rows, tokenizer_dir, prompt):
    from rmsweb_jax.collect.sft_view import SFTExample
    from rmsweb_jax.data.grounding import EncodeStepOrGrounding, StepsWithGrounding
    from rmsweb_jax.data.sft import EncodeSFTExample
    examples = GroundingExamples(rows, 3)
    steps = np.arange(0, len(view), 2)
    mixed = StepsWithGrounding(view, steps, examples, count=5, seed=0)
    assert len(mixed) == len(steps) + 5 and mixed.num_steps == len(steps) and mixed.store_dir == view.store_dir
    assert [mixed[i].request_id for i in range(len(steps))] == [view[int(i)].request_id for i in steps]
    drawn = [mixed[len(steps) + j] for j in range(5)]
    assert all(isinstance(d, tuple) and d for d in drawn)
    assert len({d[0].name for d in drawn}) == 5  # without replacement while there are enough
    assert [d[0].name for d in drawn] == [StepsWithGrounding(view, steps, examples, 5, seed=0)[len(steps) + j][0].name
                                          for j in range(5)]  # the draw repeats
    many = StepsWithGrounding(view, steps, examples, count=len(examples) + 4, seed=1)  # more than there are
    assert len(many) == len(steps) + len(examples) + 4
    with pytest.raises(IndexError):
        mixed[len(mixed)]
    # One encoder for both kinds: a step as SFT encodes it, an example as the ground stage does.
    mask = base_config().data.mask
    encoder = EncodeStepOrGrounding(tokenizer_dir, IMAGE_CONFIG, prompt, mask=mask)
    assert isinstance(mixed[0], SFTExample)
    want = EncodeSFTExample(tokenizer_dir, IMAGE_CONFIG, prompt, mask=mask).map(mixed[0])
    np.testing.assert_array_equal(encoder.map(mixed[0])["input_ids"], want["input_ids"])
    want = EncodeGroundingRow(tokenizer_dir, IMAGE_CONFIG, prompt, mask=mask).map(drawn[0])
    np.testing.assert_array_equal(encoder.map(drawn[0])["loss_mask"], want["loss_mask"])


def test_bad_targets_per_row_is_refused_naming_the_key(rows):
    for bad in (0, -1, 2.0, True):
        with pytest.raises(UserError, match=rf"config.ground.targets_per_row = {bad!r}: expected an int >= 1"):
            GroundingExamples(rows, bad)


class _Answers:
    """A chat model that answers each prompt with a text chosen by the test (the probe scores text, not sampling)."""

    def __init__(self, answer):
        self.answer, self.calls = answer, 0

    def complete(self, conversations, params):
        import types
        self.calls += 1
        assert params.temperature == 0.0  # greedy
        return [types.SimpleNamespace(text=self.answer(c), finish_reason="stop") for c in conversations]


def test_the_grounding_probe_scores_each_rows_action_on_its_page(rows, prompt):
    from rmsweb_jax.evaluate.step_accuracy import grounding_accuracy
    builder = PromptBuilder(prompt)
    chosen = [rows[i] for i in range(min(len(rows), 20))]
    by_prompt = {json.dumps(builder.messages(r.context()), sort_keys=True): r for r in chosen}

    def right(conversation):
        return by_prompt[json.dumps(conversation, sort_keys=True)].target_text

    got = grounding_accuracy(_Answers(right), builder, chosen, max_new_tokens=32, batch_size=6)
    assert got["correct"] == got["rows"] == len(chosen) and got["accuracy"] == 1.0 and got["parse_rate"] == 1.0
    assert sum(n for _, n in got["by_task"].values()) == len(chosen)

    # A click at the far corner, where no listed element is: every row missed, still parsed.
    corner = 'I click.\n<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", ' \
        '"coordinate": [999, 999]}}\n</tool_call>'
    got = grounding_accuracy(_Answers(lambda c: corner), builder, chosen, max_new_tokens=32, batch_size=6)
    assert got["correct"] == 0 and got["parse_rate"] == 1.0
    got = grounding_accuracy(_Answers(lambda c: "no tool call"), builder, chosen, max_new_tokens=32, batch_size=6)
    assert got["correct"] == 0 and got["parse_rate"] == 0.0


def test_unknown_kinds_are_refused_naming_the_key():
    assert parse_kinds("click, type") == ("click", "type")
    with pytest.raises(UserError, match="config.ground.kinds = 'click,hover'"):
        parse_kinds("click,hover")
