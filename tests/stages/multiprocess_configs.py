"""Configs of the multi-process stage tests (tests/stages/test_multiprocess_stages.py, test_pod_layouts.py), for
rmsweb_jax.main:

    python -m rmsweb_jax.main --config=tests/stages/multiprocess_configs.py:pod_pipeline --workdir=DIR ...

Every process of a run and the one-process reference load the same file, so the only difference
between them is how the CPU devices are spread over processes (XLA_FLAGS, RMSWEB_DISTRIBUTED).
"""

from configs.common import base_config


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


POD_STEPS = 2


def pod_pipeline():
    """Returns every model stage on the tiny model over a store the test collects (2 MiniWoB++ tasks x 4 seeds):
    ground, sft (from ground's export), mine (replay and rollouts), salvage, eval (1 seed); 2 steps
    each, 4 rows a step (2 per feed), text-only prompts, one browser worker per process. The test gives the mesh
    (--config.mesh.shape: a pod preset's layout at tiny widths) and the checkpoint mine, salvage and eval load."""
    c = base_config()
    c.stages = ("ground", "sft", "mine", "salvage", "eval")
    c.model.init, c.model.scan_layers = "random:tiny", False
    c.prompt.observation, c.prompt.system = "elements", "compact"
    c.prompt.history_steps, c.prompt.history_images = 1, 0
    c.prompt.max_elements, c.prompt.max_element_name = 24, 40
    c.data.batching, c.data.buckets, c.data.bucket_patches = "bucket", (512, 1024), (0, 0)
    c.data.held_out_fraction = 0.25
    c.collect.tasks, c.collect.workers, c.collect.progress = "click-test,click-button", 1, False
    c.collect.max_steps, c.collect.max_new_tokens, c.collect.temperature = 2, 8, 0.0
    t = c.train
    t.batch_size, t.optimizer.total_steps, t.optimizer.warmup_steps, t.optimizer.lr = 4, POD_STEPS, 0, 3e-3
    t.checkpoint.every_steps, t.checkpoint.async_save, t.metrics.every_steps = POD_STEPS, False, 1
    c.ground.train.batch_size, c.ground.train.total_steps = 4, POD_STEPS
    c.ground.probe_rows, c.ground.probe_batch_size, c.ground.probe_max_new_tokens = 4, 4, 8
    c.sft.init = "ground"
    c.mine.samples, c.mine.max_new_tokens, c.mine.max_states = 2, 6, 4
    c.mine.batch_states, c.mine.max_batch, c.mine.rollouts = 2, 4, True
    c.salvage.train.batch_size, c.salvage.train.total_steps = 4, POD_STEPS
    c.salvage.group_size, c.salvage.groups_per_step, c.salvage.max_draws_per_step = 2, 1, 3
    c.salvage.max_new_tokens, c.salvage.sample_batch, c.salvage.gates = 6, 4, "contrast"
    c.salvage.anchor, c.salvage.loss.anchor_weight = "all", 1.0
    c.eval.first_seed, c.eval.num_seeds = 100, 1
    c.eval.max_steps, c.eval.max_new_tokens, c.eval.bootstrap_samples, c.eval.viewer = 2, 8, 200, False
    return c


def get_config(arg: str):
    """Returns the config named by `arg` (eval_teacher, pod_pipeline)."""
    makers = {"eval_teacher": eval_teacher, "pod_pipeline": pod_pipeline}
    if arg not in makers:
        raise ValueError(f"tests/stages/multiprocess_configs.py:{arg}: expected one of {sorted(makers)}")
    return makers[arg]()
