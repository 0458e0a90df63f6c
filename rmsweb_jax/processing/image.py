"""Qwen3-VL image preprocessing in numpy: smart_resize, PIL bicubic resize, normalize, patchify.

Bit-for-bit the same as transformers' `Qwen2VLImageProcessorPil` configured as Qwen3-VL's published
preprocessor (patch 16, merge 2, temporal patch 2, mean = std = 0.5, min/max pixels 65536 /
16777216), so a checkpoint sees exactly the pixels it was trained on. Needs only numpy and
Pillow, so data pipelines and browser workers use it without importing transformers.
"""
from __future__ import annotations

import dataclasses
import io
import math
from collections.abc import Sequence
from typing import Union

import numpy as np
from PIL import Image

ImageLike = Union[Image.Image, np.ndarray, bytes, bytearray, memoryview]

# transformers' smart_resize refuses anything more elongated than this.
MAX_ASPECT_RATIO = 200


@dataclasses.dataclass(frozen=True)
class ImageProcessorConfig:
    """Qwen3-VL vision preprocessing settings (defaults: the published Qwen3-VL preprocessor config)."""

    patch_size: int = 16
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 65536
    max_pixels: int = 16777216
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    # Smallest accepted height and width. transformers 5.x silently upscales any image (even 1x1) to
    # min_pixels; a screenshot that small is a capture bug, so we refuse it. 0 restores HF's behaviour.
    min_side: int = 32

    def __post_init__(self):
        if isinstance(self.min_side, bool) or not isinstance(self.min_side, (int, np.integer)) or self.min_side < 0:
            raise ValueError(f"ImageProcessorConfig.min_side must be a non-negative int, got {self.min_side!r}")
        for name in ("patch_size", "merge_size", "temporal_patch_size", "min_pixels", "max_pixels"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"ImageProcessorConfig.{name} must be a positive int, got {value!r}")
        if self.min_pixels > self.max_pixels:
            raise ValueError(
                f"ImageProcessorConfig.min_pixels ({self.min_pixels}) must not exceed max_pixels ({self.max_pixels})"
            )
        for name in ("mean", "std"):
            value = tuple(float(v) for v in getattr(self, name))
            if len(value) != 3:
                raise ValueError(f"ImageProcessorConfig.{name} needs one value per RGB channel (3), got {value!r}")
            object.__setattr__(self, name, value)
        if any(s <= 0 for s in self.std):
            raise ValueError(f"ImageProcessorConfig.std must be positive, got {self.std!r}")

    @property
    def factor(self) -> int:
        """Returns the side multiple a resized image must have: one merge window of patches."""
        return self.patch_size * self.merge_size

    @property
    def patch_dim(self) -> int:
        """Returns the length of one flattened patch: 3 channels x temporal x patch x patch."""
        return 3 * self.temporal_patch_size * self.patch_size * self.patch_size


