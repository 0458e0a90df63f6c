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

import json
import pathlib
import time

from rmsweb_jax import storage
from rmsweb_jax.agents.prompt import PromptBuilder, prompt_config_from
from rmsweb_jax.errors import UserError
from rmsweb_jax.evaluate.step_accuracy import greedy_records, reference_agreement, summarize
from rmsweb_jax.stages import links
from rmsweb_jax.stages.manifest import MODEL_LOADING
from rmsweb_jax.stages.sft_split import saved_split

# What the stage reads and writes (rmsweb_jax/stages/manifest.py decides from these whether it is up to date).
# sft's split.json always (whatever action_accuracy.checkpoint names), through config.data's store.
CONFIG_READS = ("action_accuracy", "data", "prompt", *MODEL_LOADING, "seed")
INPUT_STAGES = {"sft": None}
OUTPUTS = {"sft_eval.json": None}

REPORT = "sft_eval.json"


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
    start = time.time()
    try:
        records = greedy_records(chat_model, builder, examples, max_new_tokens=cfg.max_new_tokens,
                                 batch_size=cfg.batch_size, desc="action_accuracy")
    finally:
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
