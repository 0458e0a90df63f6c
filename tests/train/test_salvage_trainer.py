"""The Trainer driven by an RL loop with the Salvage-DS loss: aux metrics reach metrics.jsonl and TensorBoard,
one update moves positive and negative responses apart, and a kept model is refreshed after each donated step."""
import jax
import numpy as np
import pytest

from rmsweb_jax.sampling.sampler import Sampler
from rmsweb_jax.train import Trainer
from rmsweb_jax.train.metrics import read_metrics
from rmsweb_jax.train.rl_loss import RLLossSettings, make_salvage_loss

from configs.common import base_config

ROWS, LENGTH, PROMPT = 8, 20, 10


def _config(init):
    c = base_config()
    c.model.init = f"hf:{init}"
    c.mesh.shape = (1, 1, 1)
    c.train.batch_size = ROWS
    c.train.microbatches = 2
    c.train.optimizer.lr = 1e-2
    c.train.optimizer.warmup_steps = 0
    c.train.optimizer.total_steps = 3
    c.train.metrics.every_steps = 1
    c.train.checkpoint.every_steps = 100
    c.train.export_hf = False
    return c


def _host(vocab):
    """Returns 8 rows: one prompt, 3 positive and 3 negative responses (policy rows), 2 anchor rows."""
    rng = np.random.default_rng(0)
    prompt = rng.integers(7, vocab, PROMPT)
    ids = np.stack([np.concatenate([prompt, rng.integers(7, vocab, LENGTH - PROMPT)]) for _ in range(ROWS)])
    mask = np.zeros((ROWS, LENGTH), np.float32)
    mask[:, PROMPT:] = 1
    mask[6:, PROMPT:] = 0
    mask[6:, PROMPT + 4:PROMPT + 8] = 1  # the anchors' action span
    return {"input_ids": ids.astype(np.int32), "attention_mask": np.ones((ROWS, LENGTH), np.int32),
            "loss_mask": mask, "advantage": np.array([1, 1, 1, -1, -1, -1, 0, 0], np.float32),
            "anchor": np.array([0, 0, 0, 0, 0, 0, 1, 1], np.float32)}


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_checkpoint):
    config = _config(tiny_checkpoint)
    settings = RLLossSettings.from_config(config.salvage.loss)
    trainer = Trainer(config, tmp_path_factory.mktemp("salvage"), name="salvage",
                      loss_fn=make_salvage_loss(settings, "chunked"))
    host = _host(trainer.model_config.text.vocab_size)
    kept = trainer.model()
    sampler = Sampler(kept)
    before = trainer.token_logprobs(host)
    host["token_old_logprobs"] = before
    trainer.step(host, {"position": 1})
    stale_error = None
    try:
        np.asarray(jax.tree.leaves(kept)[0])  # the donated arrays of the model taken before the step
    except RuntimeError as err:
        stale_error = err
    trainer.sync_model(sampler.model)
    sampler.refresh()
    after = trainer.token_logprobs(host)
    result = trainer.finish()
    trainer.close()
    return trainer, host, before, after, stale_error, sampler, result


def test_aux_metrics_reach_metrics_jsonl_and_tensorboard(run):
    trainer, host, *_ , result = run
    metrics = read_metrics(result.run_dir / "metrics.jsonl")
    first = metrics[1]
    for key in ("policy_loss", "anchor_loss", "clip_fraction_low", "clip_fraction_high", "ratio_mean",
                "ratio_min", "ratio_max", "policy_tokens", "anchor_tokens", "policy_rows", "anchor_rows"):
        assert key in first, (key, sorted(first))
    # Step 1 ran at ratio 1 (old log-probs = the trainer's own): the ratio stats say so, exactly reduced
    # over the two microbatches (ratio_min / ratio_max are a min / max, not sums).
    assert first["ratio_min"] == pytest.approx(1.0, abs=1e-5) and first["ratio_max"] == pytest.approx(1.0, abs=1e-5)
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert first["policy_tokens"] == 6 * (LENGTH - PROMPT) and first["anchor_tokens"] == 2 * 4
    assert first["policy_rows"] == 6 and first["anchor_rows"] == 2
    assert first["clip_fraction_low"] == 0 and first["clip_fraction_high"] == 0
    # At ratio 1 the surrogate is -mean(A) over policy tokens: 0 here (3 x +1, 3 x -1, equal lengths).
    assert first["policy_loss"] == pytest.approx(0.0, abs=1e-6)
    assert first["anchor_loss"] > 1.0  # NLL per action token of a random tiny model
    assert {"train/policy_loss", "train/ratio_max", "train/anchor_loss"} <= _tensorboard_tags(result.run_dir)


def _tensorboard_tags(run_dir) -> set[str]:
    """Returns the scalar tags of the run's TensorBoard event files (TFRecord frames of Event protos)."""
    import struct

    from tensorboardX.proto.event_pb2 import Event
    tags = set()
    for path in (run_dir / "tensorboard").glob("events.out.tfevents*"):
        data, at = path.read_bytes(), 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at:at + 8])
            event = Event.FromString(data[at + 12:at + 12 + length])
            tags |= {v.tag for v in event.summary.value}
            at += 12 + length + 4
    return tags


def test_one_update_raises_positive_and_lowers_negative_responses(run):
    trainer, host, before, after, *_ = run
    span = slice(PROMPT, LENGTH)
    gain = after[:, span].sum(-1) - before[:, span].sum(-1)
    assert np.all(gain[:3] > 0) and np.all(gain[3:6] < 0), gain


def test_a_model_taken_before_a_step_is_invalid_and_sync_model_refreshes_it(run):
    trainer, host, before, after, stale_error, sampler, _ = run
    assert stale_error is not None and "delete" in str(stale_error).lower(), stale_error
    kept = jax.tree.leaves(sampler.model)
    live = jax.tree.leaves(trainer.model())
    assert len(kept) == len(live)
    for a, b in zip(kept, live):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert trainer.params_version == trainer.step_count == 1
