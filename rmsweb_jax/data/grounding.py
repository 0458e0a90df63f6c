"""Grounding rows: "click the <role> <name>" -> the action at that element's centre, on the stored pages.

    rows = GroundingRows(view, split.train, prompt_config, kinds=("click", "type"))
    rows[i]                       # a GroundingRow: .context() for PromptBuilder.messages, .target_text
    examples = GroundingExamples(rows, targets_per_row=6)   # examples[i]: up to 6 rows of one page
    encoder = EncodeGroundingRow(ckpt, images, prompt_config, mask=data.mask)
    with SFTBatches(examples, np.arange(len(examples)), data, encoder, rows=8) as batches: trainer.fit(batches)

Why: an SFT policy trained from random weights does not learn to read an element's coordinates off the element list (on
click-dialog its greedy click stayed near one point wherever the button was). Real GUI agents get that skill
from pretraining on many "instruction -> element location" pairs (SeeClick, UGround, OS-Atlas); this is that
at toy scale, built from the pages the collector already stored, so no browser runs.

Each row is the agent's own prompt (the same PromptBuilder, element list, coordinate grid, system prompt and
tokenizer as SFT) with no history, the instruction naming one element as the list shows it (its role and its
quoted, shortened name), and a target turn in the collector's format: a one-line thought and the tool call at
the centre the list prints for it. Elements whose description is not unique on the page are left out (the
instruction would not say which one is meant). "type" rows (text inputs only) type a word drawn by a digest of
the page and element, so the draw repeats across runs and processes.

Pages come from the steps `indices` picks (the training split's: held-out task groups never appear).

Several targets a row (GroundingExamples, config.ground.targets_per_row): a row's tokens are mostly the page's
element list (~400 agent-BPE tokens of a ~420-token row on the demo's pages), a target ~47. Up to k rows of one
page then share one prompt: the first row's prompt and target, then a follow-up user turn "Task: <instruction>"
and its target for each further row, every target trained. On the demo's store, 6 a row: 12,226 targets in 2,749
rows of 677 tokens on average (max 1,095): 4.4 targets a row, 2.8x the targets per token.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Sequence

import numpy as np

from rmsweb_jax.agents.policy import StepContext
from rmsweb_jax.agents.prompt import PromptConfig, shown_elements, shown_name
from rmsweb_jax.collect.sft_view import SFTView
from rmsweb_jax.data.sft import EncodeSFTExample, encode_turn
from rmsweb_jax.errors import UserError
from rmsweb_jax.web.action_text import format_action
from rmsweb_jax.web.actions import Action
from rmsweb_jax.web.elements import Element
from rmsweb_jax.web.observation import Observation

KINDS = ("click", "type")
TEXT_INPUT_ROLES = frozenset({"textbox", "searchbox"})
# Words a "type" row types: short, varied in length and letters, none of them an element name of the demo tasks.
TYPE_WORDS = ("Alice", "Bruno", "cedar", "Delta", "ember", "Faro", "gamma", "Hilde", "indigo", "Jun", "kestrel",
              "Lorna", "maple", "Nadia", "orbit", "Pavel", "quartz", "Rosa", "sable", "Tomas")


@dataclasses.dataclass(frozen=True)
class GroundingRow:
    """One grounding example: a stored page, an instruction naming one of its elements, the action on it."""

    task_id: str
    seed: int
    request_id: str
    page_step: int
    element_id: int
    kind: str
    instruction: str
    thought: str
    action: Action
    observation: Observation

    @property
    def name(self) -> str:
        """Returns "<request id>/<step>#<kind>:<element id>": which stored page and element the row is."""
        return f"{self.request_id}/{self.page_step}#{self.kind}:{self.element_id}"

    @property
    def target_text(self) -> str:
        """Returns the assistant turn: the thought, then the tool call (format_action's, as the collector's)."""
        return format_action(self.action, self.thought)

    def context(self) -> StepContext:
        """Returns the StepContext the prompt builder renders: the page with no history, as a first step."""
        return StepContext(task_id=self.task_id, instruction=self.instruction, observation=self.observation,
                           history=(), reflections=(), attempt=1, step=0)


def listed_elements(obs: Observation, config: PromptConfig) -> list[Element]:
    """Returns the elements the prompt's element list shows, in its order: the first config.max_elements."""
    return shown_elements(obs)[:config.max_elements]


def element_description(element: Element, config: PromptConfig) -> str:
    """Returns how an instruction names `element`: its role and its name as the element list prints it (JSON-quoted,
    cut to config.max_element_name characters); the role alone for an unnamed element."""
    name = shown_name(element.name, config)
    return f"{element.role} {json.dumps(name, ensure_ascii=False)}" if name.strip() else element.role


