"""One process of tests/train/test_multiprocess_images.py: Trainer steps on image batches, results to files.

    python -m tests.train.multiprocess_worker --init DIR --workdir DIR --out DIR --processes 2 --process-id I
        --port P [--mesh 1,-1,1]   (one of the processes; --processes 1: the single-process reference on the
                                    global batch)

The global batch is two feeds' rows (train/feeds.py): with mesh (1,-1,1) each process is a feed; with
(1,2,2) over 4 processes of one device, each feed is a pair of processes that share a tensor group and
load the same rows, as on a pod whose tensor groups span two hosts.

The environment sets the device count (XLA_FLAGS) and JAX_PLATFORMS=cpu. The batches are defined here
so that the test builds the same ones: each process holds different numbers and sizes of images.
"""
import argparse
import hashlib
import json
import os
import pathlib

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]
LENGTH, MICROBATCHES, STEPS = 32, 2, 3
BUCKETS = (128, 96)  # each process's fixed pixel_values rows (its patch bucket); the reference gets their max x 2
A = [[(1, 4, 4), (1, 4, 8)], [], [(1, 8, 4)], [(1, 4, 4)]]  # two images of different sizes, a row without
B = [[], [(1, 4, 4)], [], []]                                   # one image
TEXT = [[], [], [], []]                                         # no pixel_values at all
LAYOUTS = [(A, B), (B, A), (A, TEXT)]                           # per step: (process 0's rows, process 1's rows)


def rows_batch(cfg, grids_of_row, seed: int, patch_rows: int) -> dict[str, np.ndarray]:
    """Returns a contract batch of one row per entry of `grids_of_row` (that row's image grids in order);
    pixel_values padded to `patch_rows`; no pixel keys when no row has an image."""
    rng = np.random.default_rng(seed)
    merge = cfg.vision.spatial_merge_size
    forbidden = {cfg.image_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id, cfg.video_token_id}
    n_rows = len(grids_of_row)
    ids, seg = np.zeros((n_rows, LENGTH), np.int32), np.zeros((n_rows, LENGTH), np.int32)
    mask = np.zeros((n_rows, LENGTH), np.float32)
    grids, pixels = [], []
    for r, row_grids in enumerate(grids_of_row):
        row = [int(t) for t in rng.integers(7, cfg.text.vocab_size, 2)]
        for g in row_grids:
            row += [cfg.vision_start_token_id] + [cfg.image_token_id] * (int(np.prod(g)) // merge ** 2)
            row += [cfg.vision_end_token_id]
            grids.append(g)
            pixels.append(rng.standard_normal((int(np.prod(g)), cfg.vision.patch_dim)).astype(np.float32))
        n = LENGTH - 1 - (r + seed) % 4
        while len(row) < n:
            t = int(rng.integers(7, cfg.text.vocab_size))
            row.append(t if t not in forbidden else 7)
        ids[r, :n], seg[r, :n] = row, 1
        mask[r, n - 6:n] = 1.0
    out = {"input_ids": ids, "segment_ids": seg, "loss_mask": mask}
    if grids:
        pv = np.concatenate(pixels)
        out["pixel_values"] = np.concatenate([pv, np.zeros((patch_rows - len(pv), pv.shape[1]), np.float32)])
        out["image_grid_thw"] = np.array(grids, np.int32)
    return out


def process_batches(cfg, step: int) -> list[dict[str, np.ndarray]]:
    """Returns step `step`'s batch of each of the two processes."""
    return [rows_batch(cfg, layout, seed=100 * step + p, patch_rows=BUCKETS[p])
            for p, layout in enumerate(LAYOUTS[step])]


def global_batch(cfg, parts: list[dict[str, np.ndarray]], rows: list[tuple[int, int]] | None = None
                 ) -> dict[str, np.ndarray]:
    """Returns the processes' batches as one batch of `rows` ((process, row) in global order; default
    process-major), each row's images with it, pixels padded to the buckets' max x processes (where the
    multi-process patch budget starts)."""
    from rmsweb_jax.train import batch as batch_lib
    from rmsweb_jax.train import image_batch
    if rows is None:
        rows = [(p, r) for p, part in enumerate(parts) for r in range(len(part["input_ids"]))]
    images = []
    for part in parts:
        checked = batch_lib.validate_batch(part)
        images.append(image_batch.row_images(checked, cfg, checked["input_ids"], checked["segment_ids"]))
    out = {k: np.stack([parts[p][k][r] for p, r in rows]) for k in ("input_ids", "segment_ids", "loss_mask")}
    grids, pixels = [], []
    for p, r in rows:
        for i in ([] if images[p] is None else images[p].of_row[r]):
            g = images[p].grids[i]
            grids.append(g)
            pixels.append(images[p].pixels[images[p].starts[i]:images[p].starts[i] + int(np.prod(g))])
    pv = np.concatenate(pixels)
    out["pixel_values"] = np.concatenate([pv, np.zeros((max(BUCKETS) * len(parts) - len(pv), pv.shape[1]), np.float32)])
    out["image_grid_thw"] = np.array(grids, np.int32)
    return out


def _flat_params(params) -> dict[str, np.ndarray]:
    import jax
    return {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v)
            for path, v in jax.tree_util.tree_flatten_with_path(params)[0]}


