"""Test-wide setup: 8 host CPU devices for mesh tests, fp32 matmuls, the benchmark task files
(real ones from $RMSWEB_BENCHMARKS, or small fixture records the tests write)."""
import gc
import os
import pathlib
import signal

# Must happen before jax is imported anywhere.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# One XLA compilation cache for the whole run: the pytest-xdist workers and every process a test starts (kill -9
# and resume, two-process runs, `python -m rmsweb_jax.main`) inherit it, so a program that several of them compile
# (the micro pipeline's steps, a run and its resumed rerun) compiles once. Made fresh for each run and removed at
# its end (pytest_sessionfinish), so nothing carries over from an earlier checkout; a JAX_COMPILATION_CACHE_DIR
# already set is used as it is and kept. RMSWEB_TEST_COMPILE_CACHE=0 turns it off.
_RUN_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ and os.environ.get("RMSWEB_TEST_COMPILE_CACHE", "1") != "0":
    import tempfile
    _RUN_CACHE = tempfile.mkdtemp(prefix="rmsweb-test-xla-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _RUN_CACHE
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

# One byte-code cache for the run too. Where PYTHONDONTWRITEBYTECODE is set (as on the machines this project is built
# on), Python writes no .pyc of what it imports, so every process the run starts compiled every module it imported
# (jax, transformers, torch, ours) from source: ~6 of the ~11 CPU-seconds of those imports, paid again by each of
# the hundreds of processes. The run's processes write theirs to this folder instead (PYTHONPYCACHEPREFIX: nothing
# lands in the venv or the checkout), so each module compiles once a run. RMSWEB_TEST_BYTECODE_CACHE=0 turns it off.
_RUN_PYCACHE = None
if "PYTHONPYCACHEPREFIX" not in os.environ and os.environ.get("RMSWEB_TEST_BYTECODE_CACHE", "1") != "0":
    import tempfile
    _RUN_PYCACHE = tempfile.mkdtemp(prefix="rmsweb-test-pycache-")
    os.environ["PYTHONPYCACHEPREFIX"] = _RUN_PYCACHE
    os.environ["PYTHONDONTWRITEBYTECODE"] = ""  # empty: unset, for the processes started from here on
    import sys
    sys.pycache_prefix, sys.dont_write_bytecode = _RUN_PYCACHE, False  # and for this one's imports from here on

# XLA:CPU without its costly back-end work (LLVM at -O0, its expensive passes off: jax_disable_most_optimizations)
# for the programs the run and the processes it starts compile. The tests' programs are small and most run a few
# times, so the optimizer's time is spent on nothing: 27% less CPU on the model and sampler parity files, 13% less
# even on the salvage stage's and the group sampler's files, which run their programs longest (side by side on
# one host). The HLO passes are the same, so the memory analyses and FLOP counts the tests read are too; the
# ahead-of-time TPU compiles keep full optimization (tpu_aot.compile_program). JAX_DISABLE_MOST_OPTIMIZATIONS=0
# keeps it everywhere.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

# `make test` runs two pytest-xdist workers, which ignore SIGINT; a child process inherits an ignored signal, so
# a test's child would not see the Ctrl-C the test sends it. Python's own handler here (as in a terminal) lets
# children start with the default disposition.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)



@pytest.fixture(autouse=True, scope="module")
def _compiled_programs_freed_after_each_file():
    """Frees the XLA programs a test file compiled once it ends (jax.clear_caches). XLA:CPU maps every compiled
    kernel into the process (3 memory maps each), and a process may hold at most vm.max_map_count (65,530) maps: a
    pytest-xdist worker that runs hundreds of files would cross it and crash in a later mmap (a segfault seen twice
    at ~89% of `make test`, the worker at ~30,000 maps and rising). A program another file compiles again comes
    from the run's compilation cache above."""
    yield
    jax.clear_caches()
    gc.collect()


REPO = pathlib.Path(__file__).resolve().parents[1]
# The real task files (../shared/benchmarks in the project's own checkouts and CI; a folder made
# by `python -m rmsweb_jax.suites.download --suite=all --dest=DIR` anywhere else).
BENCHMARKS = pathlib.Path(os.environ.get("RMSWEB_BENCHMARKS") or REPO.parent / "shared" / "benchmarks")


def pytest_collection_modifyitems(config, items):
    # `pytest -m benchmarks` selects every test that reads the real task files.
    for item in items:
        if "benchmarks_dir" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.benchmarks)
    # The costliest files first. make test's workers take whole files in this order (pytest-xdist's --dist loadfile
    # with --no-loadscope-reorder; its own reorder puts the files with the most tests first, so one- and two-test
    # files of minutes of compiles ran last, a core idle beside them): a run that ends on short files ends with
    # both cores busy. The costs: tests/file_cpu_seconds.json (tests/file_costs.py); a file it lacks goes last.
    from tests.file_costs import nodeid_file, read_costs
    costs, first_seen = read_costs(), {}
    for item in items:
        first_seen.setdefault(nodeid_file(item.nodeid), len(first_seen))
    items.sort(key=lambda item: (-costs.get(nodeid_file(item.nodeid), 0), first_seen[nodeid_file(item.nodeid)]))