def page_rows(task_id: str, seed: int, request_id: str, page_step: int, obs: Observation, config: PromptConfig,
              kinds: Sequence[str]) -> list[GroundingRow]:
    """Returns the grounding rows of one page: for each listed element whose description is unique on the page, a
    click row ("click" in kinds) and, for a text input, a type row ("type" in kinds); the point is the element's
    centre in the observation's coordinate space (what the element list prints)."""
    shown = listed_elements(obs, config)
    described = [(e, element_description(e, config)) for e in shown]
    counts: dict[str, int] = {}
    for _, d in described:
        counts[d] = counts.get(d, 0) + 1
    rows = []
    for element, description in described:
        if counts[description] > 1:
            continue
        point = obs.coordinate_space.from_css(element.bbox.center, obs.viewport)
        common = dict(task_id=task_id, seed=seed, request_id=request_id, page_step=page_step, element_id=element.id,
                      observation=obs)
        if "click" in kinds:
            rows.append(GroundingRow(kind="click", instruction=f"Click the {description}.",
                                     thought=f"I click the {description}.", action=Action.click(*point), **common))
        if "type" in kinds and element.role in TEXT_INPUT_ROLES:
            word = TYPE_WORDS[_digest(request_id, page_step, element.id) % len(TYPE_WORDS)]
            rows.append(GroundingRow(kind="type", instruction=f"Type {json.dumps(word)} into the {description}.",
                                     thought=f"I type {json.dumps(word)} into the {description}.",
                                     action=Action.type_text(word, coordinate=point), **common))
    return rows


def parse_kinds(kinds: str) -> tuple[str, ...]:
    """Returns config.ground.kinds ("click,type") as a tuple; UserError for an unknown or empty list."""
    names = tuple(k.strip() for k in str(kinds).split(",") if k.strip())
    unknown = [k for k in names if k not in KINDS]
    if unknown or not names:
        raise UserError(f"config.ground.kinds = {kinds!r}; expected comma-separated kinds among {list(KINDS)}")
    return names


def parse_targets_per_row(value) -> int:
    """Returns config.ground.targets_per_row checked: an int >= 1; UserError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"config.ground.targets_per_row = {value!r}: expected an int >= 1 (grounding targets in one "
                        "training row)")
    return value


class GroundingRows:
    """The grounding rows of the pages of an SFTView's steps `indices`, as `len()` + `[i]` (GroundingRow).

    Built once by reading every chosen page (its elements decide its rows); a row is then read back from the
    store when asked for. Picklable (for Grain workers): it keeps the view and two index arrays.
    """

    def __init__(self, view: SFTView, indices: Sequence[int], config: PromptConfig, kinds: Sequence[str]):
        self.view, self.config, self.kinds = view, config, tuple(kinds)
        self.store_dir = view.store_dir  # SFTBatches checks the store's provenance
        pages, offsets, keys = [], [], set()
        for i in np.asarray(indices, np.int64):
            ex = view[int(i)]
            n = len(page_rows(ex.task_id, ex.seed, ex.request_id, ex.step.step, ex.step.observation(), config,
                              self.kinds))
            if n:
                pages.append(int(i))
                offsets.append(n)
                keys.add((ex.task_id, ex.seed))
        if not pages:
            raise UserError(f"no grounding rows: the {len(indices)} chosen pages of {view.store_dir} list no element "
                            f"with a unique description (config.ground.kinds = {','.join(self.kinds)!r})")
        self._page = np.asarray(pages, np.int64)
        self._end = np.cumsum(np.asarray(offsets, np.int64))
        self.task_keys = tuple(sorted(keys))

    @property
    def num_pages(self) -> int:
        """Returns how many stored pages give at least one row."""
        return len(self._page)

    def __len__(self) -> int:
        return int(self._end[-1])

    def __getitem__(self, index) -> GroundingRow:
        index = int(index)
        if not 0 <= index < len(self):
            raise IndexError(f"GroundingRows index {index} out of range for {len(self)} rows")
        p = int(np.searchsorted(self._end, index, side="right"))
        return self.page(p)[index - self.page_start(p)]

    @property
    def page_sizes(self) -> np.ndarray:
        """Returns each page's number of rows."""
        return np.diff(np.concatenate([[0], self._end]))

    def page_start(self, p: int) -> int:
        """Returns the index of page `p`'s first row."""
        return int(self._end[p - 1]) if p else 0

    def page(self, p: int) -> list[GroundingRow]:
        """Returns the rows of page `p` (0 <= p < num_pages), in their index order; one read of the store."""
        ex = self.view[int(self._page[p])]
        return page_rows(ex.task_id, ex.seed, ex.request_id, ex.step.step, ex.step.observation(), self.config,
                         self.kinds)

    def __repr__(self) -> str:
        return f"GroundingRows({len(self)} rows on {self.num_pages} pages of {self.view!r})"


