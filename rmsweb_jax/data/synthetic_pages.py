"""Synthetic pages for pretraining the base policy to read its page: element lists that only reading answers.

    pages = SyntheticPages(seed=1_000_000, count=50_000, min_elements=4, max_elements=24)
    pages[i]                       # an Observation: elements only (the prompt's observation "elements"), no image
    rows = SyntheticGroundingRows(pages, prompt_config, kinds=("click", "type"))
    examples = GroundingExamples(rows, targets_per_row=6)          # as on stored pages (data/grounding.py)

Why: a policy trained from random weights on the demo's few pages memorises where its tasks' buttons sit instead of
reading the coordinates printed beside each element (bench/README.md, grounding). Here nothing is worth
memorising:
- every element's printed point (its box's centre in the 0-1000 grid) is drawn uniformly over the page;
- names come from a vocabulary of interface words and from made-up words built of syllables (tens of thousands of
  them), so a name is rarely seen twice;
- a page holds near-duplicates ("Submit" beside "Submit order") and one name under two roles ("link" and "button"
  "Details"), so the role and the whole name must be read;
- instructions are worded several ways, and "type" rows type a word drawn from the same large pool;
- the thought repeats the instructed element's line, its printed point included (I click the button "Save" at
  [412, 87].), so the call copies the point from the thought and the thought copies it from the list: a lookup
  by the words just written (an induction copy), not one across the turn.

Everything is a function of (seed, index): the same page on every machine, process and run. Seeds at or above
1,000,000 are the base's (data/grounding.py and the demo use MiniWoB++ seeds far below); a held-out set is another
seed's pages, so no held-out page is a training page.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Sequence

import numpy as np

from rmsweb_jax.agents.prompt import PromptConfig
from rmsweb_jax.data.grounding import TEXT_INPUT_ROLES, GroundingRow, element_description, page_rows
from rmsweb_jax.errors import UserError
from rmsweb_jax.web.elements import BBox, Element
from rmsweb_jax.web.observation import Observation

VIEWPORT = (1280, 720)
MAX_NAME = 36  # characters: the element list prints a name whole up to config.prompt.max_element_name (40 in every
# shipped config), so two names never read alike after a cut
# Roles the element list shows, with a box size (CSS px) typical of each; text inputs also get "type" rows.
ROLE_SIZES = {"button": (96, 32), "link": (120, 20), "textbox": (220, 30), "searchbox": (260, 30),
              "checkbox": (18, 18), "radio": (18, 18), "combobox": (180, 30), "tab": (90, 34),
              "menuitem": (150, 28), "option": (160, 24), "switch": (40, 22), "slider": (200, 16)}
ROLES = tuple(ROLE_SIZES)
UI_WORDS = (
    "Submit", "Cancel", "OK", "Save", "Delete", "Edit", "Search", "Next", "Previous", "Back", "Continue", "Close",
    "Open", "Apply", "Reset", "Send", "Reply", "Forward", "Archive", "Share", "Copy", "Paste", "Undo", "Redo",
    "Login", "Logout", "Sign", "Register", "Account", "Profile", "Settings", "Help", "Home", "Menu", "More", "Less",
    "Add", "Remove", "Upload", "Download", "Print", "Export", "Import", "Refresh", "Filter", "Sort", "Select",
    "All", "None", "Yes", "No", "Maybe", "Agree", "Accept", "Decline", "Confirm", "Buy", "Cart", "Checkout", "Pay",
    "Order", "Details", "Summary", "Review", "Rate", "Like", "Follow", "Subscribe", "Join", "Leave", "Invite",
    "Message", "Chat", "Call", "Email", "Phone", "Address", "City", "Country", "Name", "Password", "Username",
    "Date", "Time", "Start", "End", "From", "To", "Today", "Tomorrow", "Week", "Month", "Year", "Price", "Total",
    "Quantity", "Size", "Color", "Red", "Blue", "Green", "Black", "White", "Small", "Medium", "Large", "Page",
    "First", "Last", "Top", "Bottom", "Left", "Right", "Up", "Down", "New", "Old", "Recent", "Popular", "Terms",
    "Privacy", "Policy", "Contact", "About", "News", "Blog", "Events", "Photos", "Videos", "Music", "Files",
    "Folder", "Document", "Report", "Invoice", "Ticket", "Flight", "Hotel", "Booking", "Room", "Guest", "Note",
    "Task", "Project", "Team", "Member", "Group", "Comment", "Post", "Draft", "Inbox", "Sent", "Spam", "Trash")
_ONSETS = ("b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z", "br", "ch",
           "cl", "dr", "fl", "gr", "kr", "pl", "pr", "sh", "sl", "st", "th", "tr", "")
_NUCLEI = ("a", "e", "i", "o", "u", "ai", "ea", "ee", "oo", "ou", "y")
_CODAS = ("", "", "", "n", "r", "s", "t", "l", "m", "k", "nd", "st", "x")
CLICK_WORDINGS = ("Click the {d}.", "Click on the {d}.", "Press the {d}.", "Select the {d}.", "Choose the {d}.",
                  "Hit the {d}.", "Tap the {d}.", "Activate the {d}.")
TYPE_WORDINGS = ("Type {w} into the {d}.", "Enter {w} in the {d}.", "Write {w} in the {d}.",
                 "Fill the {d} with {w}.", "Put {w} into the {d}.")


def made_up_word(rng: np.random.Generator) -> str:
    """Returns a pronounceable made-up word of 1-3 syllables (capitalised half the time)."""
    word = "".join(_ONSETS[rng.integers(len(_ONSETS))] + _NUCLEI[rng.integers(len(_NUCLEI))]
                   + _CODAS[rng.integers(len(_CODAS))] for _ in range(int(rng.integers(1, 4))))
    return word.capitalize() if rng.random() < 0.5 else word


def _word(rng: np.random.Generator) -> str:
    return UI_WORDS[rng.integers(len(UI_WORDS))] if rng.random() < 0.5 else made_up_word(rng)


def _name(rng: np.random.Generator) -> str:
    return " ".join(_word(rng) for _ in range(int(rng.integers(1, 4))))


@dataclasses.dataclass(frozen=True)
class SyntheticPages:
    """`count` synthetic pages of seed `seed`, as `len()` + `[i]` (an Observation), each with min_elements to
    max_elements elements whose descriptions (role and name) are unique on the page."""

    seed: int
    count: int
    min_elements: int = 4
    max_elements: int = 24
    near_duplicates: float = 0.3  # share of a page's names that extend another name of the page by a word
    shared_names: float = 0.15    # share that repeat another name under another role

    def __post_init__(self):
        if self.count < 1 or not 1 <= self.min_elements <= self.max_elements:
            raise ValueError(f"SyntheticPages: count = {self.count}, elements {self.min_elements}..{self.max_elements}:"
                             " expected count >= 1 and 1 <= min_elements <= max_elements")

    def __len__(self) -> int:
        return self.count

    def roles(self, index: int) -> tuple[str, ...]:
        """Returns page `index`'s roles in list order (a draw of its own: row counts need no whole page)."""
        rng = np.random.default_rng([self.seed, index, 0])
        n = int(rng.integers(self.min_elements, self.max_elements + 1))
        return tuple(ROLES[i] for i in rng.integers(len(ROLES), size=n))

    def __getitem__(self, index) -> Observation:
        index = int(index)
        if not 0 <= index < self.count:
            raise IndexError(f"SyntheticPages index {index} out of range for {self.count} pages")
        rng = np.random.default_rng([self.seed, index, 1])
        elements, described = [], set()
        for role in self.roles(index):
            while True:  # a name this role does not have yet on the page
                draw, named = rng.random(), [e.name for e in elements]
                if named and draw < self.near_duplicates:
                    name = f"{named[rng.integers(len(named))]} {_word(rng)}"
                elif named and draw < self.near_duplicates + self.shared_names:
                    name = named[rng.integers(len(named))]
                else:
                    name = _name(rng)
                if len(name) <= MAX_NAME and (role, name) not in described:
                    break
            described.add((role, name))
            w, h = ROLE_SIZES[role]
            cx = float(rng.uniform(w / 2, VIEWPORT[0] - w / 2))
            cy = float(rng.uniform(h / 2, VIEWPORT[1] - h / 2))
            elements.append(Element(id=len(elements) + 1, role=role, name=name,
                                    bbox=BBox(cx - w / 2, cy - h / 2, float(w), float(h)), focusable=True))
        return Observation(url=f"synthetic://{self.seed}/{index}", title=_name(rng), screenshot=b"",
                           viewport=VIEWPORT, screenshot_size=VIEWPORT, elements=tuple(elements), focused_id=None,
                           instruction="")

    def typed_word(self, index: int, element_id: int) -> str:
        """Returns the word a "type" row of page `index` types into element `element_id` (from the same large
        pool as the names)."""
        return made_up_word(np.random.default_rng([self.seed, index, element_id, 7]))


