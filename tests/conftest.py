"""Test-wide setup: 8 host CPU devices for mesh tests, fp32 matmuls, the shared benchmark folder."""
import os
import pathlib

# Must happen before jax is imported anywhere.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> pathlib.Path:
    """The read-only shared/ folder beside the checkout (benchmark task files)."""
    if not SHARED.is_dir():
        pytest.fail(f"shared/ folder not found at {SHARED}")
    return SHARED


@pytest.fixture(scope="module")
def loop():
    """An event loop in a thread (browser tests): loop.run(coro) blocks for the result."""
    from rmsweb_jax.web.loop_thread import LoopThread
    with LoopThread() as lt:
        yield lt
