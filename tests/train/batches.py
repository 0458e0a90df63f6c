"""Contract batches for the trainer tests: text rows of different lengths and rows with images."""
import numpy as np

from rmsweb_jax.models.qwen3_vl import Qwen3VLConfig


def image_text_batch(cfg: Qwen3VLConfig, seed: int = 0, length: int = 24) -> dict[str, np.ndarray]:
    """Returns 4 rows: an image, text only, a wide image, two images; lengths and targets differ per row.

    With 2 microbatches (rows 0, 2 and rows 1, 3) the target-token counts are 16 and 8, and the
    patch counts 48 and 32 of a 96-row pixel bucket.
    """
    rng = np.random.default_rng(seed)
    merge = cfg.vision.spatial_merge_size
    grids_of_row = [[(1, 4, 4)], [], [(1, 4, 8)], [(1, 4, 4), (1, 4, 4)]]
    lengths = [20, 12, 24, 22]
    first_target = [12, 8, 16, 18]
    forbidden = [cfg.image_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id, cfg.video_token_id]
    ids = np.zeros((4, length), np.int32)
    seg = np.zeros((4, length), np.int32)
    mask = np.zeros((4, length), np.float32)
    grids, pixels = [], []
    for r in range(4):
        row = [int(t) for t in rng.integers(7, cfg.text.vocab_size, 2)]
        for g in grids_of_row[r]:
            row += [cfg.vision_start_token_id] + [cfg.image_token_id] * (int(np.prod(g)) // merge ** 2)
            row += [cfg.vision_end_token_id]
            grids.append(g)
            pixels.append(rng.standard_normal((int(np.prod(g)), cfg.vision.patch_dim)).astype(np.float32))
        while len(row) < lengths[r]:
            t = int(rng.integers(7, cfg.text.vocab_size))
            row.append(t if t not in forbidden else 7)
        ids[r, :lengths[r]] = row
        seg[r, :lengths[r]] = 1
        mask[r, first_target[r]:lengths[r]] = 1.0
    pv = np.concatenate(pixels)
    pv = np.concatenate([pv, np.zeros((96 - len(pv), pv.shape[1]), np.float32)])
    return {"input_ids": ids, "segment_ids": seg, "loss_mask": mask, "pixel_values": pv,
            "image_grid_thw": np.array(grids, np.int32)}
