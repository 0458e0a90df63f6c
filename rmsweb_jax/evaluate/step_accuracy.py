"""Greedy per-step action accuracy: a policy's turn for a stored step's prompt, scored against the stored action.

The action_accuracy stage (a policy on the held-out task groups) and the transfer stage (SFT and RMSWeb on the
same held-out steps) both score with these; the ground stage scores grounding rows of held-out pages with
`grounding_accuracy`. An offline proxy: closed-loop success is the eval stage's."""
from __future__ import annotations

import collections
from typing import Sequence

from tqdm import tqdm

from rmsweb_jax.agents.policy import PolicyOutput
from rmsweb_jax.collect.sft_view import SFTExample
from rmsweb_jax.data.grounding import GroundingRow
from rmsweb_jax.data.sft import example_name
from rmsweb_jax.sampling.sampler import SamplingParams
from rmsweb_jax.web.semantics import same_action


def score(output: PolicyOutput, example: SFTExample) -> tuple[bool, str | None]:
    """Returns (whether the policy's turn does what the stored step did, why not when it cannot be compared)."""
    return score_action(output, example.step.action, example.step.observation())


def score_action(output: PolicyOutput, action, observation) -> tuple[bool, str | None]:
    """Returns (whether the policy's turn does `action` on `observation`, why not when it cannot be compared)."""
    if output.action is None:
        return False, output.error or "unparseable turn"
    try:
        return bool(same_action(output.action, action, observation)), None
    except ValueError as err:  # e.g. a pointer action whose point resolves to nothing comparable
        return False, f"not comparable: {err}"


def reference_agreement(examples: Sequence[SFTExample]) -> float:
    """Returns the fraction of stored turns that, parsed again, score as their own action: 1.0 unless
    the scoring (parser, coordinates, same_action) disagrees with the store."""
    if not examples:
        return 0.0
    hits = 0
    for ex in examples:
        obs = ex.step.observation()
        hits += score(PolicyOutput.from_text(ex.target_text, obs), ex)[0]
    return hits / len(examples)


def greedy_records(chat_model, builder, examples: Sequence[SFTExample], *, max_new_tokens: int, batch_size: int,
                   desc: str) -> list[dict]:
    """Returns one record per example: the model's greedy turn for the example's prompt (`builder`'s, no
    reflections), parsed and scored (`correct`, `error`), with the reference and predicted action names. A
    progress bar named `desc` shows the running accuracy."""
    params = SamplingParams(max_new_tokens=int(max_new_tokens), temperature=0.0)
    records = []
    bar = tqdm(total=len(examples), desc=desc, unit="step", dynamic_ncols=True)
    try:
        for lo in range(0, len(examples), batch_size):
            chunk = examples[lo:lo + batch_size]
            completions = chat_model.complete([builder.messages(ex.context()) for ex in chunk], params)
            for ex, completion in zip(chunk, completions):
                output = PolicyOutput.from_text(completion.text, ex.step.observation())
                correct, why = score(output, ex)
                records.append({"example": example_name(ex), "task_id": ex.task_id, "seed": ex.seed,
                                "reference": ex.step.action.name,
                                "predicted": None if output.action is None else output.action.name,
                                "correct": correct, "error": why, "finish_reason": completion.finish_reason,
                                "text": completion.text[:500]})
            bar.update(len(chunk))
            bar.set_postfix({"accuracy": f"{sum(r['correct'] for r in records) / len(records):.2f}"}, refresh=False)
    finally:
        bar.close()
    return records


def summarize(records: Sequence[dict]) -> dict:
    """Returns accuracy, parse rate and per-action-name accuracy over scored records."""
    n = len(records)
    by_name: dict[str, list[bool]] = collections.defaultdict(list)
    for r in records:
        by_name[r["reference"]].append(r["correct"])
    correct = sum(r["correct"] for r in records)
    return {"steps": n, "correct": correct, "accuracy": correct / n if n else 0.0,
            "parse_rate": sum(r["predicted"] is not None for r in records) / n if n else 0.0,
            "by_action": {k: {"steps": len(v), "accuracy": sum(v) / len(v)} for k, v in sorted(by_name.items())}}


def grounding_accuracy(chat_model, builder, rows: Sequence[GroundingRow], *, max_new_tokens: int,
                       batch_size: int) -> dict:
    """Returns the model's greedy accuracy on grounding rows (its turn for the row's prompt does the row's action on
    the row's page, `same_action`: inside the element's box): rows, correct, accuracy, parse_rate; exact (the
    row's action itself: the printed centre, the instructed word) and exact_rate; typed_rows and typed_exact (type
    rows whose text is the instructed word); by_task {task: [correct, rows]}."""
    params = SamplingParams(max_new_tokens=int(max_new_tokens), temperature=0.0)
    correct, parsed, exact, typed, typed_exact = 0, 0, 0, 0, 0
    by_task = collections.defaultdict(lambda: [0, 0])
    for lo in range(0, len(rows), batch_size):
        chunk = rows[lo:lo + batch_size]
        completions = chat_model.complete([builder.messages(r.context()) for r in chunk], params)
        for row, completion in zip(chunk, completions):
            output = PolicyOutput.from_text(completion.text, row.observation)
            hit = score_action(output, row.action, row.observation)[0]
            correct, parsed = correct + hit, parsed + (output.action is not None)
            exact += output.action == row.action
            if row.action.name == "type":
                typed += 1
                typed_exact += output.action is not None and output.action.text == row.action.text
            by_task[row.task_id][0] += hit
            by_task[row.task_id][1] += 1
    n = len(rows)
    return {"rows": n, "correct": correct, "accuracy": correct / n if n else 0.0,
            "parse_rate": parsed / n if n else 0.0, "exact": exact, "exact_rate": exact / n if n else 0.0,
            "typed_rows": typed, "typed_exact": typed_exact,
            "by_task": {k: v for k, v in sorted(by_task.items())}}
