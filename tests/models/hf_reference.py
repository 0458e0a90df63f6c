"""Tiny random transformers Qwen3-VL checkpoints written with `save_pretrained`: the parity reference."""
from __future__ import annotations

import pathlib

import numpy as np
import torch
from transformers import Qwen3VLConfig as HFConfig
from transformers import Qwen3VLForConditionalGeneration

IMAGE_TOKEN, VIDEO_TOKEN, VISION_START, VISION_END = 5, 6, 3, 4
VOCAB = 512


def hf_config(*, tie_word_embeddings=False, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, num_hidden_layers=3, deepstack=(0, 1), rope_form="rope_parameters",
              vocab_size=VOCAB) -> HFConfig:
    """Returns a tiny transformers Qwen3VLConfig (both rope forms of the text config are supported)."""
    half = head_dim // 2
    hw = (half * 20) // 64
    section = [half - 2 * hw, hw, hw]
    text = dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size + 16,
                num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
                num_key_value_heads=num_key_value_heads, head_dim=head_dim, max_position_embeddings=4096,
                rms_norm_eps=1e-6)
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section, "mrope_interleaved": True}
    if rope_form == "rope_parameters":
        text["rope_parameters"] = rope
    else:
        text["rope_theta"] = 10000.0
        text["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    vision = dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=hidden_size,
                  num_position_embeddings=64, deepstack_visual_indexes=list(deepstack), patch_size=16,
                  spatial_merge_size=2, temporal_patch_size=2)
    return HFConfig(text_config=text, vision_config=vision, image_token_id=IMAGE_TOKEN, video_token_id=VIDEO_TOKEN,
                    vision_start_token_id=VISION_START, vision_end_token_id=VISION_END,
                    tie_word_embeddings=tie_word_embeddings)


def write_checkpoint(directory: pathlib.Path, seed: int = 0, **config_kw) -> Qwen3VLForConditionalGeneration:
    """Saves a tiny random model (every weight randomised, norms near 1) and returns it in eval mode, fp32."""
    torch.manual_seed(seed)
    config = hf_config(**config_kw)
    config._attn_implementation = "eager"
    model = Qwen3VLForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.05 * torch.randn_like(p))
    model.save_pretrained(directory)
    return model


def image_prompt(rng: np.random.Generator, grids, texts_before=(3, 2), texts_after=(4, 3)):
    """Returns (input_ids list, pixel_values) with one image per entry of `grids` ([t, h, w]) spliced in text."""
    rows, pixels = [], []
    for (t, h, w), nb, na in zip(grids, texts_before, texts_after):
        n_tokens = t * h * w // 4
        ids = list(rng.integers(10, VOCAB, nb)) + [VISION_START] + [IMAGE_TOKEN] * n_tokens + [VISION_END] + list(
            rng.integers(10, VOCAB, na))
        rows.append([int(i) for i in ids])
        pixels.append(rng.standard_normal((t * h * w, 3 * 2 * 16 * 16)).astype(np.float32))
    return rows, np.concatenate(pixels)


def left_pad(rows, pad_id=0):
    """Returns (input_ids [B, L], attention_mask [B, L]) left-padded."""
    length = max(len(r) for r in rows)
    ids = np.full((len(rows), length), pad_id, np.int64)
    mask = np.zeros((len(rows), length), np.int64)
    for i, r in enumerate(rows):
        ids[i, length - len(r):] = r
        mask[i, length - len(r):] = 1
    return ids, mask


def torch_logits(model, input_ids, attention_mask, pixel_values=None, image_grid_thw=None) -> np.ndarray:
    """Returns the reference logits (fp32 numpy) from transformers' forward."""
    kw = {}
    if pixel_values is not None:
        kw = dict(pixel_values=torch.from_numpy(pixel_values), image_grid_thw=torch.from_numpy(np.asarray(image_grid_thw)),
                  mm_token_type_ids=torch.from_numpy((input_ids == IMAGE_TOKEN).astype(np.int64)))
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(input_ids), attention_mask=torch.from_numpy(attention_mask), **kw)
    return out.logits.float().numpy()
