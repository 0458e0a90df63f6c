"""Synthetic pages for the base's grounding pretraining (rmsweb_jax/data/synthetic_pages.py): the same page for the
same (seed, index), descriptions unique on a page, near-duplicate and shared names present, printed points spread
over the whole grid, rows whose targets are the printed points and the instructed words."""
import collections
import json

import numpy as np
import pytest

from configs.common import base_config
from rmsweb_jax.agents.prompt import PromptBuilder, prompt_config_from
from rmsweb_jax.data.grounding import GroundingExamples, element_description
from rmsweb_jax.data.synthetic_pages import MAX_NAME, SyntheticGroundingRows, SyntheticPages

PAGES = SyntheticPages(seed=1_000_000, count=300)


@pytest.fixture(scope="module")
def prompt():
    c = base_config()
    c.prompt.observation, c.prompt.max_elements, c.prompt.max_element_name = "elements", 24, 40
    return prompt_config_from(c)


@pytest.fixture(scope="module")
def rows(prompt):
    return SyntheticGroundingRows(PAGES, prompt, ("click", "type"))


@pytest.fixture(scope="module")
def every_row(rows):
    """Returns every row, page by page (rows[i] builds row i's page)."""
    out = [r for p in range(rows.num_pages) for r in rows.page(p)]
    assert [out[i] for i in (0, 1234, len(out) - 1)] == [rows[i] for i in (0, 1234, len(rows) - 1)]
    return out


def test_a_page_is_a_function_of_its_seed_and_index():
    assert PAGES[7] == SyntheticPages(seed=1_000_000, count=8)[7]
    assert PAGES[7] != PAGES[8] and PAGES[7].elements != SyntheticPages(seed=1_000_001, count=8)[7].elements
    with pytest.raises(IndexError):
        PAGES[300]


def test_descriptions_are_unique_on_a_page_and_names_repeat_as_near_duplicates_and_across_roles(prompt):
    near, shared, names = 0, 0, collections.Counter()
    for page in (PAGES[i] for i in range(len(PAGES))):
        described = [element_description(e, prompt) for e in page.elements]
        assert len(set(described)) == len(described)
        page_names = [e.name for e in page.elements]
        names.update(page_names)
        assert max(map(len, page_names)) <= MAX_NAME
        near += sum(any(o != n and o.startswith(n + " ") for o in page_names) for n in set(page_names))
        shared += sum(c > 1 for c in collections.Counter(page_names).values())
    assert near > len(PAGES) and shared > len(PAGES) / 2, (near, shared)
    assert len(names) > 2000  # mostly made-up words: a name is rarely seen twice


def test_printed_points_cover_the_grid_and_rows_target_them(rows, every_row, prompt):
    assert len(rows) == int(rows.page_sizes.sum()) == len(every_row) > 3000
    points = np.asarray([r.action.coordinate for r in every_row])
    for axis in (0, 1):
        quarters = np.histogram(points[:, axis], bins=4, range=(0, 1000))[0] / len(points)
        assert quarters.min() > 0.15, quarters
    row = rows[5]
    listed = PromptBuilder(prompt).messages(row.context())[-1]["content"]
    text = "".join(part["text"] for part in listed if part.get("type") == "text")
    x, y = row.action.coordinate
    line = f"{element_description(next(e for e in row.observation.elements if e.id == row.element_id), prompt)} " \
           f"at [{x}, {y}]"
    assert line in text  # the point printed beside the instructed element
    for r in every_row[:200]:  # the thought repeats that line, so the call copies the point from just above
        described = element_description(next(e for e in r.observation.elements if e.id == r.element_id), prompt)
        assert r.thought.endswith(f" the {described} at [{r.action.coordinate[0]}, {r.action.coordinate[1]}].")


def test_type_rows_type_the_instructed_word_from_a_large_pool(every_row):
    typed = [r for r in every_row if r.kind == "type"]
    assert len(typed) > 200
    for r in typed[:50]:
        assert json.dumps(r.action.text) in r.instruction and r.action.coordinate is not None
    assert len({r.action.text for r in typed}) > 0.8 * len(typed)


def test_instructions_are_worded_several_ways_and_examples_group_a_page(rows, every_row):
    verbs = collections.Counter(r.instruction.split(" the ")[0] for r in every_row if r.kind == "click")
    assert len(verbs) == 8, verbs
    examples = GroundingExamples(rows, targets_per_row=6)
    some = [examples[i] for i in range(0, len(examples), 17)]
    assert all(0 < len(e) <= 6 and len({r.request_id for r in e}) == 1 for e in some)


def test_a_prompt_that_cuts_names_is_refused():
    c = base_config()
    c.prompt.max_element_name = 20
    with pytest.raises(ValueError, match="max_element_name = 20: synthetic pages need >= 36"):
        SyntheticGroundingRows(PAGES, prompt_config_from(c), ("click",))
