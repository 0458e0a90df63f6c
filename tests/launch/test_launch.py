"""Offline checks of launch/: the gcloud script (dry run, errors, a real run against a fake gcloud),
the Colab notebook, the xmanager launcher's importability and helpers, and the multi-host env parsing."""
import json
import os
import pathlib
import py_compile
import re
import shutil
import subprocess
import sys
import tarfile

import pytest

from launch import xm_job
from rmsweb_jax import distributed

REPO = pathlib.Path(__file__).resolve().parents[2]
LAUNCH = REPO / "launch"
SCRIPT = LAUNCH / "gcloud_tpu.sh"
SHELL_FILES = [SCRIPT, *sorted((LAUNCH / "remote").glob("*.sh")), pathlib.Path(__file__).with_name("fake_gcloud.sh")]
RUN = ["--name=my-tpu", "--zone=us-west4-a", "--accelerator=v5litepod-16",
       "--config=configs/qwen3_vl_8b.py", "--workdir=/mnt/my-bucket/runs/8b", "--shared-workdir"]  # multi-host:
# a bucket every worker mounts (gcsfuse) at the same path


def gcloud_tpu(*args, env=None, path_prefix=None):
    """Runs launch/gcloud_tpu.sh; returns the CompletedProcess (text)."""
    full_env = {**os.environ, **(env or {})}
    if path_prefix:
        full_env["PATH"] = f"{path_prefix}:{full_env['PATH']}"
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60, env=full_env)


def commands(out: str) -> list[str]:
    """Returns the '+ ...' lines the script printed, without the '+ '."""
    return [line[2:] for line in out.splitlines() if line.startswith("+ ")]


