"""The demo: a toy-scale policy that learns, trained from scratch on 2 CPU cores in minutes.

    python -m rmsweb_jax.main --config=configs/demo.py --workdir=/tmp/rmsweb_demo

Stages: `model` (the `random:demo` preset: Qwen3-VL's architecture at 355k parameters, the agent
BPE tokenizer written with it, one multimodal generation), `collect` (MiniWoB++ with the
ScriptedTeacher — a scripted stand-in for an LLM collector, a few injected mistakes — over
DEMO_TASKS x num_seeds seeds, K=2 attempts, into workdir/store), `sft` (the demo model trained on
the store's successful steps, prompts that show the page as an element list in the action's own
0-1000 grid with a compact system prompt; workdir/sft/) and `eval` (the SFT policy and, as a reference
row, the scripted collector play held-out seeds — disjoint from the collected ones — in the browser,
one attempt, no reflection; success per task with 95% Wilson intervals, the paired comparison, the
trajectory viewer: workdir/eval/).
A toy-scale policy trained on a scripted collector's data: see README's demo section for figures.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import base_config  # noqa: E402

# Task types a small model can learn from an element list (issue 14's calibration).
DEMO_TASKS = ("click-dialog", "click-dialog-2", "focus-text", "focus-text-2", "click-button", "click-link",
              "enter-text")


def get_config(arg=None):
    c = base_config()
    c.stages = ("model", "collect", "sft", "eval")
    c.model.init = "random:demo"
    c.model.scan_layers = False           # 4 layers: a Python loop is faster per step, compiles in seconds

    c.prompt.observation = "elements"     # the page as a text list (centre in the 0-1000 grid, value, state)
    c.prompt.system = "compact"
    c.prompt.history_steps = 1
    c.prompt.history_images = 0
    c.prompt.max_elements = 24
    c.prompt.max_element_name = 40

    c.collect.policy = "teacher"
    c.collect.tasks = ",".join(DEMO_TASKS)
    c.collect.first_seed = 0
    c.collect.num_seeds = 550
    c.collect.attempts = 2
    c.collect.workers = 2
    c.collect.max_steps = 8
    c.collect.teacher.wrong_element_p = 0.03
    c.collect.teacher.detour_p = 0.03
    c.collect.teacher.early_stop_p = 0.02
    c.collect.flush_every_tasks = 64
    c.collect.progress = False

    # SFT: text-only prompts of ~300-730 agent-BPE tokens, one per row (see README's demo section for
    # why not packed rows: on the CPU the attention over a row costs its length squared).
    c.data.batching = "bucket"
    c.data.buckets = (448, 576, 768)
    c.data.bucket_patches = (0, 0, 0)
    c.data.held_out_fraction = 0.0        # held-out *seeds* are played closed loop instead
    c.data.worker_count = 0
    c.train.batch_size = 8
    c.train.export_hf = True
    c.train.optimizer.lr = 3e-3
    c.train.optimizer.warmup_steps = 20
    c.train.optimizer.total_steps = 1300
    c.train.optimizer.end_lr_fraction = 0.05
    c.train.optimizer.weight_decay = 0.01
    c.train.checkpoint.every_steps = 500
    c.train.metrics.every_steps = 50

    c.eval.policies = "sft,teacher"       # the teacher row: the scripted collector's attempt 1, a reference
    c.eval.first_seed = 100_000
    c.eval.num_seeds = 30
    c.eval.max_steps = 6
    c.eval.max_new_tokens = 96
    return c
