"""A training process imports no torch where torch is installed (as it is for these tests): tensorboardX's writer
and transformers' AutoTokenizer would each import it (~3 CPU-seconds a process; rmsweb_jax/tensorboardx_import.py).
The event files are still written and read back, and a process that has torch already keeps it."""
import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]

_TRAINING_PROCESS = textwrap.dedent("""
    import json, pathlib, sys
    from configs.common import base_config
    from rmsweb_jax.evaluate.tb_events import read_scalars
    from rmsweb_jax.processing.prompt_tokens import load_tokenizer
    from rmsweb_jax.processing.tiny_tokenizer import build_tiny_tokenizer
    from rmsweb_jax.train.metrics import MetricsWriter
    from rmsweb_jax.train.run_record import run_identity, write_tensorboard
    out = pathlib.Path(sys.argv[1])
    if sys.argv[2] == "torch first":
        import torch  # noqa: F401
    build_tiny_tokenizer(out / "tokenizer")
    ids = load_tokenizer(out / "tokenizer")("Click the button")["input_ids"]
    writer = MetricsWriter(out / "run", total_steps=2, progress=False)
    writer.write(1, {"loss": 2.5})
    writer.write(2, {"loss": 1.5})
    writer.close()
    write_tensorboard(out / "run" / "tensorboard", base_config(), run_identity())
    print(json.dumps({"torch": "torch" in sys.modules, "ids": ids,
                      "loss": read_scalars(out / "run" / "tensorboard")["train/loss"]}))
""")


@pytest.mark.parametrize("first", ["nothing first", "torch first"])
def test_a_training_process_imports_no_torch_and_still_writes_tensorboard(tmp_path, first):
    done = subprocess.run([sys.executable, "-c", _TRAINING_PROCESS, str(tmp_path), first], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["torch"] == (first == "torch first")
    assert got["ids"] and got["loss"] == [[1, 2.5], [2, 1.5]]
    assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*.run"))  # the config's own file
