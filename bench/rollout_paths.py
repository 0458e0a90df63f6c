"""The demo's rollouts under both group decoding paths: mine replay states/s and the Salvage-DS update's wall time
with cascade group decoding (`model.group_decode = "cascade"`, the default: one copy of a prompt's KV cache read
by its G rows) against the copied prompt cache (`"copy"`), in the same run.

The demo's settings (configs/demo.py: the random demo model, text-only element prompts, mine K = 8 x 96 new
tokens, Salvage-DS G = 8 x 96 new tokens, 2 groups per update) on a synthetic store of the demo's layout; the
stages themselves run (`run_stages`): one random checkpoint and one split, then mine -> salvage per path in its own
workdir. Mine's figure is its report's states/s (sampling, scoring and reference log-probs); Salvage-DS's is the
median of the trainer's step_s over the timed updates (the first carries the compile): the draw (sampling,
scoring, gating), the batch and the step. `--cascade-first` swaps the order (copy first by default), for the
machine's drift. Also printed: the share of decode row-steps spent on rows already finished (issue 28, part 2:
what compacting the live rows would save; a random model rarely stops, so it is low here).
    python bench/rollout_paths.py [--quick] [--cascade-first]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import tempfile

import common  # noqa: F401  (sets up sys.path / JAX_PLATFORMS)
import numpy as np
from group_sampling import cpu_model

PATHS = ("copy", "cascade")


def demo_config(quick: bool):
    """Returns the demo config cut to this bench: mine and salvage only, fewer states and updates."""
    from configs.demo import get_config
    c = get_config()
    c.stages = ("mine", "salvage")
    c.train.metrics.every_steps = 1
    c.mine.max_states = 8 if quick else 16
    c.mine.batch_states = 4 if quick else c.mine.batch_states
    c.mine.samples = 4 if quick else c.mine.samples
    c.mine.max_new_tokens = 24 if quick else c.mine.max_new_tokens
    c.salvage.train.total_steps = 2 if quick else 8
    c.salvage.train.warmup_steps = 1
    c.salvage.train.batch_size = 8 if quick else c.salvage.train.batch_size
    c.salvage.group_size = 4 if quick else c.salvage.group_size
    c.salvage.groups_per_step, c.salvage.max_draws_per_step = (1, 2) if quick else (2, 4)
    c.salvage.max_new_tokens = 24 if quick else c.salvage.max_new_tokens
    c.salvage.gates = "none"  # every draw accepted: the same work per update on both paths
    c.train.checkpoint.every_steps = c.salvage.train.total_steps
    c.train.checkpoint.async_save = False
    return c


class RowSteps:
    """Counts decode row-steps of every Sampler call: (rows x loop steps, of which on rows already finished)."""

    def __init__(self):
        self.total = self.finished = 0

    def wrap(self, sampler):
        original = sampler.generate_groups

        cfg = sampler.model.config
        vision = np.array([cfg.image_token_id, cfg.video_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id])

        def counted(*args, **kw):
            out = original(*args, **kw)
            # A random model samples vision tokens too; Salvage-DS would then build a row holding image tokens with
            # no image (train/image_batch.py refuses it). Both paths get the same replacement: the pad id.
            out = out._replace(tokens=np.where(np.isin(out.tokens, vision), sampler.pad_id, out.tokens))
            steps = int(out.lengths.max())  # the loop runs until every row is done or max_new_tokens
            self.total += out.lengths.size * steps
            self.finished += int((steps - out.lengths).sum())
            return out
        sampler.generate_groups = counted


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="8 states x K=4 x 24 tokens, 2 updates of 1 group x 4")
    parser.add_argument("--cascade-first", action="store_true", help="run the cascade path first")
    args = parser.parse_args()
    from rmsweb_jax.collect.store_fixture import write_synthetic_store
    from rmsweb_jax.main import run_stages
    from rmsweb_jax.model_init import load_model
    from rmsweb_jax.sampling import sampler as sampler_module
    from rmsweb_jax.stages.sft import load_split, split_path, split_record

    counts = {path: RowSteps() for path in PATHS}
    init = sampler_module.Sampler.__init__

    def counting_init(self, model, *a, **kw):  # every sampler the stages build counts for its path
        init(self, model, *a, **kw)
        counts[model.runtime.group_decode].wrap(self)
    sampler_module.Sampler.__init__ = counting_init

    config = demo_config(args.quick)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        base = demo_config(args.quick)
        base.model.init = "random:demo"
        checkpoint = load_model(base, root / "init")[1]
        store = write_synthetic_store(root / "store", tasks=4, seeds=4, viewport=(200, 120))
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
            update = [s["step_s"] for s in steps if "step_s" in s]
            results[path] = {"states_per_s": mine["states_per_s"], "mine_sampling_share": mine["sampling_share"],
                             "states": mine["states"], "update_s": float(np.median(update)), "updates": update}
    print(f"cpu: {cpu_model()}")
    print(f"demo settings: mine K={config.mine.samples} x {config.mine.max_new_tokens} tokens over "
          f"{config.mine.max_states} states; Salvage-DS G={config.salvage.group_size} x "
          f"{config.salvage.max_new_tokens} tokens, {config.salvage.groups_per_step} group(s) per update, "
          f"{config.salvage.train.total_steps} updates (the first untimed)")
    for path in PATHS:
        r = results[path]
        share = counts[path].finished / max(counts[path].total, 1)
        print(f"{path:>8}: mine {r['states_per_s']:.3f} states/s ({r['states']} states, "
              f"{r['mine_sampling_share']:.0%} sampling)   Salvage-DS update median {r['update_s']:.2f} s "
              f"{[round(x, 2) for x in r['updates']]}   decode row-steps on finished rows {share:.0%}")
    mine_ratio = results["cascade"]["states_per_s"] / results["copy"]["states_per_s"]
    update_ratio = results["copy"]["update_s"] / results["cascade"]["update_s"]
    print(f"cascade / copy: mine states/s {mine_ratio:.2f}x, Salvage-DS update {update_ratio:.2f}x faster "
          "(goal: both > 1)")
    common.emit("rollout_paths", results["cascade"]["states_per_s"], results["copy"]["states_per_s"], "states/s",
                1.0, anchor_is="copy", salvage_update_speedup=round(update_ratio, 3),
                salvage_update_s_cascade=round(results["cascade"]["update_s"], 3),
                salvage_update_s_copy=round(results["copy"]["update_s"], 3),
                finished_row_step_share=round(counts["cascade"].finished / max(counts["cascade"].total, 1), 3))


if __name__ == "__main__":
    main()
