"""One contender for a workdir's lock, for tests/test_workdir_lock.py and the 20-try race script.

    python -m tests.lock_contender WORKDIR GO_FILE RELEASE_FILE

Prints "ready" once imported, waits until GO_FILE exists (so contenders start together), takes the lock of WORKDIR and prints "won", then
holds it until RELEASE_FILE exists; a refused contender prints its one-line error and exits with status 2.
"""
import os
import sys
import time

from rmsweb_jax.errors import UserError
from rmsweb_jax.workdir_lock import WorkdirLock


def main(workdir: str, go: str, release: str) -> int:
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.001)  # a start line for the contenders: the race itself does not depend on this wait
    try:
        lock = WorkdirLock.acquire(workdir)
    except UserError as err:
        print(f"refused: {err}", flush=True)
        return 2
    print("won", flush=True)
    while not os.path.exists(release):
        time.sleep(0.01)
    lock.release()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
