"""The failure-mode taxonomy of critical states, and the pure maps onto it.

A critical state is labelled with one of TAXONOMY; a routine state with ROUTINE. Three sources
of evidence map onto it:

- a sampled action compared with the reference (`web.semantics.compare_actions` CATEGORIES):
  `category_failure_mode`. The taxonomy is coarser than the categories on purpose: it answers
  "what kind of mistake" for a report and for RL state selection, not "which argument":

  | category | failure mode |
  |---|---|
  | unparseable | invalid_format |
  | wrong_action_type | wrong_action_type |
  | premature_answer | premature_stop (answer is the only action that ends an episode) |
  | wrong_element_same_role, wrong_element_other_role, no_element, wrong_point | wrong_element |
  | wrong_text, wrong_enter, wrong_clear, wrong_key, wrong_url, wrong_scroll | wrong_text |
  | wrong_answer | wrong_answer |

  `wrong_text` is "the right action with a wrong argument value": the typed text and its
  Enter / clear flags, a key chord, a URL, a scroll direction. They are all values the model
  writes in the tool call's arguments, as opposed to where it points (`wrong_element`).
- a turn that does not parse (`web.action_text.ParseError`, any reason; a sample cut off by the
  token limit lands here too): invalid_format.
- how an on-policy episode ended (`episode_failure_mode`): the same action repeated over the last
  `window` steps is a repetition loop (whether or not the step limit then ended it: the loop is the
  cause); otherwise an episode truncated by the step limit ran out of steps.

The failure mode of a state sampled K times is the most frequent mode among its wrong samples
(`majority_failure_mode`; ties go to the mode listed first in TAXONOMY, so it is deterministic).
"""
from __future__ import annotations

import collections
from typing import Iterable, Sequence

from rmsweb_jax.web.action_text import ParseError
from rmsweb_jax.web.semantics import CATEGORIES, Comparison

TAXONOMY = ("invalid_format", "wrong_action_type", "wrong_element", "wrong_text", "premature_stop", "wrong_answer",
            "repetition_loop", "out_of_steps")
ROUTINE = "routine"
FAILURE_MODES = (*TAXONOMY, ROUTINE)  # what CriticalState.failure_mode may hold

CATEGORY_MODES: dict[str, str] = {
    "unparseable": "invalid_format",
    "wrong_action_type": "wrong_action_type",
    "premature_answer": "premature_stop",
    "wrong_element_same_role": "wrong_element",
    "wrong_element_other_role": "wrong_element",
    "no_element": "wrong_element",
    "wrong_point": "wrong_element",
    "wrong_text": "wrong_text",
    "wrong_enter": "wrong_text",
    "wrong_clear": "wrong_text",
    "wrong_key": "wrong_text",
    "wrong_url": "wrong_text",
    "wrong_scroll": "wrong_text",
    "wrong_answer": "wrong_answer",
}
_missing = set(CATEGORIES) - {"same"} - set(CATEGORY_MODES)
if _missing:  # a category added to web/semantics.py must be placed here
    raise ImportError(f"compare_actions categories {sorted(_missing)} have no failure mode in mining/taxonomy.py")


def category_failure_mode(category: str) -> str | None:
    """Returns the failure mode of a compare_actions category; None for "same" (no failure).
    Raises ValueError for a name that is not a category."""
    if category == "same":
        return None
    if category not in CATEGORY_MODES:
        raise ValueError(f"{category!r} is not a compare_actions category; expected one of {CATEGORIES}")
    return CATEGORY_MODES[category]


def sample_failure_mode(outcome: Comparison | ParseError) -> str | None:
    """Returns the failure mode of one scored sample (a Comparison, or the ParseError of a turn
    that did not parse); None when the sample is the reference action."""
    if isinstance(outcome, ParseError):
        return "invalid_format"
    if isinstance(outcome, Comparison):
        return category_failure_mode(outcome.category)
    raise TypeError(f"expected a Comparison or ParseError, got {type(outcome).__name__}")


def episode_failure_mode(action_texts: Sequence[str], *, truncated: bool, window: int) -> str | None:
    """Returns "repetition_loop" when the last `window` actions of an episode (canonical tool-call
    texts) are identical, else "out_of_steps" when the step limit ended it (`truncated`), else None
    (the episode ended some other way: its last actions tell what went wrong)."""
    if window < 2:
        raise ValueError(f"a repetition needs a window of at least 2 actions, got {window}")
    tail = [t.strip() for t in action_texts[-window:]]
    if len(tail) == window and len(set(tail)) == 1 and tail[0]:
        return "repetition_loop"
    return "out_of_steps" if truncated else None


def majority_failure_mode(modes: Iterable[str | None]) -> str | None:
    """Returns the most frequent failure mode among `modes` (None entries are right samples and
    ignored); ties go to the mode first in TAXONOMY; None when no sample was wrong."""
    counts = collections.Counter(m for m in modes if m is not None)
    unknown = set(counts) - set(TAXONOMY)
    if unknown:
        raise ValueError(f"failure modes {sorted(unknown)} are not in TAXONOMY {TAXONOMY}")
    if not counts:
        return None
    return max(TAXONOMY, key=lambda m: (counts[m], -TAXONOMY.index(m)))
