"""Defaults shared by every config: model runtime, mesh, sharding rules, smoke prompt."""
import ml_collections

from rmsweb_jax.models.sharding import DEFAULT_RULES


def base_config() -> ml_collections.ConfigDict:
    """Returns the config every preset starts from; presets override fields."""
    c = ml_collections.ConfigDict()
    c.stages = ("model",)
    c.seed = 0

    c.model = ml_collections.ConfigDict()
    c.model.init = "random:tiny"          # 'hf:/path/to/Qwen3-VL-8B-Instruct' or 'random:tiny'
    c.model.param_dtype = "float32"
    c.model.compute_dtype = "float32"
    c.model.remat_policy = "none"         # none | full | dots | dots_with_no_batch_dims | save_attention_out
    c.model.attention_impl = "auto"       # auto (xla on CPU, splash on TPU, cudnn on GPU) | xla | splash | cudnn

    c.mesh = ml_collections.ConfigDict()
    c.mesh.shape = (1, -1, 1)             # (data, fsdp, tensor); -1 takes the remaining devices
    c.sharding_rules = [list(r) for r in DEFAULT_RULES]

    c.smoke = ml_collections.ConfigDict()
    c.smoke.instruction = "Click the Submit button."
    c.smoke.max_new_tokens = 24
    c.smoke.temperature = 0.0
    c.smoke.min_pixels = 16384
    c.smoke.max_pixels = 65536
    return c
