"""rmsweb_jax.processing.image against transformers' Qwen2VLImageProcessorPil (Qwen3-VL settings).

Equality is bit-exact (assert_array_equal, tolerance 0): both sides run the same PIL resize and
the same numpy dtypes and operation order, so any difference is a real divergence.
"""
import io

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_smart_resize

from rmsweb_jax.processing.image import (
    ImageProcessorConfig,
    num_image_tokens,
    patchify,
    preprocess_images,
    smart_resize,
)

from .hf_reference import hf_image_processor

HF_DEFAULT = hf_image_processor()


def _random_rgb(height, width, seed=0, channels=3):
    shape = (height, width) if channels is None else (height, width, channels)
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def _hf(images, processor=HF_DEFAULT, **kwargs):
    out = processor(images=images, return_tensors="np", **kwargs)
    return out["pixel_values"], out["image_grid_thw"]


def _assert_same(ours, reference):
    pixel_values, grid = ours
    ref_pixels, ref_grid = reference
    assert pixel_values.dtype == np.float32 and grid.dtype == np.int64
    np.testing.assert_array_equal(grid, ref_grid)
    assert pixel_values.shape == ref_pixels.shape
    np.testing.assert_array_equal(pixel_values, ref_pixels)


@pytest.mark.parametrize(
    "height, width",
    [
        (1, 1),  # far below min_pixels: scaled up
        (5, 7),
        (31, 33),
        (255, 257),  # just below the minimum area
        (256, 256),  # exactly the minimum area
        (37, 53),
        (101, 203),
        (333, 517),
        (720, 1280),  # a browser screenshot
        (33, 3000),  # wide
        (1000, 17),  # tall
        (10, 1999),  # aspect 199.9, just inside the limit
    ],
)
def test_pixel_values_equal_transformers(height, width):
    image = Image.fromarray(_random_rgb(height, width, seed=height * 7919 + width))
    # min_side=0: accept what transformers accepts, so even the tiny sizes are compared.
    _assert_same(preprocess_images([image], ImageProcessorConfig(min_side=0)), _hf([image]))


def test_image_below_the_minimum_size_is_refused_naming_the_size():
    with pytest.raises(ValueError, match=r"image 0: .*height=20, width=500 is below the minimum size.*>= 32"):
        preprocess_images([_random_rgb(20, 500)])
    pixels, grid = preprocess_images([_random_rgb(32, 500)])
    assert grid.shape == (1, 3) and pixels.shape[0] == int(np.prod(grid[0]))


@pytest.mark.parametrize("height, width, max_pixels", [(1280, 720, 200_000), (900, 1600, 65536), (2000, 300, 100_000)])
def test_large_images_capped_at_max_pixels_equal_transformers(height, width, max_pixels):
    image = Image.fromarray(_random_rgb(height, width, seed=3))
    config = ImageProcessorConfig(min_pixels=1024, max_pixels=max_pixels)
    ours = preprocess_images([image], config)
    _assert_same(ours, _hf([image], hf_image_processor(min_pixels=1024, max_pixels=max_pixels)))
    t, h, w = ours[1][0]
    assert t * h * w * 16 * 16 <= max_pixels


def test_batch_of_mixed_inputs_concatenates_like_transformers():
    arrays = [_random_rgb(40, 60, seed=1), _random_rgb(300, 90, seed=2), _random_rgb(64, 64, seed=3)]
    png = io.BytesIO()
    Image.fromarray(arrays[2]).save(png, format="PNG")
    ours = preprocess_images([Image.fromarray(arrays[0]), arrays[1], png.getvalue()])
    _assert_same(ours, _hf([Image.fromarray(a) for a in arrays]))


@pytest.mark.parametrize("mode", ["L", "LA", "RGBA", "P", "1", "CMYK", "I;16"])
def test_pil_modes_converted_like_transformers(mode):
    rgba = Image.fromarray(_random_rgb(45, 70, seed=5, channels=4), mode="RGBA")
    image = rgba.convert(mode) if mode != "P" else rgba.convert("RGB").quantize(16)
    _assert_same(preprocess_images([image]), _hf([image]))


def test_palette_with_transparency_composited_like_transformers():
    image = Image.fromarray(_random_rgb(50, 40, seed=6)).quantize(8)
    image.info["transparency"] = 3
    _assert_same(preprocess_images([image]), _hf([image]))


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_uint8_arrays_converted_like_transformers(channels):
    array = _random_rgb(48, 80, seed=channels, channels=channels)
    _assert_same(preprocess_images([array]), _hf([array], input_data_format="channels_last"))


