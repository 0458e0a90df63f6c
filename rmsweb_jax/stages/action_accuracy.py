"""The `action_accuracy` stage: a policy's greedy per-step action accuracy on held-out collected steps.

    python -m rmsweb_jax.main --config=configs/demo.py --config.stages=action_accuracy --workdir=/tmp/run

For every held-out step (the task groups `sft` left out, read from the <workdir>/sft/split.json it
wrote, never recomputed: groups added to the store since are evaluated on neither side), the
model greedily writes its turn for the step's prompt (the shared prompt
builder, no reflections); the turn is parsed and compared with the stored action by
`web.semantics.same_action` on the stored observation (same element, same text, same keys, ...).
The checkpoint is config.action_accuracy.checkpoint (default hf:<workdir>/sft/hf, the sft export).
Writes <workdir>/sft_eval.json. An offline proxy.

Closed-loop success in the browser, on seeds disjoint from the training store, is the `eval` stage's
(rmsweb_jax/stages/eval.py); config.action_accuracy.mode "closed_loop", which did that before, now says so.
"""
from __future__ import annotations

import collections
import json
import pathlib
import time

from tqdm import tqdm

from rmsweb_jax import storage
from rmsweb_jax.agents.policy import PolicyOutput
from rmsweb_jax.agents.prompt import PromptBuilder, prompt_config_from
from rmsweb_jax.collect.sft_view import SFTExample
from rmsweb_jax.data.sft import example_name
from rmsweb_jax.errors import UserError
from rmsweb_jax.stages import links
from rmsweb_jax.stages.manifest import MODEL_LOADING
from rmsweb_jax.stages.sft_split import saved_split
from rmsweb_jax.web.semantics import same_action

# What the stage reads and writes (rmsweb_jax/stages/manifest.py decides from these whether it is up to date).
# sft's split.json always (whatever action_accuracy.checkpoint names), through config.data's store.
CONFIG_READS = ("action_accuracy", "data", "prompt", *MODEL_LOADING, "seed")
INPUT_STAGES = {"sft": None}
OUTPUTS = {"sft_eval.json": None}

REPORT = "sft_eval.json"


def score(output: PolicyOutput, example: SFTExample) -> tuple[bool, str | None]:
    """Returns (whether the policy's turn does what the stored step did, why not when it cannot be compared)."""
    if output.action is None:
        return False, output.error or "unparseable turn"
    observation = example.step.observation()
    try:
        return bool(same_action(output.action, example.step.action, observation)), None
    except ValueError as err:  # e.g. a pointer action whose point resolves to nothing comparable
        return False, f"not comparable: {err}"


def reference_agreement(examples: list[SFTExample]) -> float:
    """Returns the fraction of stored turns that, parsed again, score as their own action: 1.0 unless
    the scoring (parser, coordinates, same_action) disagrees with the store."""
    if not examples:
        return 0.0
    hits = 0
    for ex in examples:
        obs = ex.step.observation()
        hits += score(PolicyOutput.from_text(ex.target_text, obs), ex)[0]
    return hits / len(examples)


MODES = ("steps",)


def check_config(config, workdir) -> None:
    """Returns None once config.action_accuracy.mode is one this stage runs; raises UserError naming it.
    The pipeline calls it before any stage runs (stages/pipeline.py check_stages), run() as its first step."""
    mode = config.action_accuracy.mode
    if mode == "closed_loop":
        raise UserError("config.action_accuracy.mode 'closed_loop' is now the eval stage: run "
                        "--config.stages=eval (config.eval.policies, first_seed, num_seeds, max_steps)")
    if mode not in MODES:
        raise UserError(f"config.action_accuracy.mode = {mode!r}; expected one of {list(MODES)}")


def run(config, workdir: pathlib.Path) -> dict:
    """Evaluates the checkpoint on the held-out steps (workdir/sft_eval.json); returns the report."""
    check_config(config, workdir)
    return step_accuracy(config, workdir)


def step_accuracy(config, workdir: pathlib.Path) -> dict:
    """Evaluates the checkpoint on the held-out steps; writes workdir/sft_eval.json and returns it."""
    from rmsweb_jax.sampling.chat_model import ChatModel
    from rmsweb_jax.sampling.sampler import SamplingParams
    cfg = config.action_accuracy
    workdir = storage.as_path(workdir)  # local, or gs://
    data, view, split, split_file = saved_split(config, workdir)
    if not len(split.held_out):
        raise UserError(f"{split_file} holds out no task groups of {data.store_dir} (config.data.held_out_fraction "
                        f"is {data.held_out_fraction}): set it > 0 and rerun the sft stage")
    indices = split.held_out[:cfg.max_examples] if cfg.max_examples > 0 else split.held_out
    examples = [view[int(i)] for i in indices]
    spec = cfg.checkpoint or f"hf:{links.folder(workdir, 'sft') / 'hf'}"
    if spec.startswith("hf:") and not (storage.user_path(spec[3:]) / "config.json").is_file():
        raise UserError(f"config.action_accuracy.checkpoint {spec!r}: no HF checkpoint there (run the sft "
                        "stage with config.train.export_hf=True first, or point it at hf:/path)")
    chat_model = ChatModel.load(spec, workdir, config=config, max_batch=cfg.batch_size)
    builder = PromptBuilder(prompt_config_from(config))
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=0.0)
    records, start = [], time.time()
    bar = tqdm(total=len(examples), desc="action_accuracy", unit="step", dynamic_ncols=True)
    try:
        for lo in range(0, len(examples), cfg.batch_size):
            chunk = examples[lo:lo + cfg.batch_size]
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
        chat_model.close()
    report = summarize(records)
    report.update({"checkpoint": spec, "store_dir": data.store_dir, "held_out_task_groups": len(split.held_out_keys),
                   "split": str(split_file),
                   "reference_agreement": reference_agreement(examples), "seconds": round(time.time() - start, 2),
                   "examples": records})
    storage.write_text_atomic(workdir / REPORT, json.dumps(report, indent=2))
    print(f"[action_accuracy] {spec}: step accuracy {report['correct']}/{report['steps']} = "
          f"{100 * report['accuracy']:.1f}% (turns parsed {100 * report['parse_rate']:.1f}%) on held-out steps of "
          f"{len(split.held_out_keys)} task groups; report {workdir / REPORT}")
    return report


def summarize(records: list[dict]) -> dict:
    """Returns accuracy, parse rate and per-action-name accuracy over scored records."""
    n = len(records)
    by_name: dict[str, list[bool]] = collections.defaultdict(list)
    for r in records:
        by_name[r["reference"]].append(r["correct"])
    correct = sum(r["correct"] for r in records)
    return {"steps": n, "correct": correct, "accuracy": correct / n if n else 0.0,
            "parse_rate": sum(r["predicted"] is not None for r in records) / n if n else 0.0,
            "by_action": {k: {"steps": len(v), "accuracy": sum(v) / len(v)} for k, v in sorted(by_name.items())}}
