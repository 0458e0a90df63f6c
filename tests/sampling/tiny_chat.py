"""One tiny random ChatModel per test process, shared by the server and HTTP-policy tests.

Loading writes a random checkpoint and every new batch / prompt shape compiles, so the tests
that need a real model share this one instead of paying for it module by module.
"""
import atexit
import functools
import pathlib
import shutil
import tempfile


@functools.lru_cache(maxsize=None)
def _workdir() -> pathlib.Path:
    workdir = tempfile.mkdtemp(prefix="rmsweb-tiny-chat-")
    atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    return pathlib.Path(workdir)


@functools.lru_cache(maxsize=None)
def tiny_chat_model():
    """Returns ChatModel.load("random:tiny") (batches of up to 4) in a workdir removed at exit."""
    from rmsweb_jax.sampling.chat_model import ChatModel
    return ChatModel.load("random:tiny", _workdir(), max_batch=4)


def tiny_checkpoint_dir() -> pathlib.Path:
    """Returns the HF checkpoint folder tiny_chat_model() loaded (written on first use)."""
    tiny_chat_model()
    return _workdir() / "checkpoints" / "random_tiny"
