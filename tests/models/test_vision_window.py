"""The vision tower's banded attention (RuntimeOptions.vision_window): exact against the whole-sequence
path on images of mixed sizes with padding, linear in the number of images where the whole path is
quadratic (the tiny tower here, and the 8B tower program that the TPU tests compile), and an image
larger than the window refused on the host (NaN on device if it slips through)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from rmsweb_jax.errors import UserError
from rmsweb_jax.models import attention as attn
from rmsweb_jax.models.from_config import rules_from_config
from rmsweb_jax.models.qwen3_vl import RuntimeOptions, create, rope, tiny
from rmsweb_jax.models.qwen3_vl.model import VisionInputs, check_vision_window, pad_vision, prepare_inputs
from rmsweb_jax.plan import programs, tpu_aot
from tests.tpu_aot.slices import model_config, slice_config

CFG = tiny()
MERGE = CFG.vision.spatial_merge_size
# Mixed sizes up to the window of 64 patches, a two-frame image (two segments of 16) and, after
# pad_vision, 44 padding patches (segment id 0).
GRIDS = np.array([(1, 8, 8), (1, 4, 6), (2, 4, 4), (1, 6, 8), (1, 8, 4), (1, 2, 2), (1, 8, 8), (1, 4, 10)])
WINDOW = 64


def _vision(grids, pad_to=None, seed=0):
    n = int(np.prod(grids, axis=1).sum())
    pixels = np.random.default_rng(seed).standard_normal((n, CFG.vision.patch_dim)).astype(np.float32)
    idx, w = rope.vision_pos_interpolation(grids, CFG.vision.num_grid_per_side, MERGE)
    vision = VisionInputs(pixels, rope.vision_rotary_positions(grids, MERGE), idx, w, rope.vision_segment_ids(grids))
    return vision if pad_to is None else pad_vision(vision, pad_to, MERGE)


@functools.lru_cache(maxsize=None)
def _model(window, impl="xla"):
    return create(CFG, RuntimeOptions(vision_window=window, attention_impl=impl), seed=0)


def _tower(window, impl="xla"):
    model = _model(window, impl)
    return jax.jit(lambda *v: model.visual(*v))


def test_banded_tower_equals_the_whole_sequence_tower():
    vision = _vision(GRIDS, pad_to=352)
    real = int(np.prod(GRIDS, axis=1).sum()) // MERGE ** 2  # merged tokens of real patches
    assert 352 > 3 * WINDOW  # long enough for the banded XLA path, not its whole-sequence fallback
    want_merged, want_ds = _tower(0)(*vision)
    got_merged, got_ds = _tower(WINDOW)(*vision)
    np.testing.assert_allclose(np.asarray(got_merged)[:real], np.asarray(want_merged)[:real], atol=1e-5)
    np.testing.assert_allclose(np.asarray(got_ds)[:, :real], np.asarray(want_ds)[:, :real], atol=1e-5)


@pytest.mark.slow
def test_banded_splash_tower_equals_the_whole_sequence_xla_tower(monkeypatch):
    # RuntimeOptions takes 'splash' only (the TPU kernel); on CPU it runs through the Pallas interpreter.
    vision = _vision(GRIDS, pad_to=352)
    real = int(np.prod(GRIDS, axis=1).sum()) // MERGE ** 2
    want_merged, _ = _tower(0)(*vision)
    monkeypatch.setattr(attn, "_resolve", lambda impl, mesh=None: "splash_interpret" if impl == "splash" else impl)
    got_merged, _ = _tower(WINDOW, impl="splash")(*vision)
    np.testing.assert_allclose(np.asarray(got_merged)[:real], np.asarray(want_merged)[:real], atol=1e-5)


def _flops_per_image(window, images):
    vision = _vision(np.array([(1, 8, 8)] * images))
    compiled = _tower(window).lower(*vision).compile()
    return compiled.cost_analysis()["flops"] / images


def test_banded_cost_grows_linearly_with_images_where_the_whole_sequence_grows_quadratically():
    banded = [_flops_per_image(WINDOW, n) for n in (4, 8, 16)]
    whole = [_flops_per_image(0, n) for n in (4, 8, 16)]
    assert max(banded) / min(banded) < 1.1, banded
    # Per image the whole path pays for every other image's patches: its attention term doubles with each
    # doubling of the images (the MLPs of this tiny tower keep the total ratio lower).
    assert whole[1] / whole[0] > 1.15 and whole[2] / whole[1] > 1.25, whole
    assert banded[2] < 0.65 * whole[2], (banded, whole)


def test_the_8b_tower_program_costs_the_same_per_image_at_4_8_and_16_images():
    # The program the planner and the tpu_aot tests compile (plan/programs.py), at the 8B preset's vision widths
    # (2 blocks) and 256 patches an image, compiled by XLA:CPU on one device: its FLOP count is that of the program
    # as written, which is what grows with the square of the images when attention spans them all.
    mesh = Mesh(np.array(jax.devices("cpu")[:1]).reshape(1, 1, 1), ("data", "fsdp", "tensor"))
    patches = 256

    def per_image(images, window):
        config = slice_config("8b", "v5p", (1, 1, 1))
        config.model.vision_window, config.model.attention_impl = window, "xla"
        program = programs.vision_tower(config, model_config("8b"), mesh, rules_from_config(config), images, patches)
        return tpu_aot.compile_program(program.name, program.fn, program.args, platform="cpu").flops / images

    banded = {n: per_image(n, patches) for n in (4, 8, 16)}
    assert max(banded.values()) <= 1.05 * min(banded.values()), banded
    # Without the window the same tower pays for every pair of images: more per image as images are added.
    assert per_image(16, 0) > 1.15 * banded[16], banded


def test_an_image_larger_than_the_window_is_refused_on_the_host_naming_grid_patches_and_window():
    grids = np.array([(1, 8, 8), (1, 8, 10)])
    with pytest.raises(UserError, match=r"image 1 of grid \(t, h, w\) = \(1, 8, 10\) has 80 patches per frame, "
                                        r"more than config.model.vision_window = 64"):
        check_vision_window(grids, WINDOW)
    check_vision_window(grids, 80)
    check_vision_window(grids, 0)  # no window
    n_tokens = int(np.prod(grids, axis=1).sum()) // MERGE ** 2
    ids = np.full((1, n_tokens + 2), 7, np.int32)
    ids[0, 1:-1] = CFG.image_token_id
    pixels = np.zeros((int(np.prod(grids, axis=1).sum()), CFG.vision.patch_dim), np.float32)
    with pytest.raises(UserError, match="vision_window = 64"):
        prepare_inputs(CFG, ids, pixel_values=pixels, image_grid_thw=grids, vision_window=WINDOW)
    with pytest.raises(UserError, match="80 patches"):
        _model(WINDOW)(ids, pixel_values=pixels, image_grid_thw=grids)


def test_an_image_larger_than_the_window_that_reaches_the_device_comes_back_nan():
    # The host check is the guard; a caller that skips it gets NaN, never attention over part of an image.
    vision = _vision(np.array([(1, 8, 8), (1, 8, 10), (1, 8, 8)]))
    merged, _ = _tower(WINDOW)(*vision)
    assert np.isnan(np.asarray(merged)).all()


def test_vision_window_must_be_a_non_negative_int():
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="config key vision_window"):
            RuntimeOptions(vision_window=bad)


def test_attention_window_errors_name_the_input():
    x = jnp.zeros((1, 8, 2, 4))
    seg = jnp.ones((1, 8), jnp.int32)
    with pytest.raises(ValueError, match="window must be a positive int"):
        attn.attention(x, x, x, q_segment_ids=seg, kv_segment_ids=seg, causal=False, window=0)
    with pytest.raises(ValueError, match="needs self-attention in sequence order"):
        attn.attention(x, x, x, q_segment_ids=seg, kv_segment_ids=seg, causal=True, window=4,
                       q_positions=jnp.arange(8)[None], kv_positions=jnp.arange(8)[None])
