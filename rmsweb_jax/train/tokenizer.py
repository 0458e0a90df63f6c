"""The tokenizer a training run's checkpoint carries, checked against its model: `check_tokenizer`.

Here, beside the trainer, rather than in the sft stage: sft and salvage both train from a checkpoint
folder (Trainer.init_dir) and must tokenize as its model expects."""
from __future__ import annotations

import pathlib

from rmsweb_jax.errors import UserError
from rmsweb_jax.processing.prompt_tokens import IMAGE_TOKEN, load_tokenizer
from rmsweb_jax.sampling.chat_model import image_config_from_checkpoint


def check_tokenizer(tokenizer_dir: str | pathlib.Path, model_config) -> tuple[object, object]:
    """Returns (tokenizer, image config) of the checkpoint folder, checked against the model's config."""
    tokenizer = load_tokenizer(tokenizer_dir)
    image_token = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    if image_token != model_config.image_token_id:
        raise UserError(f"the tokenizer in {tokenizer_dir} maps {IMAGE_TOKEN} to {image_token}, the model's "
                        f"image_token_id is {model_config.image_token_id}: tokenizer and model do not belong together")
    image_config = image_config_from_checkpoint(tokenizer_dir)
    vision = model_config.vision
    ours = (image_config.patch_size, image_config.merge_size, image_config.temporal_patch_size)
    theirs = (vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size)
    if ours != theirs:
        raise UserError(f"{tokenizer_dir}/preprocessor_config.json patch/merge/temporal sizes {ours} differ from "
                        f"the model's vision config {theirs}")
    return tokenizer, image_config
