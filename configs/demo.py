"""The demo: every stage built so far, on a tiny random model, in minutes on 2 CPU cores.

    python -m rmsweb_jax.main --config=configs/demo.py --workdir=/tmp/rmsweb_demo

Stages: `model` (load the tiny model, one multimodal generation), `collect` (MiniWoB++ with
the ScriptedTeacher — a scripted stand-in for an LLM collector, mistakes on — K=3 attempts with
reflections, into workdir/store, report in workdir/collect_report.*), `sft` (the tiny model
trained on the store's successful steps, a fifth of the task groups held out; workdir/sft/) and
`action_accuracy` (the SFT policy's greedy per-step action accuracy on the held-out steps;
workdir/sft_eval.json — a tiny random model after a few dozen steps: the plumbing, not a result).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import base_config  # noqa: E402


def get_config(arg=None):
    c = base_config()
    c.stages = ("model", "collect", "sft", "action_accuracy")
    c.model.init = "random:tiny"

    c.collect.policy = "teacher"
    c.collect.tasks = ",".join([
        "click-button", "click-button-sequence", "click-checkboxes", "click-dialog-2", "click-link", "click-option",
        "click-tab", "enter-password", "enter-text", "focus-text-2", "login-user", "choose-list",
    ])
    c.collect.num_seeds = 2
    c.collect.attempts = 3
    c.collect.workers = 2
    c.collect.max_steps = 12
    c.collect.teacher.wrong_element_p = 0.15
    c.collect.teacher.detour_p = 0.15
    c.collect.teacher.early_stop_p = 0.08
    c.collect.flush_every_tasks = 4

    # SFT: one example per row; the demo's prompts are ~2.3-2.8k tiny-tokenizer tokens with 1-2
    # screenshots of 512 patches each.
    c.data.buckets = (2816, 4096)
    c.data.bucket_patches = (1024, 1024)
    c.data.held_out_fraction = 0.2
    c.data.worker_count = 0
    c.train.batch_size = 2                # a row of ~3k tokens takes 2-5 s on the 2-core CPU
    c.train.optimizer.lr = 3e-3
    c.train.optimizer.warmup_steps = 2
    c.train.optimizer.total_steps = 16
    c.train.checkpoint.every_steps = 8
    c.train.metrics.every_steps = 4
    c.action_accuracy.max_new_tokens = 96
    return c