class SyntheticGroundingRows:
    """The grounding rows of SyntheticPages, as GroundingRows gives those of stored pages (`len()`, `[i]`,
    `page(p)`, `page_sizes`, `num_pages`): each listed element a click row and, for a text input, a type row,
    worded one of several ways."""

    def __init__(self, pages: SyntheticPages, config: PromptConfig, kinds: Sequence[str]):
        if config.max_element_name < MAX_NAME:
            raise UserError(f"config.prompt.max_element_name = {config.max_element_name}: synthetic pages need "
                             f">= {MAX_NAME} (their names are printed whole)")
        self.pages, self.config, self.kinds = pages, config, tuple(kinds)
        self.store_dir = None  # no store: nothing to check the prompt's provenance against
        self._end = np.cumsum([self._size(p) for p in range(len(pages))])
        self.task_keys = ()

    def _size(self, p: int) -> int:
        """Returns page `p`'s number of rows from its roles alone (the listed ones: the first max_elements)."""
        shown = self.pages.roles(p)[:self.config.max_elements]
        return ("click" in self.kinds) * len(shown) + ("type" in self.kinds) * sum(
            r in TEXT_INPUT_ROLES for r in shown)

    @property
    def num_pages(self) -> int:
        return len(self.pages)

    @property
    def page_sizes(self) -> np.ndarray:
        return np.diff(np.concatenate([[0], self._end]))

    def __len__(self) -> int:
        return int(self._end[-1])

    def __getitem__(self, index) -> GroundingRow:
        index = int(index)
        if not 0 <= index < len(self):
            raise IndexError(f"SyntheticGroundingRows index {index} out of range for {len(self)} rows")
        p = int(np.searchsorted(self._end, index, side="right"))
        return self.page(p)[index - (int(self._end[p - 1]) if p else 0)]

    def page(self, p: int) -> list[GroundingRow]:
        """Returns the rows of page `p`, each instruction worded by a draw of the page and element."""
        obs = self.pages[p]
        rows = page_rows("synthetic", self.pages.seed, f"synthetic-{self.pages.seed}-{p}", 0, obs, self.config,
                         self.kinds)
        by_id = {e.id: e for e in obs.elements}
        out = []
        for row in rows:
            rng = np.random.default_rng([self.pages.seed, p, row.element_id, row.kind == "type"])
            description = element_description(by_id[row.element_id], self.config)
            # the thought repeats the element's line, point included: the call then copies it from just above
            x, y = row.action.coordinate
            if row.kind == "click":
                instruction = CLICK_WORDINGS[rng.integers(len(CLICK_WORDINGS))].format(d=description)
                out.append(dataclasses.replace(row, instruction=instruction,
                                               thought=f"I click the {description} at [{x}, {y}]."))
            else:
                word = json.dumps(self.pages.typed_word(p, row.element_id))
                instruction = TYPE_WORDINGS[rng.integers(len(TYPE_WORDINGS))].format(w=word, d=description)
                out.append(dataclasses.replace(
                    row, instruction=instruction, thought=f"I type {word} into the {description} at [{x}, {y}].",
                    action=dataclasses.replace(row.action, text=json.loads(word))))
        if len(out) != self._size(p):
            raise AssertionError(f"synthetic page {p} of seed {self.pages.seed}: {len(out)} rows, its roles say "
                                 f"{self._size(p)}")
        return out

    def __repr__(self) -> str:
        return f"SyntheticGroundingRows({len(self)} rows on {self.num_pages} pages of seed {self.pages.seed})"
