"""The base policy: grounding pretraining on synthetic pages (rmsweb_jax/stages/base.py), made once and shipped, so
that the demo's recipe starts from a model that reads its page, as the real one starts from Qwen3-VL.

    make base                                          # = the command below, workdir/base
    python -m rmsweb_jax.main --config=configs/base.py --workdir=workdir/base
    python -m rmsweb_jax.main --config=configs/base.py:pilot --workdir=workdir/base_pilot     # tens of minutes

The model: random:base (rmsweb_jax/model_init.py: Qwen3-VL's architecture, 192 wide, 4 layers, 3 heads of 64, the
agent BPE with one token per coordinate value). The prompt is the demo's (element list, compact system prompt), so
the base's weights and tokenizer load where the demo's random ones did."""
from configs.common import base_config
from configs.demo import get_config as demo_config


def get_config(arg: str | None = None):
    """Returns the base's config; 'pilot' is its first look (a few hundred steps, a probe every 100)."""
    demo = demo_config()
    c = base_config()
    c.stages = ("base",)
    c.model.init = "random:base"
    c.model.scan_layers = False
    c.prompt = demo.prompt  # the demo's prompt: the base reads the page as the demo's policy will
    c.data.batching = "bucket"
    c.data.buckets = (512, 768, 1024, 1280, 1536)
    c.data.bucket_patches = (0, 0, 0, 0, 0)
    c.data.held_out_fraction = 0.0
    c.data.worker_count = 0
    c.data.too_long = "drop"  # a page of long made-up names past the largest bucket is skipped, not an error
    c.base.max_elements = 16  # at 24, two rows in five of 4 targets passed 1,024 tokens
    c.base.targets_per_row = 8  # lookups per token: 8 targets on a page are 1.5x those of 4 (median 1,059 tokens)
    c.base.probe_every = 500
    c.train.batch_size = 8
    c.train.export_hf = True
    c.train.optimizer.lr = 1e-3
    c.train.optimizer.warmup_steps = 100
    c.train.optimizer.total_steps = 20_000
    c.train.optimizer.end_lr_fraction = 0.1
    c.train.optimizer.weight_decay = 0.01
    c.train.checkpoint.every_steps = 250
    c.train.metrics.every_steps = 25
    if arg == "pilot":
        c.base.pages = 5_000
        c.base.max_elements = 12  # shorter pages first: a lookup forms sooner over fewer candidates
        c.base.targets_per_row = 4
        c.base.probe_every = 100
        c.base.probe_rows = 64
        c.train.optimizer.total_steps = 800
        c.train.optimizer.warmup_steps = 50
    elif arg:
        raise ValueError(f"configs/base.py:{arg}: unknown variant; expected none or 'pilot'")
    return c