def test_every_alpha_value_composited_like_transformers():
    value, alpha = np.meshgrid(np.arange(256), np.arange(256))
    rgba = np.stack([value, 255 - value, value // 2, alpha], axis=-1).astype(np.uint8)
    _assert_same(preprocess_images([rgba]), _hf([rgba], input_data_format="channels_last"))
    image = Image.fromarray(rgba, mode="RGBA")
    _assert_same(preprocess_images([image]), _hf([image]))


def test_2d_array_is_grayscale():
    gray = _random_rgb(48, 80, seed=9, channels=None)
    _assert_same(preprocess_images([gray]), _hf([gray[:, :, None]], input_data_format="channels_last"))


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L"])
def test_png_bytes_equal_transformers_on_the_decoded_image(mode):
    image = Image.fromarray(_random_rgb(70, 90, seed=11, channels=4), mode="RGBA").convert(mode)
    png = io.BytesIO()
    image.save(png, format="PNG")
    data = png.getvalue()
    _assert_same(preprocess_images(data), _hf([Image.open(io.BytesIO(data))]))


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(
    height=st.integers(1, 20000),
    width=st.integers(1, 20000),
    factor=st.sampled_from([14, 28, 32]),
    min_pixels=st.integers(1, 1 << 18),
    max_extra=st.integers(0, 1 << 24),
)
def test_smart_resize_equals_transformers(height, width, factor, min_pixels, max_extra):
    max_pixels = min_pixels + max_extra
    try:
        expected = hf_smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
    except ValueError:
        with pytest.raises(ValueError, match="aspect ratio"):
            smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
        return
    assert smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels) == expected


def test_aspect_ratio_over_200_is_refused_naming_the_size():
    wide = _random_rgb(2, 401)
    with pytest.raises(ValueError, match="aspect"):
        _hf([Image.fromarray(wide)])  # the reference refuses it too
    with pytest.raises(ValueError, match=r"image 0: .*height=2, width=401.*aspect ratio 200\.5"):
        preprocess_images([wide], ImageProcessorConfig(min_side=0))


def test_empty_image_is_refused_naming_the_size():
    with pytest.raises(ValueError, match="height=0, width=5"):
        preprocess_images([np.zeros((0, 5, 3), np.uint8)])


@pytest.mark.parametrize(
    "bad, message",
    [
        (np.zeros((8, 8, 3), np.float32), "uint8"),
        (np.zeros((8, 8, 2), np.uint8), r"shape \(8, 8, 2\)"),
        (b"not an image", "could not decode image bytes"),
        ("screenshot.png", "got str"),
    ],
)
def test_unusable_inputs_are_refused(bad, message):
    with pytest.raises((ValueError, TypeError), match=message):
        preprocess_images([Image.new("RGB", (64, 64)), bad])


def test_empty_batch_is_refused():
    with pytest.raises(ValueError, match="at least one image"):
        preprocess_images([])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"patch_size": 0}, "patch_size"),
        ({"merge_size": 1.5}, "merge_size"),
        ({"min_pixels": 10, "max_pixels": 5}, "min_pixels"),
        ({"mean": (0.5, 0.5)}, "mean"),
        ({"std": (0.5, 0.0, 0.5)}, "std"),
    ],
)
def test_config_is_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ImageProcessorConfig(**kwargs)


def test_patches_come_in_merge_window_order():
    """The first merge**2 patches are the top-left 2x2 window, row-major, each patch (C, T, p, p)."""
    config = ImageProcessorConfig()
    pixels = np.random.default_rng(0).standard_normal((64, 96, 3)).astype(np.float32)
    patches, grid = patchify(pixels, config)
    assert grid == (1, 4, 6)
    for k, (row, col) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        tile = pixels[16 * row:16 * (row + 1), 16 * col:16 * (col + 1)].transpose(2, 0, 1)
        expected = np.stack([tile, tile], axis=1).reshape(-1)  # two identical frames
        np.testing.assert_array_equal(patches[k], expected)
    # the second window starts at patch column 2, not in the first window's row
    np.testing.assert_array_equal(patches[4][:256], pixels[0:16, 32:48, 0].reshape(-1))


@pytest.mark.parametrize("height, width", [(37, 53), (720, 1280), (33, 3000)])
def test_num_image_tokens_matches_transformers_patch_count(height, width):
    pixel_values, grid = preprocess_images([_random_rgb(height, width)])
    hf_patches = HF_DEFAULT.get_number_of_image_patches(height, width)
    assert num_image_tokens(grid[0], merge_size=2) == hf_patches // 4 == len(pixel_values) // 4
    np.testing.assert_array_equal(num_image_tokens(np.concatenate([grid, grid]), 2), [hf_patches // 4] * 2)


def test_num_image_tokens_rejects_bad_grids():
    with pytest.raises(ValueError, match="multiples of merge_size=2"):
        num_image_tokens([1, 3, 4], merge_size=2)
    with pytest.raises(ValueError, match=r"\[3\] or \[N, 3\]"):
        num_image_tokens([1, 4], merge_size=2)
