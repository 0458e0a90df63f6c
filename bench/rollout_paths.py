"""The demo's rollouts under both group decoding paths: mine replay states/s and the Salvage-DS update's wall time
with cascade group decoding (`model.group_decode = "cascade"`, the default: one copy of a prompt's KV cache read
by its G rows) against the copied prompt cache (`"copy"`), in the same run.

The demo's settings (configs/demo.py: the random demo model, text-only element prompts, mine K = 8 x 96 new
tokens, Salvage-DS G = 8 x 96 new tokens, 2 groups per update) on a synthetic store of the demo's layout; the
stages themselves run (`run_stages`): one random checkpoint and one split, then mine -> salvage per path in its own
workdir. Mine's figure is its report's states/s after the first batch (sampling, scoring and reference log-probs
over the demo's 200 states, `--states` to change; the first batch carries the programs' compiles, ~6 s on 2 cores,
as long as ~90 states after it: with it in, a short replay measures the compiler); Salvage-DS's is the
median of the trainer's step_s over the timed updates (the first carries the compile): the draw (sampling,
scoring, gating), the batch and the step, each part's median printed apart (the learner's draw_s, batch_s,
sync_s; the rest of step_s is the optimizer step and the loop's own work). `--cascade-first` swaps the order (copy
first by default), for the machine's drift. Also printed: the share of decode row-steps spent on rows already
finished (issue 28, part 2: what compacting the live rows would save; a random model rarely stops, so it is low
here). `--quick` checks the script within the house's minute: mine only (4 states x K = 2 x 8 new tokens), no
Salvage-DS update.
    python bench/rollout_paths.py [--quick] [--cascade-first] [--states N]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import tempfile
import time

import common  # noqa: F401  (sets up sys.path / JAX_PLATFORMS)
import numpy as np
from group_sampling import cpu_model

PATHS = ("copy", "cascade")
UPDATE_PARTS = ("draw_s", "batch_s", "sync_s")  # the learner's timing of an update's parts (salvage/learner.py)


def demo_config(quick: bool, states: int | None):
    """Returns the demo config cut to this bench: mine and salvage only (quick: mine only), fewer updates; `states`
    mined (None: the demo's max_states)."""
    from configs.demo import get_config
    c = get_config()
    c.stages = ("mine",) if quick else ("mine", "salvage")
    c.train.metrics.every_steps = 1
    c.mine.max_states = 4 if quick else states or c.mine.max_states
    c.mine.batch_states = 4 if quick else c.mine.batch_states
    c.mine.samples = 2 if quick else c.mine.samples
    c.mine.max_new_tokens = 8 if quick else c.mine.max_new_tokens
    c.mine.reference_logprob = not quick and c.mine.reference_logprob
    c.salvage.train.total_steps = 8
    c.salvage.train.warmup_steps = 1
    c.salvage.groups_per_step, c.salvage.max_draws_per_step = 2, 4
    c.salvage.gates = "none"  # every draw accepted: the same work per update on both paths
    c.train.checkpoint.every_steps = c.salvage.train.total_steps
    c.train.checkpoint.async_save = False
    return c


class SamplerCalls:
    """Times every Sampler.generate_groups call by its shape (prompts x G) and counts its decode row-steps (rows x loop
    steps, of which on rows already finished)."""

    def __init__(self):
        self.total = self.finished = 0
        self.seconds: dict[str, list[float]] = {}

    def wrap(self, sampler):
        original = sampler.generate_groups

        def counted(prompts, group_size, *args, **kw):
            start = time.perf_counter()
            out = original(prompts, group_size, *args, **kw)
            self.seconds.setdefault(f"{len(prompts)}x{group_size}", []).append(time.perf_counter() - start)
            steps = int(out.lengths.max())  # the loop runs until every row is done or max_new_tokens
            self.total += out.lengths.size * steps
            self.finished += int((steps - out.lengths).sum())
            return out
        sampler.generate_groups = counted

    def medians(self) -> dict[str, float]:
        """Returns each shape's median call seconds after its first call (which compiles), where it had more."""
        return {shape: float(np.median(t[1:])) for shape, t in self.seconds.items() if len(t) > 1}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="mine only: 4 states x K=2 x 8 tokens (checks the script)")
    parser.add_argument("--cascade-first", action="store_true", help="run the cascade path first")
    parser.add_argument("--states", type=int, default=None, help="states mined per path (default: the demo's 200)")
    args = parser.parse_args()
    from rmsweb_jax.collect.store_fixture import write_synthetic_store
    from rmsweb_jax.main import run_stages
    from rmsweb_jax.model_init import load_model
    from rmsweb_jax.sampling import sampler as sampler_module
    from rmsweb_jax.stages.sft import load_split, split_path, split_record

    counts = {path: SamplerCalls() for path in PATHS}
    init = sampler_module.Sampler.__init__

    def counting_init(self, model, *a, **kw):  # every sampler the stages build counts for its path
        init(self, model, *a, **kw)
        counts[model.runtime.group_decode].wrap(self)
    sampler_module.Sampler.__init__ = counting_init

    config = demo_config(args.quick, args.states)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        base = demo_config(args.quick, args.states)
        base.model.init = "random:demo"
        checkpoint = load_model(base, root / "init")[1]
        seeds = max(4, -(-config.mine.max_states // 9))  # 4 tasks x 3 reference steps a group, 3/4 of them trained on
        store = write_synthetic_store(root / "store", tasks=4, seeds=seeds, viewport=(200, 120))
        config.data.store_dir = str(store)
        config.data.held_out_fraction = 0.25
        config.mine.checkpoint = config.salvage.init = f"hf:{checkpoint}"
        for path in PATHS[::-1] if args.cascade_first else PATHS:
            config.model.group_decode = path
            workdir = root / path
            split_path(workdir).parent.mkdir(parents=True)  # the split the sft stage would have written
            split_path(workdir).write_text(json.dumps(split_record(*load_split(config, workdir))))
            run_stages(config, workdir)
            mine = json.loads((workdir / "mine" / "report.json").read_text())["throughput"]
            steps = [json.loads(line) for f in sorted((workdir / "salvage").rglob("metrics.jsonl"))
                     for line in f.read_text().splitlines()]
            timed = [s for s in steps if "step_s" in s][1:]  # the first update carries the compile; none: --quick
            update = [s["step_s"] for s in steps if "step_s" in s]
            parts = {k: float(np.median([s[k] for s in timed if k in s])) for k in UPDATE_PARTS
                     if any(k in s for s in timed)}
            results[path] = {"states_per_s": mine["states_per_s"], "mine_sampling_share": mine["sampling_share"],
                             "after_first": mine["states_per_s_after_first_batch"],
                             "first_batch_s": mine["first_batch_seconds"],
                             "states": mine["states"], "update_s": float(np.median(update)) if update else None,
                             "updates": update, "parts": parts}
    print(f"cpu: {cpu_model()}")
    salvage = ("no Salvage-DS update (--quick)" if args.quick else
               f"Salvage-DS G={config.salvage.group_size} x {config.salvage.max_new_tokens} tokens, "
               f"{config.salvage.groups_per_step} group(s) per update, {config.salvage.train.total_steps} updates "
               "(the first untimed)")
    print(f"demo settings: mine K={config.mine.samples} x {config.mine.max_new_tokens} tokens over "
          f"{config.mine.max_states} states; {salvage}")
    calls = {path: counts[path].medians() for path in PATHS}
    shared = [shape for shape in calls["cascade"] if shape in calls["copy"]]
    print("sampler calls (prompts x G: median s after the shape's first call, cascade / copy): " + (", ".join(
        f"{shape}: {calls['cascade'][shape]:.3f} / {calls['copy'][shape]:.3f} s, "
        f"{calls['copy'][shape] / calls['cascade'][shape]:.2f}x" for shape in shared) or "no shape called twice"))
    for path in PATHS:
        r = results[path]
        share = counts[path].finished / max(counts[path].total, 1)
        update = "" if r["update_s"] is None else (
            f"   Salvage-DS update median {r['update_s']:.2f} s {[round(x, 2) for x in r['updates']]}, parts' medians "
            f"after the first: " + ", ".join(f"{k} {v:.2f}" for k, v in r["parts"].items()))
        after = "" if r["after_first"] is None else f", {r['after_first']:.3f} after the first batch"
        print(f"{path:>8}: mine {r['states_per_s']:.3f} states/s{after} ({r['states']} states, first batch "
              f"{r['first_batch_s']:.1f} s with its compiles, {r['mine_sampling_share']:.0%} sampling){update}   "
              f"decode row-steps on finished rows {share:.0%}")
    # The mining figure: states/s after the first batch, whose compiles would otherwise weigh as much as ~90 states
    # (--quick has one batch: its overall rate, compiles and all).
    key = "states_per_s" if args.quick else "after_first"
    mine_ratio = results["cascade"][key] / results["copy"][key]
    overall = results["cascade"]["states_per_s"] / results["copy"]["states_per_s"]
    update_ratio = None if args.quick else results["copy"]["update_s"] / results["cascade"]["update_s"]
    print(f"cascade / copy: mine states/s {mine_ratio:.2f}x " + ("(one batch, compiles included)" if args.quick else
          f"after the first batch ({overall:.2f}x overall)") + ("" if update_ratio is None else
          f", Salvage-DS update {update_ratio:.2f}x faster") + " (goal: > 1)")
    common.emit("rollout_paths", results["cascade"][key], results["copy"][key], "states/s",
                1.0, anchor_is="copy", mine_overall_ratio=round(overall, 3),
                salvage_update_speedup=None if update_ratio is None else round(update_ratio, 3),
                salvage_update_s_cascade=results["cascade"]["update_s"],
                salvage_update_s_copy=results["copy"]["update_s"],
                salvage_parts_cascade=results["cascade"]["parts"], salvage_parts_copy=results["copy"]["parts"],
                sampler_call_s_cascade=calls["cascade"], sampler_call_s_copy=calls["copy"],
                finished_row_step_share=round(counts["cascade"].finished / max(counts["cascade"].total, 1), 3))


if __name__ == "__main__":
    main()
