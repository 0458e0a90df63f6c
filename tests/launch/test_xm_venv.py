"""The xmanager launcher in its own venv, built with pip from launch/requirements-xm.txt (slow: ~1 min on
2 cores), run the way its docs say: `xmanager launch launch/xm_launch.py -- ... --dry_run`. Checks the
machine type Vertex gets, the override checks against the config, and the refusals.

RMSWEB_XM_VENV=/path/to/venv reuses a venv already built from requirements-xm.txt instead of building one.
"""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from launch import xm_job

REPO = pathlib.Path(__file__).resolve().parents[2]
REQUIREMENTS = REPO / "launch" / "requirements-xm.txt"
VERTEX_8B = ["--backend=vertex", "--config=configs/qwen3_vl_8b.py", "--workdir=/gcs/my-bucket/runs/8b"]


def pins(path: pathlib.Path) -> dict[str, str]:
    """Returns {normalized distribution name: version} of the NAME==VERSION lines of a requirements file."""
    found = {}
    for line in path.read_text().splitlines():
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", line.split("#")[0].strip())
        if match:
            found[re.sub(r"[-_.]+", "-", match[1]).lower()] = match[2]
    return found


def test_launcher_pins_agree_with_the_project_constraints():
    # The launcher loads the configs with jax and ml_collections: the versions the project tested them with.
    launcher, project = pins(REQUIREMENTS), pins(REPO / "constraints.txt")
    shared = (set(launcher) & set(project)) - {"protobuf"}  # protobuf < 7 is why the launcher has its own venv
    assert {"jax", "jaxlib", "ml-collections", "numpy", "absl-py"} <= shared
    assert {k: launcher[k] for k in shared} == {k: project[k] for k in shared}


@pytest.fixture(scope="module")
def xm_venv(tmp_path_factory):
    """Yields the bin/ folder of a venv with launch/requirements-xm.txt installed (removed afterwards: ~1.2 GB)."""
    if os.environ.get("RMSWEB_XM_VENV"):
        yield pathlib.Path(os.environ["RMSWEB_XM_VENV"]) / "bin"
        return
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    try:
        urllib.request.urlopen(f"{index}/xmanager/", timeout=20).close()
    except (urllib.error.URLError, OSError) as err:
        pytest.skip(f"the package index {index} is unreachable ({err}): cannot build the launcher's venv")
    venv = tmp_path_factory.mktemp("xm") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    # --no-compile: byte-compiling the ~95 packages was 60% of the install's CPU; the dry runs compile what they
    # import. No nice: a niced install waited minutes for the cores while this xdist worker sat idle.
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-compile"]
    for args in (["--upgrade", "pip"], ["-r", str(REQUIREMENTS)]):  # pip 23 backtracks for ages on these pins
        done = subprocess.run(pip + args, capture_output=True, text=True, timeout=1200)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    check = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "check"], capture_output=True, text=True,
                           timeout=120)
    assert check.returncode == 0, check.stdout
    yield venv / "bin"
    shutil.rmtree(venv)


