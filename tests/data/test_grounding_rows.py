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
from rmsweb_jax.data.grounding import (TEXT_INPUT_ROLES, EncodeGroundingRow, GroundingRows, listed_elements,
                                       page_rows, parse_kinds)
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
    enc = encoder.map(rows[0])
    assert enc["name"] == rows[0].name and re.fullmatch(r".+/\d+#click:\d+", enc["name"])
    target = enc["input_ids"][enc["loss_mask"] > 0]
    assert 0 < len(target) < len(enc["input_ids"]) / 2
    assert enc["pixel_values"].shape[0] == 0  # the element list alone: no screenshot


def test_unknown_kinds_are_refused_naming_the_key():
    assert parse_kinds("click, type") == ("click", "type")
    with pytest.raises(UserError, match="config.ground.kinds = 'click,hover'"):
        parse_kinds("click,hover")
