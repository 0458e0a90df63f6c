"""The layer contract (.importlinter) holds, and breaks when a lower layer imports a higher one."""
import os
import pathlib
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
LINT = pathlib.Path(sys.executable).with_name("lint-imports")


def _lint(root: pathlib.Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(root))  # the packages under `root`, not the installed ones
    return subprocess.run([str(LINT), str(root / ".importlinter"), "--no-cache"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


def test_lint_imports_passes_on_the_tree():
    proc = _lint(REPO)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_an_upward_import_breaks_the_contract(tmp_path):
    # A copy of the packages with the old back-up import put back: the server reaching for an agent class.
    for name in ("rmsweb_jax", "kernels"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / ".importlinter", tmp_path / ".importlinter")
    serve = tmp_path / "rmsweb_jax" / "sampling" / "serve.py"
    serve.write_text(serve.read_text() + "\n\ndef _policy():\n    from rmsweb_jax.agents.flax_policy import FlaxPolicy\n"
                     "    return FlaxPolicy\n")
    proc = _lint(tmp_path)
    assert proc.returncode != 0
    assert "rmsweb_jax.sampling.serve -> rmsweb_jax.agents.flax_policy" in proc.stdout, proc.stdout[-4000:]
