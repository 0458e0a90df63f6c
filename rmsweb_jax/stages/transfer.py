"""The `transfer` stage: did Salvage-DS learn something that carries over, or only its own states?

    python -m rmsweb_jax.main --config=configs/demo.py --config.stages=transfer --workdir=/tmp/run

The table runs it (in <workdir>/variants/transfer/, linked to the main sft, mine and salvage folders) and prints
its figures; run alone, it reads the workdir's own. It compares the SFT export (hf:<workdir>/sft/hf) and the
Salvage-DS export (hf:<workdir>/salvage/hf), each policy measured the same way:
- on Salvage-DS's training states (mine's state set): K sampled turns per state, scored as mining scores them
  (mining/replay.py, config.mine's K, temperature, token limit, tau and seed: the same draws for both policies),
  so the share right, the critical count, and the states each policy does better on;
- on the held-out task groups of sft's split (data.held_out_fraction > 0; none of their steps was trained on,
  by SFT or RL): greedy per-step action accuracy (evaluate/step_accuracy.py), paired by step (McNemar).
A rise on the training states with none on held-out steps reads as memorised states; neither rising, as nothing
learned. Closed-loop success on held-out seeds is the eval stage's.

Writes <workdir>/transfer/report.json.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import time

import jax
import numpy as np

from rmsweb_jax import storage
from rmsweb_jax.agents.prompt import PromptBuilder, prompt_config_from
from rmsweb_jax.errors import UserError
from rmsweb_jax.evaluate.report import pct
from rmsweb_jax.evaluate.stats import mcnemar_exact, paired_bootstrap_interval
from rmsweb_jax.evaluate.step_accuracy import greedy_records, summarize
from rmsweb_jax.mining.replay import ReplaySettings, replay
from rmsweb_jax.mining.state_set import StateSet
from rmsweb_jax.sampling.chat_model import ChatModel
from rmsweb_jax.stages import links
from rmsweb_jax.stages.manifest import MODEL_LOADING
from rmsweb_jax.stages.sft_split import saved_split

# What the stage reads and writes (rmsweb_jax/stages/manifest.py decides from these whether it is up to date).
CONFIG_READS = ("transfer", "mine", "data", "prompt", *MODEL_LOADING, "seed")
INPUT_STAGES = {"sft": None, "mine": None, "salvage": None}
OUTPUTS = {"transfer/report.json": None}

NAME = "transfer"
POLICIES = {"sft": "sft", "rmsweb": "salvage"}  # report key -> the stage whose HF export it is
BOOTSTRAP_SAMPLES = 10_000


class StateExamples:
    """A state set as mining's replay reads a view: state i's SFTExample, rebuilt from its store."""

    def __init__(self, states: StateSet):
        self.states = states

    def __getitem__(self, index: int):
        return self.states.example(index)


def check_config(config, workdir) -> ReplaySettings:
    """Returns the training states' replay settings (config.mine's, every state replayed, no reference log-prob)
    once config.transfer's fields check; raises UserError naming the key."""
    cfg = config.transfer
    for key in ("batch_size", "max_new_tokens"):
        if isinstance(cfg[key], bool) or not isinstance(cfg[key], int) or cfg[key] < 1:
            raise UserError(f"config.transfer.{key} must be an int >= 1, got {cfg[key]!r}")
    if isinstance(cfg.held_out_steps, bool) or not isinstance(cfg.held_out_steps, int) or cfg.held_out_steps < 0:
        raise UserError(f"config.transfer.held_out_steps must be an int >= 0 (0 = every held-out step), "
                        f"got {cfg.held_out_steps!r}")
    try:
        settings = ReplaySettings.from_config(config.mine)
    except ValueError as err:
        raise UserError(str(err)) from None
    # The states are mine's references already (labelled steps were skipped there).
    return dataclasses.replace(settings, reference_logprob=False, skip_labels=())


def export_of(workdir: pathlib.Path, stage: str) -> str:
    """Returns the hf: spec of `stage`'s HF export in the workdir (as linked); raises UserError when it is missing."""
    folder = links.folder(workdir, stage) / "hf"
    if not (folder / "config.json").is_file():
        raise UserError(f"the transfer stage compares the sft and salvage exports, but {folder} holds no HF "
                        f"checkpoint: run the {stage} stage (config.train.export_hf=True) first")
    return f"hf:{folder}"


