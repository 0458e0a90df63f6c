"""The evaluation charts, checked pixel by pixel, and the TensorBoard reader on logs the trainer writes."""
import math
import time

import numpy as np
import pytest
from PIL import Image

from rmsweb_jax.evaluate.plots import WHISKER_COLOR, policy_color, success_by_task_png, training_curves_png
from rmsweb_jax.evaluate.tb_events import read_scalars
from rmsweb_jax.train.metrics import MetricsWriter, read_metrics


def _mask(img: np.ndarray, color) -> np.ndarray:
    return np.all(img == np.array(color, np.uint8), axis=-1)


def _bars(img: np.ndarray, color) -> tuple[int, list[dict]]:
    """Returns (baseline row, bars left to right) of one colour: a bar is a run of columns coloured on
    the lowest coloured row (the legend's swatch sits higher), its height counted up from there at a
    column clear of the whisker."""
    # The bars' own geometry (left, right, baseline) is found in the image, so these checks hold
    # whatever the chart's margins: only ratios of heights and the order of colours are asserted.
    mask = _mask(img, color)
    baseline = int(np.nonzero(mask.any(axis=1))[0].max())
    columns = np.nonzero(mask[baseline])[0]
    runs = np.split(columns, np.nonzero(np.diff(columns) > 2)[0] + 1)  # a whisker may cross a zero bar
    bars = []
    for run in runs:
        x = int(run[0]) + 1
        height = 0
        while mask[baseline - height, x]:
            height += 1
        bars.append({"left": int(run[0]), "right": int(run[-1]), "height": height})
    return baseline, bars


ROWS = {
    "scripted": {"click-button": {"success": 1.0, "ci95": [0.7, 1.0]},
                 "enter-text": {"success": 0.25, "ci95": [0.1, 0.5]}},
    "sft": {"click-button": {"success": 0.5, "ci95": [0.3, 0.7]},
            "enter-text": {"success": 0.0, "ci95": [0.0, 0.2]}},
}


@pytest.fixture(scope="module")
def success_chart(tmp_path_factory):
    path = success_by_task_png(ROWS, tmp_path_factory.mktemp("plots") / "success.png")
    return np.asarray(Image.open(path).convert("RGB"))


def test_bar_tops_stand_at_their_success_rates(success_chart):
    base_a, (a1, a2) = _bars(success_chart, policy_color(0))
    base_b, (b1, b2) = _bars(success_chart, policy_color(1))
    assert base_a == base_b
    full = a1["height"]  # the 100% bar
    assert full > 100
    assert abs(a2["height"] - 0.25 * full) <= 1.5, (a2, full)
    assert abs(b1["height"] - 0.5 * full) <= 1.5, (b1, full)
    assert b2["height"] <= 2  # a zero success still shows as a line


def test_two_policies_stand_side_by_side_in_each_task_group(success_chart):
    _, (a1, a2) = _bars(success_chart, policy_color(0))
    _, (b1, b2) = _bars(success_chart, policy_color(1))
    assert policy_color(0) != policy_color(1)
    assert b1["left"] == a1["right"] + 1 and b2["left"] == a2["right"] + 1
    assert a1["right"] - a1["left"] == b1["right"] - b1["left"]
    assert a2["left"] > b1["right"] + 4  # the next task's group starts after a gap


def test_whisker_spans_the_interval(success_chart):
    baseline, (b1, _) = _bars(success_chart, policy_color(1))
    _, (a1, _) = _bars(success_chart, policy_color(0))
    full = a1["height"]
    dark = _mask(success_chart, WHISKER_COLOR)
    columns = slice(b1["left"], b1["right"] + 1)

    def dark_columns(fraction):
        return np.nonzero(dark[round(baseline - fraction * full), columns])[0]

    centre = (b1["right"] - b1["left"]) / 2
    for fraction in (0.35, 0.45, 0.6, 0.65):  # inside [0.3, 0.7]: one thin line at the bar's middle
        hit = dark_columns(fraction)
        assert len(hit) == 1 and abs(hit[0] - centre) <= 1, (fraction, hit)
    for fraction in (0.2, 0.8):  # outside the interval: nothing
        assert len(dark_columns(fraction)) == 0, fraction
    assert 3 <= len(dark_columns(0.7 - 0.5 / full)) < b1["right"] - b1["left"]  # the cap at the top
    # Above the bar (50%) but inside the interval the ground is white around the whisker.
    row = success_chart[round(baseline - 0.6 * full), columns]
    assert (row == 255).all(axis=-1).sum() == len(row) - 1


def test_a_rate_outside_zero_one_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"rows\['sft'\]\['t'\]\['success'\] = 55.0"):
        success_by_task_png({"sft": {"t": {"success": 55.0, "ci95": [0.4, 0.6]}}}, tmp_path / "x.png")


