"""launch/colab_tpu.ipynb run top to bottom with nbclient on a CPU ipykernel of this venv, as Colab would
run it: the model stage, a MiniWoB++ collection in real Chromium from inside the kernel's running event
loop, one SFT step, mining, one Salvage-DS step and the trajectory viewer; then its outputs are checked.

The notebook's parameter cell (tagged `parameters`) is followed by an injected cell, as papermill does:
the checkout itself (SOURCE = 'local'), no install, a CPU, and a run folder under tmp_path."""
import json
import math
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "launch" / "colab_tpu.ipynb"
KERNEL = "rmsweb-venv"
CELL_TIMEOUT_S = 900  # one cell; the slowest (collection, Salvage-DS) take ~1 min on 2 busy cores


def _kernelspec(root: pathlib.Path) -> pathlib.Path:
    """Writes a kernelspec that starts ipykernel with this interpreter (the venv's, on a fresh clone after
    `make install`) and returns the folder to put on JUPYTER_PATH."""
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "rmsweb_jax venv", "language": "python",
        "env": {"JAX_PLATFORMS": "cpu"}}))
    return root


def _with_parameters(nb, run_dir: pathlib.Path):
    """Returns the notebook with a cell after its `parameters` cell that points it at this checkout."""
    import nbformat
    (at,) = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    injected = nbformat.v4.new_code_cell(
        f'SOURCE = "local"\nREPO_DIR = {str(REPO)!r}\nINSTALL = False\nACCELERATOR = "cpu"\nRUN_DIR = {str(run_dir)!r}\n')
    injected.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(at + 1, injected)
    return nb


def _text(cell) -> str:
    """Returns what a cell printed and displayed, as one string."""
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append(out["text"])
        elif out["output_type"] in ("display_data", "execute_result"):
            parts.extend(str(v) for v in out["data"].values())
    return "".join(parts)


@pytest.mark.slow
@pytest.mark.browser
def test_the_notebook_runs_top_to_bottom_on_a_cpu_kernel(tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("JUPYTER_PATH", str(_kernelspec(tmp_path / "jupyter")))
    run_dir = tmp_path / "runs"
    nb = _with_parameters(nbformat.read(NOTEBOOK, as_version=4), run_dir)
    NotebookClient(nb, kernel_name=KERNEL, timeout=CELL_TIMEOUT_S, startup_timeout=120,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()  # raises CellExecutionError
    assert not [c for c in nb.cells if c.cell_type == "code" and any(o["output_type"] == "error" for o in c.outputs)]

    workdir = run_dir / "demo"
    out = {i: _text(c) for i, c in enumerate(nb.cells) if c.cell_type == "code"}
    text = "\n".join(out.values())
    assert "CpuDevice(id=0)" in text  # the device check ran and said what JAX sees
    smoke = json.loads((workdir / "model_smoke.json").read_text())
    assert smoke["completion"] is not None

    # The collection ran in the kernel, whose thread runs an event loop: 3 tasks x 1 seed, every one stored.
    report = json.loads((workdir / "collect_report.json").read_text())
    assert report["tasks"] == 3 and report["trajectories"] >= 3 and report["steps"] > 0, report

    sft = json.loads((workdir / "sft" / "summary.json").read_text())
    assert sft["steps"] == 1 and math.isfinite(sft["last_loss"]) and sft["last_loss"] > 0, sft
    assert (workdir / "sft" / "hf" / "config.json").is_file()
    assert (workdir / "mine" / "states.arrayrecord").is_file()
    salvage = json.loads((workdir / "salvage" / "summary.json").read_text())
    assert salvage["steps"] == 1, salvage
    assert (workdir / "salvage" / "hf" / "config.json").is_file()

    # The viewer: an index and one page per stored attempt, the first shown inline with its screenshots.
    index = workdir / "viewer" / "index.html"
    pages = sorted((workdir / "viewer" / "episodes").glob("*/*.html"))
    assert index.is_file() and len(pages) == report["trajectories"]
    assert f"{len(pages)} episode pages" in text
    assert "data:image/png;base64," in text and "Step 1" in text
    assert "no checkpoint at" in text  # the HF-checkpoint cells said why they skipped