class GroundingExamples:
    """The training examples of GroundingRows, as `len()` + `[i]` (a tuple of GroundingRow on one page): each page's
    rows cut into examples of up to `targets_per_row`. An example is the first row's prompt and target, then one
    short follow-up turn per further row ("Task: <instruction>" -> its target), so the page's element list, most
    of a row's tokens, is read once for several targets.

    With more than one target a row, a page's rows are first put in an order drawn from the page (a digest of its
    request id and step, so it repeats across runs): in list order a follow-up's element would be the next one on
    the list, a shortcut around reading the coordinates. One target a row keeps GroundingRows' order.
    """

    def __init__(self, rows: GroundingRows, targets_per_row: int):
        self.rows, self.targets_per_row = rows, parse_targets_per_row(targets_per_row)
        self.store_dir = rows.store_dir  # SFTBatches checks the store's provenance
        counts = -(-rows.page_sizes // targets_per_row)  # examples per page
        self._page = np.repeat(np.arange(rows.num_pages), counts)
        self._part = np.concatenate([np.arange(c) for c in counts])

    def __len__(self) -> int:
        return len(self._page)

    @property
    def num_targets(self) -> int:
        """Returns how many grounding rows (targets) the examples hold together."""
        return len(self.rows)

    def __getitem__(self, index) -> tuple[GroundingRow, ...]:
        index = int(index)
        if not 0 <= index < len(self):
            raise IndexError(f"GroundingExamples index {index} out of range for {len(self)} examples")
        page = self.rows.page(int(self._page[index]))
        if self.targets_per_row > 1:
            first = page[0]
            order = np.random.default_rng(_digest(first.request_id, first.page_step)).permutation(len(page))
            page = [page[i] for i in order]
        k, part = self.targets_per_row, int(self._part[index])
        return tuple(page[part * k:(part + 1) * k])

    def __repr__(self) -> str:
        return f"GroundingExamples({len(self)} examples of up to {self.targets_per_row} targets: {self.rows!r})"


class StepsWithGrounding:
    """SFT's training steps with grounding examples mixed in, as one source of `len()` + `[i]`: [0, len(indices))
    are the view's steps `indices` (SFTExample), then `count` grounding examples (tuples of GroundingRow) drawn
    without replacement (with, past their number) by `seed`. Keeps a model that learned grounding first from
    forgetting it while SFT trains on agent steps (config.sft.grounding_mix)."""

    def __init__(self, view: SFTView, indices: Sequence[int], examples: GroundingExamples, count: int, seed: int):
        self.view, self.examples = view, examples
        self.store_dir = view.store_dir  # SFTBatches checks the store's provenance
        self._steps = np.asarray(indices, np.int64)
        rng = np.random.default_rng(seed)
        self._extra = rng.choice(len(examples), size=count, replace=count > len(examples)) if count else \
            np.zeros(0, np.int64)

    @property
    def num_steps(self) -> int:
        """Returns how many SFT steps the source holds (the rest are grounding examples)."""
        return len(self._steps)

    def __len__(self) -> int:
        return len(self._steps) + len(self._extra)

    def __getitem__(self, index):
        index = int(index)
        if not 0 <= index < len(self):
            raise IndexError(f"StepsWithGrounding index {index} out of range for {len(self)} examples")
        if index < len(self._steps):
            return self.view[int(self._steps[index])]
        return self.examples[int(self._extra[index - len(self._steps)])]

    def __repr__(self) -> str:
        return f"StepsWithGrounding({len(self._steps)} steps + {len(self._extra)} grounding examples of {self.view!r})"


def follow_up(row: GroundingRow) -> str:
    """Returns the user turn that asks for a further target of the same page."""
    return f"Task: {row.instruction}"


class EncodeGroundingRow(EncodeSFTExample):
    """Grain map GroundingExamples' tuple of rows -> encoded row: SFT's encoder (one tokenizer per reading thread, the
    same prompt builder and loss mask) on the first row's prompt, with every row's target trained."""

    def map(self, rows: Sequence[GroundingRow]) -> dict[str, Any]:
        first = rows[0]
        name = first.name + (f"+{len(rows) - 1}" if len(rows) > 1 else "")
        return encode_turn(self.tokenizer, self.builder.messages(first.context()), first.target_text,
                           self.image_config, self.mask, name=name,
                           more_turns=[(follow_up(r), r.target_text) for r in rows[1:]])


class EncodeStepOrGrounding(EncodeGroundingRow):
    """Grain map of StepsWithGrounding's items: an SFT step as SFT encodes it, a grounding example as the ground
    stage does (one tokenizer, prompt builder and loss mask for both)."""

    def map(self, item) -> dict[str, Any]:
        if isinstance(item, tuple):
            return super().map(item)
        return EncodeSFTExample.map(self, item)


def _digest(*parts: Any) -> int:
    # blake2b, not hash(): Python salts str hashes per process, and the draw must repeat across runs.
    return int.from_bytes(hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest(), "big")