def test_read_scalars_gives_back_what_the_trainers_metrics_writer_wrote(tmp_path):
    writer = MetricsWriter(tmp_path / "sft", progress=False)
    for step in range(1, 6):
        writer.write(step, {"loss": 2.0 / step, "grad_norm": 0.5 * step})
    writer.close()
    # A resumed run: a second writer writes steps 4-7 again, into a second event file. The file is named
    # by the second it was opened in (and one opened in the same second is overwritten): wait for the next.
    opened = int(time.time())
    while int(time.time()) == opened:
        time.sleep(0.05)
    writer = MetricsWriter(tmp_path / "sft", progress=False)
    for step in range(4, 8):
        writer.write(step, {"loss": 10.0 + step, "grad_norm": 1.0})
    writer.close()
    assert len(list((tmp_path / "sft" / "tensorboard").glob("events.out.tfevents.*"))) == 2
    scalars = read_scalars(tmp_path / "sft" / "tensorboard")
    assert sorted(scalars) == ["train/grad_norm", "train/loss"]
    expected = read_metrics(tmp_path / "sft" / "metrics.jsonl")  # the JSONL sink: last line of a step wins too
    assert [s for s, _ in scalars["train/loss"]] == list(range(1, 8))
    for step, value in scalars["train/loss"]:
        assert value == pytest.approx(expected[step]["loss"], rel=1e-6)  # float32 in the event file
    assert scalars["train/loss"][4] == (5, 15.0)


def test_read_scalars_names_a_missing_folder_and_damage(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such TensorBoard log folder"):
        read_scalars(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no TensorBoard event files"):
        read_scalars(tmp_path / "empty")
    writer = MetricsWriter(tmp_path / "run", progress=False)
    for step in range(1, 4):
        writer.write(step, {"loss": float(step)})
    writer.close()
    event_file, = (tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*")
    data = bytearray(event_file.read_bytes())
    event_file.write_bytes(bytes(data[:-3]))  # a record cut short, as a writer still writing leaves it
    assert [s for s, _ in read_scalars(tmp_path / "run" / "tensorboard")["train/loss"]] == [1, 2]
    data[-6] ^= 0xFF  # a flipped byte inside the last record
    event_file.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="fails its checksum"):
        read_scalars(tmp_path / "run" / "tensorboard")


def _line_ends(img: np.ndarray, color, columns: slice) -> tuple[float, float, int, int]:
    """Returns (mean row of the leftmost and rightmost coloured columns, their x) of a curve in `columns`."""
    mask = _mask(img, color)[:, columns]
    xs = np.nonzero(mask.any(axis=0))[0]
    left, right = int(xs.min()), int(xs.max())
    return (float(np.nonzero(mask[:, left])[0].mean()), float(np.nonzero(mask[:, right])[0].mean()),
            left, right)


def test_training_curves_draw_each_stage_in_its_row(tmp_path):
    curves = {"sft": {"train/loss": [(s, 10.0 - s) for s in range(1, 11)]},
              "salvage": {"train/loss": [(s, float(s)) for s in range(1, 21)]}}
    path = training_curves_png(curves, tmp_path / "curves.png")
    img = np.asarray(Image.open(path).convert("RGB"))
    sft, salvage = _mask(img, policy_color(0)), _mask(img, policy_color(1))
    assert sft.any() and salvage.any()
    assert np.nonzero(sft.any(axis=1))[0].max() < np.nonzero(salvage.any(axis=1))[0].min()  # sft's row is above
    y_left, y_right, x_left, x_right = _line_ends(img, policy_color(0), slice(None))
    assert y_left < y_right - 100  # falling loss: its line starts high and ends low
    assert x_right - x_left > 200  # spans the panel's width
    y_left, y_right, _, _ = _line_ends(img, policy_color(1), slice(None))
    assert y_left > y_right + 100


@pytest.mark.slow  # a tiny model's real training run: ~30 s on 2 cores
def test_training_curves_from_a_real_trainer_log(tmp_path):
    from configs.common import base_config

    from rmsweb_jax.train import SyntheticBatches, Trainer, random_examples
    config = base_config()
    config.mesh.shape = (1, 1, 1)
    config.train.batch_size = 4
    config.train.optimizer.lr = 1e-2
    config.train.optimizer.warmup_steps = 2
    config.train.optimizer.total_steps = 8
    config.train.metrics.every_steps = 1
    config.train.checkpoint.every_steps = 100
    trainer = Trainer(config, tmp_path, name="sft")
    result = trainer.fit(SyntheticBatches(random_examples(trainer.model_config, count=4, seq_len=32, seed=0),
                                          batch_size=4))
    scalars = read_scalars(result.run_dir / "tensorboard")
    logged = read_metrics(result.run_dir / "metrics.jsonl")
    assert [s for s, _ in scalars["train/loss"]] == list(range(1, 9))
    for tag in ("loss", "grad_norm", "learning_rate"):
        for step, value in scalars[f"train/{tag}"]:
            assert value == pytest.approx(logged[step][tag], rel=1e-6), (tag, step)
    path = training_curves_png({"sft": scalars}, tmp_path / "training_curves.png")
    img = np.asarray(Image.open(path).convert("RGB"))
    width = img.shape[1]
    losses = [v for _, v in scalars["train/loss"]]
    assert losses[-1] < losses[0]
    # The loss panel is the first of three (loss, grad_norm, learning_rate): its line falls.
    y_left, y_right, _, _ = _line_ends(img, policy_color(0), slice(0, width // 3))
    assert y_left < y_right
    assert all(_mask(img[:, k * width // 3:(k + 1) * width // 3], policy_color(0)).any() for k in range(3))
    assert math.isfinite(losses[-1])