def smart_resize(
    height: int,
    width: int,
    factor: int = 32,
    min_pixels: int = 65536,
    max_pixels: int = 16777216,
) -> tuple[int, int]:
    """Returns (resized_height, resized_width): multiples of factor, area in [min_pixels, max_pixels], aspect kept.

    Same arithmetic as transformers' `smart_resize` (Python's round-half-even included), so the
    grid matches the reference exactly. Images below min_pixels are scaled up, not refused, as
    transformers 5.x does.
    """
    if height < 1 or width < 1:
        raise ValueError(f"image size must be at least 1x1 pixels, got height={height}, width={width}")
    aspect = max(height, width) / min(height, width)
    if aspect > MAX_ASPECT_RATIO:
        raise ValueError(
            f"image of height={height}, width={width} has aspect ratio {aspect:.1f}; "
            f"Qwen3-VL accepts at most {MAX_ASPECT_RATIO}"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def to_rgb_array(image: ImageLike) -> np.ndarray:
    """Returns the image as a uint8 [H, W, 3] RGB array, transparency composited onto white as transformers does.

    Accepts a PIL image (any mode), encoded image bytes (PNG, JPEG, ...), or a uint8 array laid out
    [H, W], [H, W, 1], [H, W, 3] or [H, W, 4] (always channels-last: transformers would guess the
    layout of e.g. a [3, W, 3] array; we never do).
    """
    if isinstance(image, (bytes, bytearray, memoryview)):
        data = bytes(image)
        try:
            image = Image.open(io.BytesIO(data))
            image.load()
        except Exception as err:  # PIL raises several types for corrupt or truncated data
            raise ValueError(f"could not decode image bytes ({len(data)} bytes): {err}") from err
    if isinstance(image, Image.Image):
        # PIL's own alpha compositing, as transformers' convert_to_rgb does for PIL inputs.
        if "A" in image.getbands() or image.info.get("transparency") is not None:
            rgba = image.convert("RGBA")
            white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            return np.array(Image.alpha_composite(white, rgba).convert("RGB"))
        return np.array(image.convert("RGB"))
    if isinstance(image, np.ndarray):
        return _array_to_rgb(image)
    raise TypeError(
        f"image must be a PIL image, encoded image bytes or a uint8 numpy array, got {type(image).__name__}"
    )


def _array_to_rgb(array: np.ndarray) -> np.ndarray:
    """Returns a uint8 [H, W, 3] copy of a channels-last uint8 array with 1, 3 or 4 channels."""
    if array.dtype != np.uint8:
        raise ValueError(f"image array must be uint8 (0..255), got dtype {array.dtype}")
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3 or array.shape[-1] not in (1, 3, 4):
        raise ValueError(f"image array must be [H, W], [H, W, 1], [H, W, 3] or [H, W, 4], got shape {array.shape}")
    if array.shape[-1] == 1:
        return np.repeat(array, 3, axis=-1)
    if array.shape[-1] == 4:
        # transformers' numpy blend (float64, round half-to-even); it equals PIL's alpha_composite
        # for every (value, alpha) pair, so arrays and PIL images of the same pixels agree.
        alpha = array[..., 3:4] / 255
        composite = alpha * array[..., :3] + (1 - alpha) * 255
        return np.round(composite).astype(np.uint8)
    return np.ascontiguousarray(array)


def normalized_pixels(rgb: np.ndarray, config: ImageProcessorConfig) -> np.ndarray:
    """Returns float32 [H', W', 3]: rgb resized (PIL bicubic) to its smart_resize size, scaled to [0, 1], normalized."""
    height, width = rgb.shape[:2]
    new_height, new_width = smart_resize(height, width, config.factor, config.min_pixels, config.max_pixels)
    # PIL resizes even when the size is unchanged (a copy), as transformers does.
    resized = np.array(Image.fromarray(rgb).resize((new_width, new_height), resample=Image.Resampling.BICUBIC))
    # Same dtypes and operation order as transformers (float64 rescale, float32 normalize) for identical bits.
    scaled = (resized.astype(np.float64) * (1 / 255)).astype(np.float32)
    mean = np.asarray(config.mean, dtype=np.float32)
    std = np.asarray(config.std, dtype=np.float32)
    return (scaled - mean) / std


def patchify(pixels: np.ndarray, config: ImageProcessorConfig) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Returns (patches float32 [t*h*w, 3*T*p*p], (t, h, w)) for one normalized [H, W, 3] image.

    Patches come out in merge-window order (each merge_size x merge_size window of neighbouring
    patches is contiguous), which the vision tower's patch merger relies on. A patch flattens as
    (channel, temporal, row, column); the still image is repeated over the temporal_patch_size frames.
    """
    p, m, t = config.patch_size, config.merge_size, config.temporal_patch_size
    height, width, channels = pixels.shape
    if height % (p * m) or width % (p * m):
        raise ValueError(f"pixels of height={height}, width={width} are not multiples of patch*merge={p * m}")
    grid_h, grid_w = height // p, width // p
    windows = pixels.reshape(grid_h // m, m, p, grid_w // m, m, p, channels)
    # -> (window row, window col, row in window, col in window, channel, pixel row, pixel col)
    windows = windows.transpose(0, 3, 1, 4, 6, 2, 5)
    frames = np.broadcast_to(windows[:, :, :, :, :, None], (*windows.shape[:5], t, p, p))
    return frames.reshape(grid_h * grid_w, channels * t * p * p), (1, grid_h, grid_w)


def preprocess_images(
    images: ImageLike | Sequence[ImageLike],
    config: ImageProcessorConfig = ImageProcessorConfig(),
) -> tuple[np.ndarray, np.ndarray]:
    """Returns (pixel_values float32 [num_patches, 3*T*p*p], image_grid_thw int64 [num_images, 3]).

    `images` is one image or a sequence of them (PIL images, encoded bytes, uint8 [H, W, C]
    arrays); patches of all images are concatenated in order, as the model expects.
    """
    if isinstance(images, (Image.Image, np.ndarray, bytes, bytearray, memoryview)):
        images = [images]
    images = list(images)
    if not images:
        raise ValueError("preprocess_images needs at least one image, got an empty sequence")
    all_patches, grids = [], []
    for index, image in enumerate(images):
        try:
            rgb = to_rgb_array(image)
            if min(rgb.shape[:2]) < config.min_side:
                raise ValueError(f"image of height={rgb.shape[0]}, width={rgb.shape[1]} is below the minimum size: "
                                 f"both sides must be >= {config.min_side} pixels (ImageProcessorConfig.min_side)")
            patches, grid = patchify(normalized_pixels(rgb, config), config)
        except (ValueError, TypeError) as err:
            raise type(err)(f"image {index}: {err}") from err
        all_patches.append(patches)
        grids.append(grid)
    return np.concatenate(all_patches, axis=0), np.asarray(grids, dtype=np.int64)


def num_image_tokens(grid_thw: np.ndarray | Sequence[int], merge_size: int = 2) -> int | np.ndarray:
    """Returns t*h*w // merge_size**2, the LLM tokens of an image: an int for a [3] grid, int64 [N] for [N, 3]."""
    grid = np.asarray(grid_thw, dtype=np.int64)
    if grid.shape[-1:] != (3,) or grid.ndim > 2:
        raise ValueError(f"grid_thw must be [3] or [N, 3] (t, h, w), got shape {grid.shape}")
    if np.any(grid < 1):
        raise ValueError(f"grid_thw entries must be positive, got {grid.tolist()}")
    if np.any(grid[..., 1:] % merge_size):
        raise ValueError(f"grid_thw h and w must be multiples of merge_size={merge_size}, got {grid.tolist()}")
    tokens = np.prod(grid, axis=-1) // (merge_size * merge_size)
    return int(tokens) if grid.ndim == 1 else tokens