@pytest.fixture(scope="session")
def benchmarks_dir() -> pathlib.Path:
    """Returns the folder of the real benchmark task files ($RMSWEB_BENCHMARKS, default
    ../shared/benchmarks); skips the test when the folder lacks any of them."""
    from rmsweb_jax.suites.download import TASK_FILES
    missing = [f.name for f in TASK_FILES if not (BENCHMARKS / f.name).is_file()]
    if missing:
        where = (str(BENCHMARKS) if len(missing) == len(TASK_FILES)
                 else f"{BENCHMARKS} ({len(missing)} of {len(TASK_FILES)} missing, e.g. {missing[0]})")
        pytest.skip(f"benchmark task files not found at {where}; set RMSWEB_BENCHMARKS to a folder with them "
                    "(python -m rmsweb_jax.suites.download --suite=all --dest=DIR)")
    return BENCHMARKS


@pytest.fixture(scope="session", params=["fixture", pytest.param("benchmarks", marks=pytest.mark.benchmarks)])
def benchmark_files(request, tmp_path_factory) -> pathlib.Path:
    """Returns a folder in the real files' layout: once with the small fixture records of
    tests/benchmark_fixtures.py (always there), once the real files (benchmarks_dir; skipped when absent)."""
    if request.param == "benchmarks":
        return request.getfixturevalue("benchmarks_dir")
    from tests.benchmark_fixtures import write_benchmark_files
    folder = tmp_path_factory.mktemp("benchmark_fixtures")
    write_benchmark_files(folder)
    return folder


@pytest.fixture(scope="module")
def loop():
    """An event loop in a thread (browser tests): loop.run(coro) blocks for the result."""
    from rmsweb_jax.web.loop_thread import LoopThread
    with LoopThread() as lt:
        yield lt


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory):
    """Yields the gs:// URL of an empty bucket on a GCS emulator on 127.0.0.1 (tests/storage_emulator.py), with
    gcsfs, tensorstore and the bucket mirrors pointed at it for the whole session."""
    from tests.storage_emulator import BUCKET, emulator_env, start_emulator, stop_emulator
    root = tmp_path_factory.mktemp("gcs")
    proc, url = start_emulator(root / "emulator.log")
    saved = {k: os.environ.get(k) for k in emulator_env(url, root)}
    os.environ.update(emulator_env(url, root / "mirrors"))
    try:
        yield f"gs://{BUCKET}"
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        stop_emulator(proc)


def _cpu_seconds() -> float:
    import resource
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With RMSWEB_TEST_CPU=FILE, appends each test's CPU seconds (setup + call + teardown, this process and the
    children it waited for; a browser counts when its driver exits) and wall seconds to FILE as a JSON line:
    where the suite's core-minutes go, which --durations (wall, inflated by the other worker) cannot say."""
    path = os.environ.get("RMSWEB_TEST_CPU")
    if not path:
        yield
        return
    import json
    import time
    cpu, wall = _cpu_seconds(), time.perf_counter()
    yield
    row = {"test": item.nodeid, "cpu_s": round(_cpu_seconds() - cpu, 2), "wall_s": round(time.perf_counter() - wall, 2)}
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def pytest_sessionfinish(session):
    # Only the process that made the caches removes them (with xdist, the controller, after both workers are done).
    import shutil
    import sys
    if _RUN_PYCACHE:
        sys.dont_write_bytecode = True  # a module imported while the process exits would make the folder again
    for made in (_RUN_CACHE, _RUN_PYCACHE):
        if made:
            shutil.rmtree(made, ignore_errors=True)
