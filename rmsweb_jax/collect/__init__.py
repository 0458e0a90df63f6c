"""Collection: reflection-conditioned retries in the browser, and the trajectory store.

- records.py: StepRecord / TrajectoryRecord (msgpack, versioned schema documented there)
- store.py: TrajectoryStore (reader) and StoreWriter (crash-safe ArrayRecord shards)
- store_layout.py: file names, store.json, per-flush markers (counts, sizes, sha256), damage detection
- store_check.py: `python -m rmsweb_jax.collect.store --check/--repair DIR` (quarantines damaged flushes)
- store_provenance.py: the prompt / tokenizer / image settings a store's steps were produced with
- store_fixture.py: a deterministic synthetic store and task groups (tests, benches)
- sft_view.py: SFTView, the successful steps as a Grain source (reflection-free)
- adapter.py: PolicyBridge, the pool's per-episode policy over a batched Policy.act
- retries.py: RetryCollector, the retry loop
- report.py: report.json / .md / .png computed from the store

Names are imported on first use, so reading the store does not pull in Grain or Playwright.
"""
import importlib

_EXPORTS = {
    "AttemptSpec": "adapter", "PolicyBridge": "adapter", "split_turn": "adapter",
    "SCHEMA_VERSION": "records", "SchemaError": "records", "StepRecord": "records", "TrajectoryRecord": "records",
    "decode_record": "records", "request_id": "records", "task_key": "records",
    "compute_report": "report", "write_report": "report",
    "CollectSummary": "retries", "RetryCollector": "retries",
    "SFTExample": "sft_view", "SFTView": "sft_view",
    "StoreError": "store", "StoreWriter": "store", "TrajectoryStore": "store",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rmsweb_jax.collect' has no attribute {name!r}")
    return getattr(importlib.import_module(f"rmsweb_jax.collect.{_EXPORTS[name]}"), name)
