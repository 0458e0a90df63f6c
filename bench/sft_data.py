"""SFT data pipeline throughput vs the trainer's consumption, on the demo config.

ours    the Grain pipeline of rmsweb_jax/data/sft.py (store -> prompts -> tokens, loss mask, patches ->
        fixed-shape batches) in examples/s and real tokens/s, with worker_count 0 (the demo's) and 2;
        steady state (the first batch, which loads the tokenizer and starts workers, is not timed)
anchor  what the trainer consumes on the demo config: batch rows x train steps/s of the tiny random model
        (compiled steps only; the batches are prepared beforehand, so no data time is in it)
goal    ours / anchor >= 5

The store is synthetic, written through the real StoreWriter with demo-sized screenshots (500x240
PNGs, 512 patches each; rmsweb_jax/collect/store_fixture.py), so the bench needs no browser. Ends with one
JSON line (bench/report.py).

    .venv/bin/python bench/sft_data.py            # 48 examples, 8 batches per worker setting, 4 train steps
    .venv/bin/python bench/sft_data.py --quick    # ~75 s on 2 busy cores, most of it one train-step compile
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.report import emit  # noqa: E402


def pipeline_rate(view, indices, data, *, tokenizer_dir, image_config, prompt_config, rows, batches: int) -> dict:
    """Returns examples/s, tokens/s and start-up seconds of the pipeline over `batches` timed batches."""
    from rmsweb_jax.data.sft import EncodeSFTExample, SFTBatches
    start = time.perf_counter()
    encoder = EncodeSFTExample(tokenizer_dir, image_config, prompt_config, mask=data.mask)
    with SFTBatches(view, indices, data, encoder, rows=rows) as it:
        next(it)
        startup = time.perf_counter() - start
        tokens, t0 = 0, time.perf_counter()
        for _ in range(batches):
            tokens += int((next(it)["segment_ids"] > 0).sum())
        seconds = time.perf_counter() - t0
    return {"examples_per_s": batches * rows / seconds, "tokens_per_s": tokens / seconds, "startup_s": startup,
            "seconds": seconds}


def trainer_rate(trainer, host_batches, warmup: int) -> dict:
    """Returns train steps/s over the batches after `warmup` (compile) steps."""
    import jax
    # The initial state is uncommitted and the step's output committed, which makes jit compile the
    # step twice on one device; placing the state first keeps it to one compile (not timed either way).
    trainer.state = jax.device_put(trainer.state, jax.devices()[0]) if trainer.mesh is None else trainer.state
    times = []
    for i, batch in enumerate(host_batches):
        t0 = time.perf_counter()
        trainer.step(batch)
        jax.block_until_ready(trainer.state.params)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return {"steps_per_s": len(times) / sum(times), "step_s": sum(times) / len(times), "steps": len(times)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer examples, batches and steps (about a minute)")
    args = parser.parse_args()
    from configs.demo import get_config

    from rmsweb_jax.agents.prompt import prompt_config_from
    from rmsweb_jax.collect.sft_view import SFTView
    from rmsweb_jax.data.sft import EncodeSFTExample, SFTBatches, SFTDataConfig
    from rmsweb_jax.collect.store_fixture import write_synthetic_store
    from rmsweb_jax.train.tokenizer import check_tokenizer
    from rmsweb_jax.train.loop import Trainer

    tasks, seeds, n_batches, steps = (4, 2, 4, 1) if args.quick else (8, 2, 8, 4)
    with tempfile.TemporaryDirectory(prefix="bench_sft_data_") as tmp:
        tmp = pathlib.Path(tmp)
        config = get_config()
        config.data.store_dir = str(write_synthetic_store(tmp / "store", tasks=tasks, seeds=seeds,
                                                          viewport=(500, 240)))
        config.train.export_hf = False
        config.train.checkpoint.every_steps = 10 ** 6
        config.train.optimizer.total_steps = 10 ** 6
        trainer = Trainer(config, tmp, name="bench_sft")
        _, image_config = check_tokenizer(trainer.init_dir, trainer.model_config)
        view = SFTView(config.data.store_dir)
        indices = range(len(view))
        data = SFTDataConfig.from_config(config.data, tmp)
        rows = trainer.local_rows
        results = {}
        for workers in (0, 2):
            results[workers] = pipeline_rate(view, indices, dataclasses.replace(data, worker_count=workers),
                                             tokenizer_dir=trainer.init_dir, image_config=image_config,
                                             prompt_config=prompt_config_from(config), rows=rows,
                                             batches=n_batches)
            r = results[workers]
            print(f"pipeline, {workers} workers: {r['examples_per_s']:.1f} examples/s, {r['tokens_per_s']:.0f} "
                  f"tokens/s (start-up {r['startup_s']:.1f} s)", flush=True)
        warmup = 1
        encoder = EncodeSFTExample(trainer.init_dir, image_config, prompt_config_from(config), mask=data.mask)
        with SFTBatches(view, indices, data, encoder, rows=rows) as it:
            host_batches = [next(it) for _ in range(warmup + steps)]
        shape = host_batches[0]["input_ids"].shape
        try:
            train = trainer_rate(trainer, host_batches, warmup)
        finally:
            trainer.close()
        consumption = train["steps_per_s"] * rows
        print(f"trainer (demo config, batch {shape}): {train['step_s']:.2f} s/step -> {consumption:.2f} examples/s",
              flush=True)
        demo_workers = data.worker_count
        ours = results[demo_workers]["examples_per_s"]
        emit(f"sft_data examples/s [demo config, {demo_workers} workers] vs trainer consumption", ours, consumption,
             "examples/s", 5.0, workers0_examples_per_s=round(results[0]["examples_per_s"], 2),
             workers2_examples_per_s=round(results[2]["examples_per_s"], 2),
             workers0_tokens_per_s=round(results[0]["tokens_per_s"]),
             workers2_tokens_per_s=round(results[2]["tokens_per_s"]),
             ratio_workers2=round(results[2]["examples_per_s"] / consumption, 2),
             train_step_s=round(train["step_s"], 3), batch_shape=list(shape), examples=len(view))


if __name__ == "__main__":
    main()
