"""run_sync: a coroutine run to completion from blocking code, with or without an event loop
already running in the calling thread (a Jupyter/Colab cell runs inside one); Ctrl-C while
waiting cancels the coroutine and lets its cleanup run before the KeyboardInterrupt surfaces."""
import asyncio
import pathlib
import signal
import subprocess
import sys
import threading

import pytest

from rmsweb_jax.web.loop_thread import run_sync

REPO = pathlib.Path(__file__).resolve().parents[2]


async def _where(value):
    await asyncio.sleep(0)
    return value, threading.get_ident(), asyncio.get_running_loop()


def test_without_a_running_loop_it_runs_in_the_calling_thread():
    value, thread, _ = run_sync(_where(7))
    assert value == 7 and thread == threading.get_ident()


def test_inside_a_running_loop_it_runs_on_a_loop_of_its_own_and_raises_what_the_coroutine_raises():
    async def boom():
        await asyncio.sleep(0)
        raise KeyError("inner")

    async def cell():
        value, thread, loop = run_sync(_where(8))
        assert loop is not asyncio.get_running_loop() and loop.is_closed()  # asyncio.run's loop, closed after
        with pytest.raises(KeyError, match="inner"):
            run_sync(boom())
        return value, thread

    value, thread = asyncio.run(cell())
    assert value == 8 and thread != threading.get_ident()


# A child process: a running loop whose thread waits in run_sync on a coroutine that never ends
# on its own; SIGINT (Ctrl-C, or Jupyter's interrupt) must cancel it and run its `finally`. (Under
# asyncio.run() in the main thread a first SIGINT only cancels the main task, which cannot run
# while its thread waits; there the second one raises.)
_CHILD = r"""
import asyncio, pathlib, sys
from rmsweb_jax.web.loop_thread import run_sync

marker = pathlib.Path(sys.argv[1])

async def forever():
    try:
        print("started", flush=True)
        await asyncio.Event().wait()
    finally:
        await asyncio.sleep(0)  # cleanup that needs the loop, like closing a browser
        marker.write_text("cleaned up")

async def cell():
    run_sync(forever())

loop = asyncio.new_event_loop()  # run_until_complete, as ipykernel runs a cell: SIGINT stays KeyboardInterrupt
try:
    loop.run_until_complete(cell())
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_ctrl_c_while_waiting_cancels_the_coroutine_and_runs_its_cleanup(tmp_path):
    marker = tmp_path / "marker"
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(marker)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "started"  # blocks until the coroutine runs
        child.send_signal(signal.SIGINT)
        out, _ = child.communicate(timeout=60)
    finally:
        child.kill()
    assert out.strip() == "interrupted" and child.returncode == 0
    assert marker.read_text() == "cleaned up"