@pytest.fixture
def no_gcloud(tmp_path):
    """A gcloud on PATH that records any call, to prove a dry run calls nothing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gcloud").write_text(f"#!/bin/sh\necho called >> {tmp_path}/called\nexit 1\n")
    (bin_dir / "gcloud").chmod(0o755)
    yield str(bin_dir)
    assert not (tmp_path / "called").exists(), "--dry-run ran gcloud"


# ---- gcloud_tpu.sh ------------------------------------------------------------------------------
@pytest.mark.parametrize("path", SHELL_FILES, ids=lambda p: p.name)
def test_shell_scripts_parse(path):
    subprocess.run(["bash", "-n", str(path)], check=True, timeout=30)
    if shutil.which("shellcheck"):
        result = subprocess.run(["shellcheck", "-x", str(path)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout


def test_dry_run_prints_create_ship_install_run(no_gcloud):
    result = gcloud_tpu(*RUN, "--project=proj", "--spot", "--dry-run", "--", "--config.seed=3",
                        path_prefix=no_gcloud)
    assert result.returncode == 0, result.stderr
    cmds = commands(result.stdout)
    loc = "--zone=us-west4-a --project=proj"
    assert f"gcloud compute tpus tpu-vm describe my-tpu {loc} '--format=value(state)'" in cmds
    assert (f"gcloud compute tpus tpu-vm create my-tpu --version=v2-alpha-tpuv5-lite "
            f"--accelerator-type=v5litepod-16 {loc} --spot "
            "--scopes=https://www.googleapis.com/auth/cloud-platform") in cmds
    scp = [c for c in cmds if " tpu-vm scp " in c]
    assert len(scp) == 1 and scp[0].endswith(f"my-tpu: {loc} --worker=all")
    ssh = [c for c in cmds if " tpu-vm ssh " in c]
    assert [c.rsplit("--command=", 1)[1] for c in ssh] == ["bash ~/rmsweb_launch/setup.sh'", "bash ~/rmsweb_launch/run.sh'"]
    assert all("--worker=all" in c for c in ssh)
    assert ("#   RMSWEB_ARGS=( --config=configs/qwen3_vl_8b.py --workdir=/mnt/my-bucket/runs/8b --config.seed=3 )"
            in result.stdout)
    assert "warning" not in result.stderr, result.stderr
    assert any(c.startswith("tar -czf ") for c in cmds)


def test_dry_run_queued_resource_and_runtime_defaults(no_gcloud):
    result = gcloud_tpu(*[a.replace("v5litepod-16", "v5p-32") for a in RUN], "--queued", "--dry-run",
                        path_prefix=no_gcloud)
    assert result.returncode == 0, result.stderr
    assert ("gcloud compute tpus queued-resources create my-tpu --node-id=my-tpu --runtime-version=v2-alpha-tpuv5 "
            "--accelerator-type=v5p-32 --zone=us-west4-a") in result.stdout
    assert "tpu-vm create" not in result.stdout


def test_dry_run_git_source_detach_and_checkpoint(no_gcloud):
    result = gcloud_tpu(*RUN, "--repo-url=https://example.com/r.git", "--ref=v1", "--detach",
                        "--checkpoint=gs://b/ckpt/Qwen3-VL-8B-Instruct/", "--dry-run", path_prefix=no_gcloud)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "RMSWEB_SOURCE=git" in out and "RMSWEB_REF=v1" in out and "tar -czf" not in out
    assert "RMSWEB_CHECKPOINT_DIR=/tmp/rmsweb_checkpoints/Qwen3-VL-8B-Instruct" in out
    assert "--config.model.init=hf:/tmp/rmsweb_checkpoints/Qwen3-VL-8B-Instruct" in out
    assert "run.sh --detached" in commands(out)[-1]


@pytest.mark.parametrize("action, expected", [
    (["--delete"], "gcloud compute tpus tpu-vm delete my-tpu --zone=us-west4-a"),
    (["--delete", "--queued", "--yes"], "gcloud compute tpus queued-resources delete my-tpu --zone=us-west4-a --force --quiet"),
    (["--stop"], "--worker=all --ssh-flag=-oServerAliveInterval=60 '--command=bash ~/rmsweb_launch/stop.sh'"),
    (["--logs", "--log-worker=2"], "--worker=2 --ssh-flag=-oServerAliveInterval=60 '--command=tail -n 200 -F ~/rmsweb_logs/latest.log'"),
])
def test_dry_run_small_actions(no_gcloud, action, expected):
    result = gcloud_tpu("--name=my-tpu", "--zone=us-west4-a", *action, "--dry-run", path_prefix=no_gcloud)
    assert result.returncode == 0, result.stderr
    assert len(commands(result.stdout)) == 1 and expected in commands(result.stdout)[0]


def without(*keys):
    """Returns RUN less the options named."""
    return [a for a in RUN if a.split("=")[0] not in keys]


@pytest.mark.parametrize("accelerator, extra", [
    ("v5litepod-8", []), ("v5p-8", []), ("v6e-8", []), ("v4-8", []),  # one host: its own disk is the workdir
    ("v5litepod-16", ["--shared-workdir"]),                          # several hosts, one mounted folder
])
def test_dry_run_local_workdir_on_one_host_or_when_shared(no_gcloud, accelerator, extra):
    args = [a.replace("v5litepod-16", accelerator) for a in without("--workdir", "--shared-workdir")] + [
        "--workdir=/mnt/runs/8b"]
    result = gcloud_tpu(*args, *extra, "--dry-run", path_prefix=no_gcloud)
    assert result.returncode == 0, result.stderr
    assert "--workdir=/mnt/runs/8b" in result.stdout


def test_dry_run_gs_workdir_on_several_hosts_needs_no_mount(no_gcloud):
    args = without("--workdir", "--shared-workdir") + ["--workdir=gs://my-bucket/runs/8b"]
    result = gcloud_tpu(*args, "--dry-run", path_prefix=no_gcloud)
    assert result.returncode == 0, result.stderr
    assert "--workdir=gs://my-bucket/runs/8b" in result.stdout


def test_every_multi_host_example_in_the_docs_uses_a_shared_workdir():
    help_text = gcloud_tpu("--help").stdout
    docs = {"--help": help_text, "launch/README.md": (LAUNCH / "README.md").read_text()}
    for name, text in docs.items():
        runs = [cmd for cmd in _example_commands(text) if "gcloud_tpu.sh" in cmd and "--workdir=" in cmd]
        multi_host = [cmd for cmd in runs if _chips(cmd) > 8]
        assert multi_host or name == "--help", f"{name}: no multi-host example"
        for cmd in multi_host:  # a bucket (gs://), or a path every worker mounts
            assert "--shared-workdir" in cmd or "--workdir=gs://" in cmd, \
                f"{name}: multi-host example without a shared workdir: {cmd}"
    flat = {name: " ".join(text.split()) for name, text in docs.items()}  # the prose wraps anywhere
    assert "Orbax needs one directory that all hosts see" in flat["launch/README.md"]
    assert "workdir that every worker sees, in practice a bucket" in flat["--help"]
    assert "gcsfuse --implicit-dirs BUCKET /mnt/BUCKET" in flat["--help"]


def _example_commands(text: str) -> list[str]:
    """Returns the shell commands in `text`, backslash-continued lines joined."""
    return [cmd for cmd in text.replace("\\\n", " ").splitlines() if "--" in cmd]


def _chips(cmd: str) -> int:
    accelerator = next((w for w in cmd.split() if w.startswith("--accelerator=")), "--accelerator=x-0")
    suffix = accelerator.rsplit("-", 1)[-1]
    return int(suffix) if suffix.isdigit() else 0


@pytest.mark.parametrize("args, message", [
    (without("--name"), "--name is required"),
    (without("--zone"), "--zone is required"),
    (without("--accelerator"), "--accelerator is required"),
    (without("--config"), "--config is required"),
    (without("--workdir"), "--workdir is required"),
    (without("--workdir") + ["--workdir=runs/8b"], "expected an absolute path"),
    (without("--workdir") + ["--workdir=gs://b"], "--workdir=gs://b: expected gs://BUCKET/FOLDER"),
    (without("--workdir", "--shared-workdir") + ["--workdir=/tmp/runs/8b"], "Orbax needs one directory every host sees"),
    ([a.replace("v5litepod-16", "v6e-32") for a in without("--workdir", "--shared-workdir")] + ["--workdir=/tmp/r"],
     "(multi-host)"),
    (without("--config") + ["--config=configs/nope.py"], "no file configs/nope.py"),
    (without("--accelerator") + ["--accelerator=tpu9-8"], "no default runtime version"),
    (RUN + ["--colour=blue"], "unknown option '--colour'"),
    (RUN + ["--env=1BAD=x"], "--env=1BAD=x: expected KEY=VALUE"),
    (RUN + ["stray"], "unexpected argument 'stray'"),
    (RUN + ["--delete", "--logs"], "--delete and --logs cannot be combined"),
    (RUN + ["--zone"], "--zone needs a value"),
])
def test_missing_or_bad_args_fail_clearly(no_gcloud, args, message):
    result = gcloud_tpu(*args, "--dry-run", path_prefix=no_gcloud)
    assert result.returncode == 2, result.stdout
    assert "error:" in result.stderr and message in result.stderr, result.stderr
    assert not commands(result.stdout), "nothing may run before the arguments are checked"


def test_env_sh_round_trips_awkward_arguments(no_gcloud, tmp_path):
    awkward = ["--config.smoke.instruction=Click 'OK' \"now\"", "--config.x=$HOME `id` ; rm -rf /", "--config.y="]
    result = gcloud_tpu(*RUN, "--env=XLA_FLAGS=--a=1 --b", "--dry-run", "--", *awkward, path_prefix=no_gcloud)
    assert result.returncode == 0, result.stderr
    env_sh = "\n".join(line[4:] for line in result.stdout.splitlines() if line.startswith("#   "))
    (tmp_path / "env.sh").write_text(env_sh)
    shown = subprocess.run(["bash", "-c", f"source {tmp_path}/env.sh && printf '%s\\0' \"${{RMSWEB_ARGS[@]}}\" "
                            "\"${RMSWEB_EXPORTS[@]}\""], capture_output=True, text=True, check=True, timeout=30)
    assert shown.stdout.split("\0")[:-1] == [
        "--config=configs/qwen3_vl_8b.py", "--workdir=/mnt/my-bucket/runs/8b", *awkward, "XLA_FLAGS=--a=1 --b"]


def fake_worker(tmp_path):
    """Returns (PATH prefix, env) for a run against tests/launch/fake_gcloud.sh and a fake venv."""
    bin_dir, home = tmp_path / "bin", tmp_path / "worker_home"
    (home / "rmsweb_venv" / "bin").mkdir(parents=True)
    bin_dir.mkdir()
    (bin_dir / "gcloud").write_text(f'#!/bin/sh\nexec bash {pathlib.Path(__file__).with_name("fake_gcloud.sh")} "$@"\n')
    (bin_dir / "curl").write_text("#!/bin/sh\necho 0\n")  # the metadata server's worker number
    venv_bin = home / "rmsweb_venv" / "bin"
    (venv_bin / "activate").write_text(f'export PATH="{venv_bin}:$PATH"\n')
    # FAKE_PREEMPTIONS=N: the first N runs are preempted (the VM goes PREEMPTED, the run exits 143 after SIGTERM).
    (venv_bin / "python").write_text('#!/bin/bash\necho "cwd=$PWD dist=$RMSWEB_DISTRIBUTED"\n'
                                     'for a in "$@"; do echo "arg<$a>"; done\n'
                                     'runs=$(( $(cat "$FAKE_WORKER_HOME/.runs" 2>/dev/null || echo 0) + 1 ))\n'
                                     'echo "$runs" > "$FAKE_WORKER_HOME/.runs"\n'
                                     'if (( runs <= ${FAKE_PREEMPTIONS:-0} )); then\n'
                                     '  echo PREEMPTED > "$FAKE_WORKER_HOME/.fake_tpu_state"; exit 143; fi\n'
                                     'exit "${FAKE_EXIT:-0}"\n')
    for path in (bin_dir / "gcloud", bin_dir / "curl", venv_bin / "python"):
        path.chmod(0o755)
    env = {"FAKE_GCLOUD_LOG": str(tmp_path / "gcloud.log"), "FAKE_WORKER_HOME": str(home)}
    return str(bin_dir), env, home


def test_launch_runs_for_real_against_a_fake_gcloud(tmp_path):
    path_prefix, env, home = fake_worker(tmp_path)
    result = gcloud_tpu(*RUN, "--skip-setup", "--", "--config.smoke.instruction=a b", env=env, path_prefix=path_prefix)
    assert result.returncode == 0, result.stdout + result.stderr
    verbs = [line.split()[3] for line in (tmp_path / "gcloud.log").read_text().splitlines()]
    assert verbs == ["describe", "create", "scp", "ssh", "ssh"]
    assert f"[w0] cwd={home}/rmsweb_jax dist=1" in result.stdout
    assert "[w0] arg<--config.smoke.instruction=a b>" in result.stdout
    assert "[w0] rmsweb_jax.main exited with status 0" in result.stdout
    with tarfile.open(home / "rmsweb_launch" / "src.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"setup.py", "configs/qwen3_vl_8b.py", "launch/gcloud_tpu.sh"} <= names
    assert not any(n.startswith((".venv", ".git/")) for n in names)
    assert (home / "rmsweb_jax" / "setup.py").is_file() and (home / "rmsweb_logs" / "latest.log").is_file()

    # Second launch: the TPU is READY now, so it is reused; the run's exit status comes back.
    again = gcloud_tpu(*RUN, "--skip-setup", "--env=FAKE_EXIT=3", env=env, path_prefix=path_prefix)
    assert again.returncode == 3 and "reusing TPU VM my-tpu (READY)" in again.stdout
    assert (tmp_path / "gcloud.log").read_text().count("tpu-vm create") == 1


def test_a_preempted_spot_slice_is_created_again_and_the_run_rerun_up_to_retries(tmp_path):
    path_prefix, env, home = fake_worker(tmp_path)
    result = gcloud_tpu(*RUN, "--spot", "--skip-setup", "--retries=2", "--env=FAKE_PREEMPTIONS=2", env=env,
                        path_prefix=path_prefix)
    assert result.returncode == 0, result.stdout + result.stderr
    verbs = [line.split()[3] for line in (tmp_path / "gcloud.log").read_text().splitlines()]
    run = ["scp", "ssh", "ssh", "describe"]
    assert verbs == ["describe", "create", *run, "describe", "delete", "create", *run, "describe", "delete",
                     "create", "scp", "ssh", "ssh"], verbs
    assert result.stdout.count("[w0] rmsweb_jax.main exited with status 143") == 2
    assert "retry 2 of 2 (the run resumes from /mnt/my-bucket/runs/8b)" in result.stdout
    assert all("--spot" in line for line in (tmp_path / "gcloud.log").read_text().splitlines() if " create " in line)

    # Out of retries: the preempted run's status comes back; without --retries a PREEMPTED VM is named.
    (home / ".runs").unlink()
    again = gcloud_tpu(*RUN, "--skip-setup", "--retries=1", "--env=FAKE_PREEMPTIONS=5", env=env,
                       path_prefix=path_prefix)
    assert again.returncode == 143, again.stdout + again.stderr
    stuck = gcloud_tpu(*RUN, "--skip-setup", env=env, path_prefix=path_prefix)
    assert stuck.returncode == 2 and "is PREEMPTED (expected READY); --delete it and rerun, or pass --retries=N" in \
        stuck.stderr


def test_retries_need_a_foreground_run(no_gcloud):
    result = gcloud_tpu(*RUN, "--retries=2", "--detach", "--dry-run", path_prefix=no_gcloud)
    assert result.returncode == 2 and "--retries watches the run to its end" in result.stderr


# ---- Colab notebook -----------------------------------------------------------------------------
def test_notebook_is_valid_nbformat4_with_compiling_cells():
    nb = json.loads((LAUNCH / "colab_tpu.ipynb").read_text())
    assert nb["nbformat"] == 4 and nb["nbformat_minor"] >= 4 and isinstance(nb["metadata"], dict)
    code = []
    for i, cell in enumerate(nb["cells"]):
        assert cell["cell_type"] in ("markdown", "code") and isinstance(cell["source"], list), i
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, i
            # IPython-only lines (!shell, %magic) are not Python; compile the rest.
            source = "".join(line for line in cell["source"] if not line.lstrip().startswith(("!", "%")))
            compile(source, f"colab_tpu.ipynb cell {i}", "exec")
            code.append(source)
    text = "\n".join(code)
    for needle in ("jax.devices()", "configs/demo.py", "qwen3_vl.from_hf(CKPT_DIR, mesh=mesh", "run_stages(",
                   'run_stage(config, "collect"', 'run_stage(config, "salvage"', "write_viewer("):
        assert needle in text
    # test_colab_notebook.py injects its settings after the one cell tagged "parameters"
    assert sum("parameters" in c["metadata"].get("tags", []) for c in nb["cells"]) == 1
    import nbformat  # pinned in the test extras: a missing one is an install error, not a skip
    nbformat.validate(nbformat.reads(json.dumps(nb), as_version=4))


def test_notebook_uses_existing_apis():
    from rmsweb_jax import main
    from rmsweb_jax.models import qwen3_vl, sharding
    assert callable(main.run_stages) and callable(qwen3_vl.from_hf) and callable(sharding.make_mesh)
    qwen3_vl.RuntimeOptions(param_dtype="bfloat16", compute_dtype="bfloat16")


# ---- xmanager launcher --------------------------------------------------------------------------
def test_xm_launcher_compiles_and_imports_without_xmanager():
    py_compile.compile(str(LAUNCH / "xm_launch.py"), doraise=True)
    # A fresh interpreter: the launcher defines absl flags (--config, --workdir) like rmsweb_jax.main.
    subprocess.run([sys.executable, "-c", "import launch.xm_launch"], cwd=REPO, check=True, timeout=60)


def test_xm_job_helpers():
    assert xm_job.requirements_kwargs("tpu_v5e", "4x4") == {"tpu_v5e": "4x4"}
    assert xm_job.requirements_kwargs("tpu_v5p", "2x2x2") == {"tpu_v5p": "2x2x2"}
    assert xm_job.requirements_kwargs("h100", "8") == {"h100": "8"}
    assert xm_job.requirements_kwargs("a100_80gb", "4") == {"a100_80gib": "4"}  # xm.ResourceType.A100_80GIB
    assert xm_job.requirements_kwargs("cpu", "") == {}
    for name, topology in [("tpu_v5e", "2x2x2"), ("tpu_v5p", "4x4"), ("h100", "2x4"), ("tpu_v5e", ""), ("tpu_v7", "1")]:
        with pytest.raises(ValueError, match="topology|accelerator"):
            xm_job.requirements_kwargs(name, topology)
    assert xm_job.chip_count("2x2x4") == 16
    assert xm_job.job_args("configs/demo.py", "/gcs/b/r", ["model.init=hf:/x=y", "--config.seed=1"]) == [
        "--config=configs/demo.py", "--workdir=/gcs/b/r", "--config.model.init=hf:/x=y", "--config.seed=1"]
    with pytest.raises(ValueError, match="KEY=VALUE"):
        xm_job.job_args("c.py", "/w", ["model init"])
    assert xm_job.job_env("tpu_v5e", 1, ["A=b=c"]) == {"RMSWEB_DISTRIBUTED": "1", "A": "b=c"}
    assert xm_job.job_env("h100", 1, []) == {} and xm_job.job_env("h100", 2, []) == {"RMSWEB_DISTRIBUTED": "1"}
    assert xm_job.parse_mounts(["/data:/data"]) == {"/data": "/data"}
    with pytest.raises(ValueError, match="--mount"):
        xm_job.parse_mounts(["data:/data"])
    steps = xm_job.docker_instructions("tpu", with_constraints=True, with_chromium=True)
    assert any("apt-get install" in s and "chromium" in s for s in steps)
    assert steps[-1].endswith("-c constraints.txt -e '.[tpu]'")
    assert "playwright " + "install" not in " ".join(steps)  # split so repo greps for the command stay clean


@pytest.mark.parametrize("name, topology, machine", [
    ("h100", "8", "a3-highgpu-8g"), ("h100", "1", "a3-highgpu-1g"), ("h100", "4", "a3-highgpu-4g"),
    ("h200", "8", "a3-ultragpu-8g"),
    ("a100", "2", "a2-highgpu-2g"), ("a100", "16", "a2-megagpu-16g"),
    ("a100_80gb", "8", "a2-ultragpu-8g"), ("a100_80gb", "1", "a2-ultragpu-1g"),
    ("cpu", "", None), ("tpu_v5e", "4x4", None),  # xmanager sizes CPU machines; TPUs are checked apart
])
def test_vertex_machine_type_for_each_gpu_count_vertex_offers(name, topology, machine):
    assert xm_job.vertex_machine_type(name, topology) == machine


@pytest.mark.parametrize("name, topology, message", [
    ("h100", "16", "offers h100 only in machines of 1 (a3-highgpu-1g), 2 (a3-highgpu-2g), 4 (a3-highgpu-4g), 8 "),
    ("h100", "3", "--topology=3"),
    ("h200", "4", "offers h200 only in machines of 8 (a3-ultragpu-8g) GPUs"),
    ("a100_80gb", "16", "8 (a2-ultragpu-8g) GPUs"),
    ("local_gpu", "1", "local_gpu is for --backend=local"),
])
def test_vertex_machine_type_refuses_counts_vertex_does_not_offer(name, topology, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        xm_job.vertex_machine_type(name, topology)


def test_check_overrides_parses_values_as_rmsweb_jax_main_does():
    overrides = ["seed=3", "--config.model.init=hf:/gcs/b/ckpt", "config.mesh.shape=(1,2,4)", "model.scan_layers=false"]
    parsed = xm_job.check_overrides(REPO, "configs/qwen3_vl_8b.py", overrides)
    assert parsed == {"seed": 3, "model.init": "hf:/gcs/b/ckpt", "mesh.shape": (1, 2, 4), "model.scan_layers": False}
    # The oracle: main's own flag parsing of the argv the job gets.
    argv = xm_job.job_args("configs/qwen3_vl_8b.py", "/w", overrides)
    script = ("import json, sys; from rmsweb_jax import main; main.parse_flags(['main', *sys.argv[1:]]); "
              "c = main._CONFIG.value; "
              "print(json.dumps([c.seed, c.model.init, list(c.mesh.shape), c.model.scan_layers]))")
    shown = subprocess.run([sys.executable, "-c", script, *argv], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout.splitlines()[-1]) == [3, "hf:/gcs/b/ckpt", [1, 2, 4], False]


@pytest.mark.parametrize("override, message", [
    ("model.int=hf:/x", "configs/demo.py has no key 'model.int'; nearest known keys: model.init"),
    ("sed=1", "has no key 'sed'; nearest known keys: seed"),
    ("model.zzzzzz=1", "nearest known keys: model.attention_impl"),  # nothing close: its parent's keys
    ("seed=abc", "seed is int (0 in configs/demo.py) and 'abc' does not parse as one"),
    ("model.scan_layers=maybe", "model.scan_layers is bool"),
    ("smoke.max_new_tokens=1.5", "smoke.max_new_tokens is int"),
    ("model=3", "model is a group of keys"),
    ("model init", "expected KEY=VALUE"),
])
def test_check_overrides_refuses_unknown_keys_and_wrong_types(override, message):
    with pytest.raises(ValueError, match=re.escape(f"--override={override!r}: ") + ".*" + re.escape(message)):
        xm_job.check_overrides(REPO, "configs/demo.py", ["seed=1", override])


def test_check_overrides_refuses_what_main_refuses():
    for override in ["--config.sed=1", "--config.seed=abc"]:
        result = subprocess.run([sys.executable, "-m", "rmsweb_jax.main", "--config=configs/demo.py", "--workdir=/w",
                                 override], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert result.returncode == 2 and "rmsweb: error:" in result.stderr, result.stderr
        with pytest.raises(ValueError, match="--override="):
            xm_job.check_overrides(REPO, "configs/demo.py", [override])


def test_check_overrides_names_a_missing_config_file():
    with pytest.raises(ValueError, match=r"--config=configs/nope.py: no file .*configs/nope.py"):
        xm_job.check_overrides(REPO, "configs/nope.py", [])


def test_xm_stage_source_ships_the_tree_without_venv(tmp_path):
    staged = xm_job.stage_source(REPO, tmp_path)
    assert (staged / "setup.py").is_file() and (staged / "launch" / "xm_launch.py").is_file()
    assert not (staged / ".venv").exists() and not (staged / ".git").exists()


# ---- rmsweb_jax/distributed.py ----------------------------------------------------------------------
@pytest.mark.parametrize("value", [None, "", "0", "false", "No", "off"])
def test_distributed_off(value):
    env = {} if value is None else {"RMSWEB_DISTRIBUTED": value}
    assert distributed.distributed_kwargs({**env, "JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"}) is None


def test_distributed_auto_detect_when_nothing_else_is_set():
    assert distributed.distributed_kwargs({"RMSWEB_DISTRIBUTED": "1"}) == {}
    assert distributed.distributed_kwargs({"RMSWEB_DISTRIBUTED": "TRUE"}) == {}


def test_distributed_explicit_jax_variables():
    env = {"RMSWEB_DISTRIBUTED": "yes", "JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4",
           "JAX_PROCESS_ID": "3", "JAX_LOCAL_DEVICE_IDS": "0, 1", "MASTER_ADDR": "ignored"}
    assert distributed.distributed_kwargs(env) == {"coordinator_address": "10.0.0.1:1234", "num_processes": 4,
                                                   "process_id": 3, "local_device_ids": [0, 1]}
    only_address = {"RMSWEB_DISTRIBUTED": "1", "JAX_COORDINATOR_ADDRESS": "head:99"}
    assert distributed.distributed_kwargs(only_address) == {"coordinator_address": "head:99"}


def test_distributed_master_addr_variables():
    env = {"RMSWEB_DISTRIBUTED": "1", "MASTER_ADDR": "node0", "MASTER_PORT": "29500", "WORLD_SIZE": "16",
           "RANK": "5", "LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "8"}
    assert distributed.distributed_kwargs(env) == {"coordinator_address": "node0:29500", "num_processes": 16,
                                                   "process_id": 5, "local_device_ids": [5]}
    one_per_host = {**env, "LOCAL_WORLD_SIZE": "1", "JAX_COORDINATOR_PORT": "1235"}
    assert distributed.distributed_kwargs(one_per_host) == {"coordinator_address": "node0:1235",
                                                            "num_processes": 16, "process_id": 5}


@pytest.mark.parametrize("env, message", [
    ({"RMSWEB_DISTRIBUTED": "maybe"}, "RMSWEB_DISTRIBUTED='maybe'"),
    ({"JAX_COORDINATOR_ADDRESS": "10.0.0.1"}, "expected host:port"),
    ({"JAX_COORDINATOR_ADDRESS": "h:port"}, "expected an integer"),
    ({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2"}, "must be set together"),
    ({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "2"}, "JAX_PROCESS_ID=2"),
    ({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "two", "JAX_PROCESS_ID": "0"}, "JAX_NUM_PROCESSES='two'"),
    ({"MASTER_ADDR": "n0", "WORLD_SIZE": "2", "RANK": "0"}, "needs a port"),
    ({"MASTER_ADDR": "n0", "MASTER_PORT": "1", "RANK": "0"}, "WORLD_SIZE"),
])
def test_distributed_errors_name_the_variable(env, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        distributed.distributed_kwargs({"RMSWEB_DISTRIBUTED": env.pop("RMSWEB_DISTRIBUTED", "1"), **env})


def test_a_gpu_client_takes_the_plans_share_of_memory_unless_the_user_set_one():
    env = {}
    line = distributed.gpu_memory_fraction(env)
    assert env == {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"} and distributed.USABLE_HBM == 0.9
    assert line == ("GPU memory: JAX takes 90% of each GPU (XLA_PYTHON_CLIENT_MEM_FRACTION=0.9; "
                    "set it for another share)")
    env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": ".75"}
    assert distributed.gpu_memory_fraction(env, 0.95) == \
        "GPU memory: JAX takes 75% of each GPU (XLA_PYTHON_CLIENT_MEM_FRACTION=.75, as set; 95% unset)"
    assert env == {"XLA_PYTHON_CLIENT_MEM_FRACTION": ".75"}
    for bad in ("0", "1.5", "most", ""):
        with pytest.raises(ValueError, match=f"XLA_PYTHON_CLIENT_MEM_FRACTION={bad!r}: expected a fraction in"):
            distributed.gpu_memory_fraction({"XLA_PYTHON_CLIENT_MEM_FRACTION": bad})


def test_maybe_initialize_passes_kwargs_and_skips_when_off(monkeypatch):
    import jax
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
    assert distributed.maybe_initialize_distributed({}) is False
    env = {"RMSWEB_DISTRIBUTED": "1", "JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "1", "JAX_PROCESS_ID": "0"}
    assert distributed.maybe_initialize_distributed(env) is True
    assert calls == [{"coordinator_address": "h:1", "num_processes": 1, "process_id": 0}]