def _config(init: str, mesh: tuple):
    from configs.common import base_config
    c = base_config()
    c.model.init = f"hf:{init}"
    c.mesh.shape = mesh
    t = c.train
    t.batch_size, t.microbatches, t.export_hf = 8, MICROBATCHES, False
    # eps = 1: Adam's first steps then move a parameter by ~lr x gradient, so a parameter difference is a
    # gradient difference (with eps = 1e-8 float noise of near-zero gradients becomes ~1e-5 steps).
    t.optimizer.lr, t.optimizer.warmup_steps, t.optimizer.total_steps, t.optimizer.eps = 0.1, 0, STEPS, 1.0
    t.checkpoint.every_steps, t.checkpoint.async_save = STEPS, False
    t.metrics.every_steps, t.metrics.peak_tflops = 1, 1.0
    return c


def _digest(tree) -> str:
    h = hashlib.sha256()
    for x in tree:
        h.update(np.ascontiguousarray(np.asarray(x)).tobytes())
    return h.hexdigest()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    for name in ("--init", "--workdir", "--out"):
        ap.add_argument(name, required=True)
    ap.add_argument("--processes", type=int, required=True)
    ap.add_argument("--process-id", type=int, default=0)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--mesh", default="1,-1,1")
    args = ap.parse_args(argv)
    import jax
    jax.config.update("jax_default_matmul_precision", "highest")  # as tests/conftest.py
    if args.processes > 1:
        jax.distributed.initialize(coordinator_address=f"127.0.0.1:{args.port}", num_processes=args.processes,
                                   process_id=args.process_id, initialization_timeout=120)
    from jax.experimental import multihost_utils

    from rmsweb_jax.models import sharding
    from rmsweb_jax.train import Trainer, global_images
    from rmsweb_jax.train import batch as batch_lib
    from rmsweb_jax.train.metrics import read_metrics

    out = pathlib.Path(args.out)
    me = jax.process_index()
    trainer = Trainer(_config(args.init, tuple(int(x) for x in args.mesh.split(","))), args.workdir, name="sft")
    cfg = trainer.model_config
    if args.processes > 1:
        batches = [process_batches(cfg, s)[trainer.feeds.index] for s in range(STEPS)]
    else:
        batches = [global_batch(cfg, process_batches(cfg, s)) for s in range(STEPS)]
        np.savez(out / "init.npz", **_flat_params(jax.device_get(trainer.state.params)))
    report = {"process": me, "devices": [d.id for d in jax.devices()], "feeds": trainer.feeds.groups,
              "device_processes": [d.process_index for d in jax.devices()], "vision": [], "placed_ids": []}
    for host in batches:  # what the trainer will feed the step: the global vision inputs and row order
        tb = batch_lib.prepare_batch(host, cfg, MICROBATCHES, rows=trainer.local_rows, mesh=trainer.mesh,
                                     rules=trainer.rules)
        vision = tb.inputs.vision
        report["vision"].append(None if vision is None else {"digest": _digest(vision),
                                                             "shape": list(vision.pixel_values.shape)})
        placed = batch_lib.to_global(tb, batch_lib.batch_shardings(tb, trainer.mesh, trainer.rules))
        ids = multihost_utils.process_allgather(placed.inputs.input_ids, tiled=True)
        report["placed_ids"].append(np.asarray(ids).tolist())
    if args.processes == 2:  # a mesh whose batch axis alternates processes: rows interleave, read, not assumed
        by_process = [[d for d in jax.devices() if d.process_index == p] for p in range(args.processes)]
        alternating = [d for group in zip(*by_process) for d in group]
        mesh = sharding.make_mesh((1, len(alternating), 1), devices=alternating)
        shape = (MICROBATCHES, 2 * len(alternating), LENGTH)  # 2 rows per device
        owners = global_images.row_owners(batch_lib.row_sharding(mesh, sharding.DEFAULT_RULES, shape, 1), shape)
        report["alternating_owners"] = owners.tolist()
        # A mesh whose tensor axis spans the processes (tensor = all devices): one feed, every row on both
        # processes, named by the lead; a process's rows are then the whole global batch.
        tensor_only = sharding.make_mesh((1, 1, jax.device_count()))
        owners = global_images.row_owners(batch_lib.row_sharding(tensor_only, sharding.DEFAULT_RULES, shape, 1),
                                          shape)
        report["tensor_only_owners"] = owners.tolist()
        placed = batch_lib.to_global(tb, batch_lib.batch_shardings(tb, tensor_only))
        report["tensor_only_rows"] = placed.targets.shape[1]
    result = trainer.fit(iter(batches))
    params = multihost_utils.process_allgather(trainer.state.params, tiled=True) if args.processes > 1 else \
        jax.device_get(trainer.state.params)
    if me == 0:
        report["losses"] = {s: m["loss"] for s, m in read_metrics(result.run_dir / "metrics.jsonl").items()}
        report["steps"] = result.step
        np.savez(out / "params.npz", **_flat_params(params))
    (out / f"report{me}.json").write_text(json.dumps(report))
    if args.processes > 1:
        jax.distributed.shutdown()


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    main()
