"""The micro pipeline config shared by the stage-manifest and table tests (a few minutes on 2 cores)."""
from configs.common import base_config


def micro_pipeline_config():
    """Returns the micro recipe: collect -> sft -> mine -> salvage -> eval on 2 MiniWoB++ tasks x 2 seeds, the
    random:demo model with text-only prompts, 2 SFT steps, a few mined states, 1 group per update, 1 eval seed."""
    c = base_config()
    c.stages = ("collect", "sft", "mine", "salvage", "eval")
    c.model.init = "random:demo"
    c.model.scan_layers = False
    c.mesh.shape = (1, 1, 1)
    c.prompt.observation, c.prompt.system = "elements", "compact"  # text-only prompts of a few hundred tokens
    c.prompt.history_steps, c.prompt.history_images = 1, 0
    c.prompt.max_elements, c.prompt.max_element_name = 24, 40
    c.collect.tasks, c.collect.num_seeds, c.collect.attempts = "click-test,click-button", 2, 1
    c.collect.workers, c.collect.max_steps, c.collect.progress = 2, 3, False
    c.data.batching, c.data.buckets, c.data.bucket_patches = "bucket", (448, 576, 768), (0, 0, 0)
    c.train.batch_size = 2
    c.train.optimizer.total_steps, c.train.optimizer.warmup_steps = 2, 1
    c.train.checkpoint.every_steps, c.train.checkpoint.async_save = 2, False
    c.train.metrics.every_steps = 1
    c.mine.samples, c.mine.max_new_tokens, c.mine.max_states = 2, 8, 3
    c.mine.batch_states, c.mine.max_batch = 3, 6
    c.salvage.group_size, c.salvage.groups_per_step, c.salvage.max_draws_per_step = 2, 1, 2
    c.salvage.max_new_tokens, c.salvage.sample_batch, c.salvage.gates = 6, 4, "contrast"
    c.eval.policies, c.eval.first_seed, c.eval.num_seeds = "sft,salvage", 100, 1
    c.eval.max_steps, c.eval.max_new_tokens, c.eval.bootstrap_samples, c.eval.viewer = 2, 8, 200, False
    return c
