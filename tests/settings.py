"""Settings objects with configs/common.py's defaults, for tests: the classes take no defaults of their
own (tests/test_one_source_for_defaults.py), so a test builds them here and changes only what it tests."""
from __future__ import annotations

import dataclasses
import os

from configs.common import base_config
from rmsweb_jax.collect.retries import CollectSettings
from rmsweb_jax.collect.store import StoreWriter
from rmsweb_jax.data.sft import SFTDataConfig
from rmsweb_jax.sampling.serve import SERVE_DEFAULTS, ServeSettings

COLLECT = base_config().collect


def collect_settings(**changes) -> CollectSettings:
    """Returns config.collect's defaults with `changes`."""
    return dataclasses.replace(CollectSettings.from_config(COLLECT), **changes)


def store_writer(directory: str | os.PathLike, **kwargs) -> StoreWriter:
    """Returns a StoreWriter flushing as config.collect's defaults do unless `kwargs` say otherwise."""
    flush = {"flush_every_tasks": COLLECT.flush_every_tasks, "flush_every_s": COLLECT.flush_every_s}
    return StoreWriter(directory, **{**flush, **kwargs})


def sft_data(store_dir: str | os.PathLike, **changes) -> SFTDataConfig:
    """Returns config.data's defaults over the store at `store_dir`, with `changes`."""
    return dataclasses.replace(SFTDataConfig.from_config(base_config().data, ""), store_dir=str(store_dir), **changes)


def serve_settings(**changes) -> ServeSettings:
    """Returns the server's defaults (SERVE_DEFAULTS) on any free port, with `changes`."""
    return dataclasses.replace(SERVE_DEFAULTS, **{"port": 0, **changes})