def launch(bin_dir: pathlib.Path, *args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    """Runs `xmanager launch launch/xm_launch.py -- ARGS --dry_run` from `cwd`; returns the CompletedProcess."""
    return subprocess.run([str(bin_dir / "xmanager"), "launch", str(REPO / "launch" / "xm_launch.py"), "--",
                           *args, "--dry_run"], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_dry_run_h100_on_vertex_gets_an_a3_machine_and_checked_overrides(xm_venv, tmp_path):
    result = launch(xm_venv, *VERTEX_8B, "--accelerator=h100", "--topology=8",
                    "--override=model.init=hf:/gcs/my-bucket/Qwen3-VL-8B-Instruct", "--override=seed=3",
                    "--override=mesh.shape=(1,4,2)", cwd=tmp_path)  # not the repo: paths come from the script
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    # xmanager's own Vertex code computes this line, with the machine type the launcher pins.
    assert "machine:      a3-highgpu-8g with 8 x NVIDIA_H100_80GB" in out
    assert "overrides:    model.init='hf:/gcs/my-bucket/Qwen3-VL-8B-Instruct', seed=3, mesh.shape=(1, 4, 2)" in out
    assert ("command:      python -m rmsweb_jax.main --config=configs/qwen3_vl_8b.py --workdir=/gcs/my-bucket/runs/8b "
            "--config.model.init=hf:/gcs/my-bucket/Qwen3-VL-8B-Instruct --config.seed=3 --config.mesh.shape=(1,4,2)"
            ) in out
    assert "-c constraints.txt -e '.[gpu]'" in out


@pytest.mark.slow
@pytest.mark.parametrize("args, machine", [
    (["--accelerator=h200", "--topology=8"], "a3-ultragpu-8g with 8 x NVIDIA_H200_141GB"),
    (["--accelerator=a100_80gb", "--topology=4"], "a2-ultragpu-4g with 4 x NVIDIA_A100_80GB"),
    (["--accelerator=a100", "--topology=16"], "a2-megagpu-16g with 16 x NVIDIA_TESLA_A100"),
    (["--accelerator=cpu"], "n1-standard-4"),  # xmanager's own choice for a CPU job
])
def test_dry_run_machine_types_on_vertex(xm_venv, tmp_path, args, machine):
    result = launch(xm_venv, *VERTEX_8B, *args, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"machine:      {machine}\n" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["--accelerator=h200", "--topology=4"], "Vertex AI offers h200 only in machines of 8 (a3-ultragpu-8g) GPUs"),
    (["--accelerator=h100", "--topology=8", "--override=model.int=hf:/x"],
     "configs/qwen3_vl_8b.py has no key 'model.int'; nearest known keys: model.init"),
    (["--accelerator=h100", "--topology=8", "--override=seed=abc"], "seed is int (0 in configs/qwen3_vl_8b.py)"),
    (["--accelerator=h100", "--topology=8", "--replicas=2"], "--replicas=2: xm_local's Vertex backend runs one"),
    (["--accelerator=tpu_v5e", "--topology=4x4"], "launch TPU v5e/v5p/v6e slices with launch/gcloud_tpu.sh"),
])
def test_dry_run_refusals_name_the_input_at_fault(xm_venv, tmp_path, args, message):
    result = launch(xm_venv, *VERTEX_8B, *args, cwd=tmp_path)
    assert result.returncode != 0 and message in result.stderr, result.stdout + result.stderr
    assert "docker steps:" not in result.stdout  # refused before anything was staged or printed as planned


@pytest.mark.slow
@pytest.mark.parametrize("args, scheduling", [
    ([], "on-demand VMs; a restarted worker (preemption) restarts the job, which resumes from its workdir"),
    (["--spot"], "spot VMs; a restarted worker (preemption) restarts the job, which resumes from its workdir"),
    (["--spot", "--norestart_on_preemption"], "spot VMs; a restarted worker (preemption) ends the job"),
])
def test_dry_run_on_vertex_says_how_a_preemption_is_met(xm_venv, tmp_path, args, scheduling):
    result = launch(xm_venv, *VERTEX_8B, "--accelerator=h100", "--topology=8", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"scheduling:   {scheduling}" in result.stdout


@pytest.mark.slow
def test_spot_is_refused_on_the_local_backend(xm_venv, tmp_path):
    result = launch(xm_venv, "--backend=local", "--config=configs/demo.py", "--workdir=/tmp/x", "--spot",
                    cwd=tmp_path)
    assert result.returncode != 0 and "--spot is for --backend=vertex" in result.stderr, result.stderr


@pytest.mark.slow
def test_the_scheduling_arguments_are_ones_the_installed_vertex_client_takes(xm_venv):
    # xmanager submits the job itself; the launcher adds these to its CustomJob.submit call, so the installed
    # client must take them by these names, the strategy as its own enum.
    script = ("import inspect, sys; sys.path.insert(0, sys.argv[1]); from google.cloud import aiplatform; "
              "from launch import xm_job, xm_launch; "
              "args = xm_launch.submit_arguments(xm_job.vertex_scheduling(spot=True, restarts=True)); "
              "inspect.signature(aiplatform.CustomJob.submit).bind(None, **args); "
              "print(repr(args['scheduling_strategy']), args['restart_job_on_worker_restart'])")
    shown = subprocess.run([str(xm_venv / "python"), "-c", script, str(REPO)], capture_output=True, text=True,
                           timeout=300)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split() == ["<Strategy.SPOT:", "4>", "True"], shown.stdout


@pytest.mark.slow
def test_a100_table_agrees_with_xmanagers_own_mapping(xm_venv):
    # xmanager maps A100 40GB itself: the launcher's table must name the same machines.
    script = ("import json; from xmanager import xm, xm_local; from xmanager.cloud import vertex; print(json.dumps("
              "{n: vertex.get_machine_spec(xm.Job(executable=None, executor=xm_local.Vertex("
              "requirements=xm.JobRequirements(a100=n))))['machine_type'] for n in (1, 2, 4, 8, 16)}))")
    shown = subprocess.run([str(xm_venv / "python"), "-c", script], capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr
    theirs = {int(n): machine for n, machine in json.loads(shown.stdout.splitlines()[-1]).items()}
    assert theirs == xm_job.ACCELERATORS["a100"].vertex_machines
