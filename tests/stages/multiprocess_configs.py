"""Configs of the two-process stage tests (tests/stages/test_multiprocess_stages.py), for rmsweb_jax.main:

    python -m rmsweb_jax.main --config=tests/stages/multiprocess_configs.py:salvage --workdir=DIR ...

Every process of a run and the one-process reference load the same file, so the only difference
between them is how the 8 CPU devices are spread over processes (XLA_FLAGS, RMSWEB_DISTRIBUTED).
"""

from configs.common import base_config

SALVAGE_STEPS = 2


def salvage():
    """Returns Salvage-DS on the tiny model over all 8 devices (fsdp): 1 group of 2 samples a step, every
    rejected group anchored (a random policy never writes the reference action), 8 rows a step."""
    c = base_config()
    c.stages = ("salvage",)
    c.mesh.shape = (1, -1, 1)
    # Text-only prompts of a few hundred tokens (as tests/stages/micro_pipeline.py): screenshots would make
    # 2560-token rows whose attention on 8 CPU devices in one process needs > 20 GB.
    c.prompt.observation, c.prompt.system = "elements", "compact"
    c.prompt.history_steps, c.prompt.history_images = 1, 0
    c.prompt.max_elements, c.prompt.max_element_name = 24, 40
    c.data.batching, c.data.buckets, c.data.bucket_patches = "bucket", (448, 576, 768), (0, 0, 0)
    c.salvage.train.batch_size, c.salvage.train.lr, c.salvage.train.warmup_steps = 8, 3e-3, 0
    c.salvage.train.total_steps = SALVAGE_STEPS
    c.train.checkpoint.every_steps, c.train.checkpoint.async_save = SALVAGE_STEPS, False
    c.train.metrics.every_steps = 1
    c.salvage.group_size, c.salvage.groups_per_step, c.salvage.max_draws_per_step = 2, 1, 3
    c.salvage.max_new_tokens, c.salvage.sample_batch, c.salvage.gates = 6, 4, "contrast"
    c.salvage.anchor, c.salvage.loss.anchor_weight = "all", 1.0
    return c


def eval_teacher():
    """Returns the eval stage of the scripted teacher (its injected mistakes on: some episodes fail) on 3
    MiniWoB++ tasks x 3 seeds, one browser worker per process, every figure of the report."""
    c = base_config()
    c.stages = ("eval",)
    c.mesh.shape = (1, -1, 1)
    c.collect.tasks, c.collect.workers, c.collect.progress = "click-test,click-button,focus-text", 1, False
    c.collect.teacher.wrong_element_p, c.collect.teacher.early_stop_p = 0.3, 0.2
    c.eval.policies, c.eval.first_seed, c.eval.num_seeds = "teacher", 100, 3
    c.eval.training_store, c.eval.bootstrap_samples, c.eval.viewer = "none", 200, False
    return c


def eval_model():
    """Returns the eval stage of an in-process model (eval.policies given by the test: the tiny checkpoint it
    wrote) on 3 MiniWoB++ tasks x 2 seeds, greedy, text-only prompts, one browser worker per process (so the
    one-process run batches one step at a time as each host does): each host samples on its own devices."""
    c = eval_teacher()
    c.prompt.observation, c.prompt.system = "elements", "compact"
    c.prompt.history_steps, c.prompt.history_images = 1, 0
    c.prompt.max_elements, c.prompt.max_element_name = 24, 40
    c.eval.num_seeds, c.eval.max_steps, c.eval.max_new_tokens, c.eval.temperature = 2, 3, 12, 0.0
    return c


def mine():
    """Returns the mine stage (replay only) of the tiny model on the training split of a small store, over all
    8 devices: 2 samples of each reference step, a quarter of the task groups held out."""
    c = base_config()
    c.stages = ("mine",)
    c.mesh.shape = (1, -1, 1)
    c.prompt.observation, c.prompt.system = "elements", "compact"
    c.prompt.history_steps, c.prompt.history_images = 1, 0
    c.data.held_out_fraction = 0.25
    c.mine.samples, c.mine.max_new_tokens, c.mine.batch_states, c.mine.max_batch = 2, 8, 4, 8
    c.mine.tau, c.mine.routine_share = 0.5, 0.25
    return c


def mine_rollouts():
    """Returns the mine stage with browser rollouts: mine() plus one greedy episode of the tiny model (at most 2
    steps of 12 tokens) on each training task group, one browser worker per process."""
    c = mine()
    c.mine.rollouts = True
    c.collect.workers, c.collect.max_steps, c.collect.progress = 1, 2, False
    c.collect.max_new_tokens, c.collect.temperature = 12, 0.0
    return c


def get_config(arg: str):
    """Returns the config named by `arg` (salvage, eval_teacher, eval_model, mine, mine_rollouts)."""
    makers = {"salvage": salvage, "eval_teacher": eval_teacher, "eval_model": eval_model, "mine": mine,
              "mine_rollouts": mine_rollouts}
    if arg not in makers:
        raise ValueError(f"tests/stages/multiprocess_configs.py:{arg}: expected one of {sorted(makers)}")
    return makers[arg]()