def training_states(accuracy: dict[str, list[float]], tau: float) -> dict:
    """Returns the training-state figures of both policies from their per-state sampled accuracies."""
    sft, rl = np.asarray(accuracy["sft"]), np.asarray(accuracy["rmsweb"])
    out = {"states": int(len(sft)), "tau": tau}
    for key, acc in (("sft", sft), ("rmsweb", rl)):
        out[key] = {"accuracy": float(acc.mean()) if len(acc) else None, "critical": int((acc < tau).sum())}
    out["difference"] = float((rl - sft).mean()) if len(sft) else None
    out["ci95"] = (list(paired_bootstrap_interval(rl.tolist(), sft.tolist(), samples=BOOTSTRAP_SAMPLES, seed=0))
                   if len(sft) else None)
    out["improved"], out["worsened"] = int((rl > sft).sum()), int((rl < sft).sum())
    return out


def held_out_steps(records: dict[str, list[dict]], task_groups: int) -> dict:
    """Returns the held-out step figures of both policies from their greedy records (the same steps, in order)."""
    sft = [r["correct"] for r in records["sft"]]
    rl = [r["correct"] for r in records["rmsweb"]]
    only_rl = sum(a and not b for a, b in zip(rl, sft))
    only_sft = sum(b and not a for a, b in zip(rl, sft))
    return {"steps": len(sft), "task_groups": task_groups,
            "sft": {k: v for k, v in summarize(records["sft"]).items() if k != "by_action"},
            "rmsweb": {k: v for k, v in summarize(records["rmsweb"]).items() if k != "by_action"},
            "only_rmsweb_right": only_rl, "only_sft_right": only_sft, "mcnemar_p": mcnemar_exact(only_rl, only_sft)}


def run(config, workdir: pathlib.Path) -> dict:
    """Measures both exports on the training states and the held-out steps; writes transfer/report.json."""
    cfg = config.transfer
    settings = check_config(config, workdir)
    workdir = storage.as_path(workdir)  # local, or gs://
    writer = jax.process_index() == 0  # every host replays (the sampling programs run on the global mesh); one writes
    specs = {key: export_of(workdir, stage) for key, stage in POLICIES.items()}
    states = StateSet(links.folder(workdir, "mine") / "states.arrayrecord")
    data, view, split, split_file = saved_split(config, workdir)
    held = split.held_out[:cfg.held_out_steps] if cfg.held_out_steps > 0 else split.held_out
    held_out = [view[int(i)] for i in held]
    builder = PromptBuilder(prompt_config_from(config))
    accuracy, records, seconds = {}, {}, {}
    print(f"[transfer] {specs['sft']} vs {specs['rmsweb']}: {len(states)} training states (K={settings.samples}, "
          f"temperature {settings.temperature:g}), {len(held_out)} held-out steps (greedy)")
    try:
        for key, spec in specs.items():
            start = time.perf_counter()
            chat_model = ChatModel.load(spec, workdir, config=config,
                                        max_batch=max(int(config.mine.max_batch), int(cfg.batch_size)))
            try:
                result = replay(StateExamples(states), range(len(states)), chat_model, builder, settings)
                accuracy[key] = [s.accuracy for s in sorted(result.states, key=lambda s: s.index)]
                records[key] = greedy_records(chat_model, builder, held_out, max_new_tokens=cfg.max_new_tokens,
                                              batch_size=int(cfg.batch_size), desc=f"{key} held-out steps")
            finally:
                chat_model.close()
            seconds[key] = round(time.perf_counter() - start, 2)
        per_state = [{"state_id": states[i].state_id, "task_id": states[i].task_id, "sft": accuracy["sft"][i],
                      "rmsweb": accuracy["rmsweb"][i]} for i in range(len(states))]
    finally:
        states.close()
    report = {"policies": specs, "split": str(split_file), "samples": settings.samples,
              "temperature": settings.temperature,
              "training_states": training_states(accuracy, settings.tau),
              "held_out_steps": held_out_steps(records, len(split.held_out_keys)) if held_out else None,
              "held_out_note": None if held_out else (
                  f"not measured: {split_file} holds out no task groups (config.data.held_out_fraction = "
                  f"{data.held_out_fraction})"),
              "seconds": seconds, "states": per_state, "held_out_records": records}
    if writer:
        storage.write_text_atomic(workdir / NAME / "report.json", json.dumps(report, indent=2))
    t, h = report["training_states"], report["held_out_steps"]
    print(f"[transfer] training states: sampled accuracy {pct(t['sft']['accuracy'])} (SFT) -> "
          f"{pct(t['rmsweb']['accuracy'])} (RMSWeb), critical {t['sft']['critical']} -> {t['rmsweb']['critical']}; "
          + (f"held-out steps: greedy {pct(h['sft']['accuracy'])} -> {pct(h['rmsweb']['accuracy'])} "
             f"(McNemar p {h['mcnemar_p']:.3g})" if h else report["held_out_note"]))
    return report

