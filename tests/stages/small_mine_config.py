"""The mine tests' small run (tests/stages/test_mine_stage.py): the demo-sized model, text-only prompts, two SFT
steps; `:stop` is the mine stage alone with many short replay batches, for a run stopped in the middle."""
from configs.common import base_config


def get_config(arg: str | None = None):
    c = base_config()
    c.model.init = "random:demo"
    c.model.scan_layers = False
    c.mesh.shape = (1, 1, 1)
    c.prompt.observation, c.prompt.system = "elements", "compact"  # text-only prompts of ~1k byte tokens
    c.prompt.history_steps, c.prompt.history_images = 2, 0
    c.data.batching, c.data.buckets, c.data.bucket_patches = "pack", (2048,), (0,)
    c.data.held_out_fraction = 0.25
    c.train.batch_size = 2
    c.train.optimizer.total_steps = 2
    c.train.optimizer.warmup_steps = 1
    c.train.checkpoint.every_steps = 2
    c.train.metrics.every_steps = 1
    c.mine.samples = 2
    c.mine.max_new_tokens = 8
    c.mine.batch_states = 4
    c.mine.max_batch = 8
    c.mine.tau = 0.5
    c.mine.routine_share = 0.25
    if arg == "stop":
        c.stages = ("mine",)
        c.mine.batch_states, c.mine.samples, c.mine.max_new_tokens = 1, 4, 24  # many batches, each a moment long
    elif arg:
        raise ValueError(f"small_mine_config.py:{arg}: expected none or 'stop'")
    return c
