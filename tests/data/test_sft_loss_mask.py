"""The loss mask end to end: a stored step -> prompt + target tokens -> batch -> the trainer's SFT loss.

Changing the label of a prompt token changes nothing; changing the label of a target token changes
the loss; the weighted labels are exactly the stored assistant turn and its <|im_end|>.
"""
import jax
import numpy as np
from flax import nnx

from rmsweb_jax.data.batching import assemble
from rmsweb_jax.data.sft import example_name
from rmsweb_jax.models.qwen3_vl import create, tiny
from rmsweb_jax.processing.prompt_tokens import load_tokenizer
from rmsweb_jax.train.batch import prepare_batch
from rmsweb_jax.train.loss import make_sft_loss
from tests.data.conftest import IMAGE_CONFIG


def test_changing_a_label_changes_the_loss_only_on_target_tokens(view, tokenizer_dir, encoded):
    tokenizer = load_tokenizer(tokenizer_dir)
    ids = {name: tokenizer.convert_tokens_to_ids(tok) for name, tok in (
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"))}
    config = tiny(**ids)
    example = view[7]  # a click with the previous step's screenshot in its history: two images
    enc = encoded[example_name(example)]
    assert len(enc["image_grid_thw"]) == 2
    host = assemble([[enc]], 2432, 192, IMAGE_CONFIG.patch_dim)
    batch = prepare_batch(host, config, microbatches=1)
    weights, targets = batch.weights[0, 0], batch.targets[0, 0]
    n = len(enc["input_ids"])
    np.testing.assert_array_equal(weights[:n - 1], enc["loss_mask"][1:])
    assert tokenizer.decode(targets[weights == 1]) == example.target_text + "<|im_end|>"

    graphdef, state = nnx.split(create(config, seed=0))
    sft_loss = make_sft_loss()

    @jax.jit
    def loss(state, microbatch):
        parts, _ = sft_loss(nnx.merge(graphdef, state), microbatch)
        return parts.value()

    def loss_with(labels):
        return float(loss(state, jax.tree.map(lambda x: x[0], batch._replace(targets=labels[None, None]))))

    base = loss_with(targets)
    prompt_positions = np.flatnonzero(weights[:n - 1] == 0)
    target_positions = np.flatnonzero(weights == 1)
    for t in (prompt_positions[5], prompt_positions[-1]):  # early in the prompt; the assistant header
        changed = targets.copy()
        changed[t] = (changed[t] + 11) % config.text.vocab_size
        assert loss_with(changed) == base
    for t in (target_positions[0], target_positions[-1]):  # the thought's first token; <|im_end|>
        changed = targets.copy()
        changed[t] = (changed[t] + 11) % config.text.vocab_size
        assert abs(loss_with(changed) - base) > 1e-5  # one label of ~90: a random model moves the mean ~1e-4
