"""xmanager launcher: builds an image of this repo and runs `python -m rmsweb_jax.main` as one xm job.

xmanager pins protobuf < 7 and the project needs protobuf 7, so it lives in its own venv:

    python3.11 -m venv ~/.venvs/xm && ~/.venvs/xm/bin/pip install -U pip
    ~/.venvs/xm/bin/pip install -r launch/requirements-xm.txt
    ~/.venvs/xm/bin/xmanager launch launch/xm_launch.py -- \
        --backend=vertex --accelerator=h100 --topology=8 \
        --config=configs/qwen3_vl_8b.py --workdir=/gcs/BUCKET/runs/8b \
        --override=model.init=hf:/gcs/BUCKET/Qwen3-VL-8B-Instruct

Backends (xm_local, the open-source scheduler):
  local   docker on this machine (CPU, or --accelerator=local_gpu): checks the image and the arguments.
  vertex  a Vertex AI custom job (needs GOOGLE_CLOUD_BUCKET_NAME for staging). Vertex mounts buckets
          at /gcs/BUCKET, which rmsweb_jax.main can use as a plain path for the workdir and checkpoints.

GPU requests on Vertex get the machine type Vertex attaches those GPUs to (--accelerator=h100
--topology=8: a3-highgpu-8g; h200: a3-ultragpu-8g; a100: a2-highgpu-*; a100_80gb: a2-ultragpu-*), set by
the launcher because xmanager 0.8.5 maps only A100 40GB itself; a GPU count no such machine has is refused
with the counts that exist. TPU requests (--accelerator=tpu_v5e --topology=4x4, tpu_v5p 2x2x2, ...)
become xm.JobRequirements that any xm scheduler understands; xm_local's Vertex backend, though, only
knows TPU v2/v3, so this launcher stops with an error for newer TPUs there: use launch/gcloud_tpu.sh.

Preemption (--backend=vertex): --spot asks for spot VMs; by default (--restart_on_preemption) Vertex restarts the
job when it restarts a worker, and the same command resumes from the workdir's last checkpoint (a SIGTERM saves
the step it reached). Vertex decides how often it restarts; launch/gcloud_tpu.sh --retries=N counts its own.

Before anything is built, the config file is loaded as rmsweb_jax.main loads it and every --override is
parsed against it (ml_collections config_flags): an unknown key is refused with the nearest known keys,
a value of the wrong type with the type the key holds. `--dry_run` prints the job (and on Vertex the
machine spec xmanager will submit) without building or launching anything.
"""
from __future__ import annotations

import pathlib
import sys
import tempfile

# `xmanager launch` imports this file from its folder, not as launch.xm_launch: put the repo root first.
REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from absl import app, flags  # noqa: E402

from launch import xm_job  # noqa: E402

try:
    # At import time, not in main(): these define flags that must exist before argv is parsed
    # (--xm_launch_script, which `xmanager launch` passes, and the --xm_* image-building flags).
    from xmanager import xm, xm_flags, xm_local  # noqa: F401
except ImportError:  # the project's own venv: importable for tests, main() says what to install
    xm = xm_local = None

_BACKEND = flags.DEFINE_enum("backend", "local", ["local", "vertex"], "Where the job runs (xm_local executors).")
_CONFIG = flags.DEFINE_string("config", None, "Config file relative to the repo root, e.g. configs/qwen3_vl_8b.py.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory as the job sees it (Vertex: /gcs/BUCKET/...).")
_OVERRIDE = flags.DEFINE_multi_string("override", [], "Config override KEY=VALUE, passed as --config.KEY=VALUE.")
_ACCELERATOR = flags.DEFINE_enum("accelerator", "cpu", sorted(xm_job.ACCELERATORS), "Accelerator to request.")
_TOPOLOGY = flags.DEFINE_string("topology", "", "TPU chip grid (tpu_v5e: 2x4, 4x4; tpu_v5p: 2x2x2) or GPU count.")
_REPLICAS = flags.DEFINE_integer("replicas", 1, "Identical hosts (multi-host GPU); TPU slices size by --topology.")
_ENV = flags.DEFINE_multi_string("env", [], "Extra environment variable KEY=VALUE for the job.")
_MOUNT = flags.DEFINE_multi_string("mount", [], "local backend: HOST_PATH:CONTAINER_PATH (e.g. a checkpoint dir).")
_BASE_IMAGE = flags.DEFINE_string("base_image", xm_job.BASE_IMAGE, "Docker base image (needs Python >= 3.11).")
_CONSTRAINTS = flags.DEFINE_bool("constraints", True, "Install with -c constraints.txt (the versions CI passed with).")
_CHROMIUM = flags.DEFINE_bool("with_chromium", True, "Install Debian's chromium (the web stages need it).")
_TITLE = flags.DEFINE_string("experiment_title", None, "Experiment title (default: config and workdir).")
_SPOT = flags.DEFINE_bool("spot", False, "vertex: run on spot VMs (Vertex's SPOT scheduling strategy).")
_RESTART = flags.DEFINE_bool("restart_on_preemption", True, "vertex: restart the job when Vertex restarts a worker "
                             "(a preempted VM); the same command resumes from the workdir.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the job and the Dockerfile steps; build and launch nothing.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; config overrides go in --override=KEY=VALUE")
    if xm is None:
        raise app.UsageError("xmanager is not installed here. It needs its own venv (protobuf < 7): "
                             "pip install -r launch/requirements-xm.txt")

    config_file = REPO_ROOT / _CONFIG.value.split(":", 1)[0]
    acc = xm_job.accelerator(_ACCELERATOR.value)
    try:
        requirements = xm.JobRequirements(**xm_job.requirements_kwargs(_ACCELERATOR.value, _TOPOLOGY.value),
                                          replicas=_REPLICAS.value)
        args = xm_job.job_args(_CONFIG.value, _WORKDIR.value, _OVERRIDE.value)
        # Loads the config as rmsweb_jax.main will: a misspelt key or a bad value stops here, not in the job.
        overrides = xm_job.check_overrides(REPO_ROOT, _CONFIG.value, _OVERRIDE.value)
        env = xm_job.job_env(_ACCELERATOR.value, _REPLICAS.value, _ENV.value)
        volumes = xm_job.parse_mounts(_MOUNT.value)
        vertex = _BACKEND.value == "vertex"
        machine_type = xm_job.vertex_machine_type(_ACCELERATOR.value, _TOPOLOGY.value) if vertex else None
    except ValueError as e:
        raise app.UsageError(str(e)) from e
    if vertex:
        if volumes:
            raise app.UsageError("--mount is for --backend=local; on Vertex read /gcs/BUCKET/... paths")
        if _REPLICAS.value > 1:
            # xm_local puts a job's replicas in one Vertex worker pool, and Vertex needs the first pool to hold one.
            raise app.UsageError(f"--replicas={_REPLICAS.value}: xm_local's Vertex backend runs one machine per "
                                 "job (its first worker pool must have one replica); use one machine of up to 8 "
                                 "GPUs (16 for a100), or an xm scheduler that places several")
        _check_vertex_supports(requirements)
        if machine_type:
            _pin_vertex_machine_type(machine_type)
        _pin_vertex_scheduling(xm_job.vertex_scheduling(_SPOT.value, _RESTART.value))
    elif _SPOT.value:
        raise app.UsageError("--spot is for --backend=vertex (the local backend runs on this machine)")

    with tempfile.TemporaryDirectory(prefix="rmsweb_xm_") as staging:
        source = xm_job.stage_source(REPO_ROOT, pathlib.Path(staging))
        use_constraints = _CONSTRAINTS.value and (source / "constraints.txt").is_file()
        steps = xm_job.docker_instructions(acc.extra, with_constraints=use_constraints, with_chromium=_CHROMIUM.value)
        if _DRY_RUN.value:
            _print_plan(source, steps, requirements, args, env, overrides)
            return
        executor = _executor(requirements, volumes)
        title = _TITLE.value or f"rmsweb {pathlib.Path(config_file).stem} -> {_WORKDIR.value}"
        with xm_local.create_experiment(experiment_title=title) as experiment:
            [executable] = experiment.package([xm.python_container(
                executor_spec=executor.Spec(), path=str(source), base_image=_BASE_IMAGE.value,
                docker_instructions=steps, entrypoint=xm.ModuleName("rmsweb_jax.main"))])
            experiment.add(xm.Job(executable=executable, executor=executor, args=args, env_vars=env))
        print(f"launched experiment {experiment.experiment_id}: {title}")


def _executor(requirements, volumes):
    if _BACKEND.value == "vertex":
        return xm_local.Vertex(requirements=requirements)
    return xm_local.Local(requirements=requirements, docker_options=xm_local.DockerOptions(volumes=volumes or None))


def _pin_vertex_machine_type(machine_type: str) -> None:
    """Makes xm_local's Vertex backend ask for `machine_type` (xm_job.ACCELERATORS says why it must)."""
    from xmanager.cloud import vertex
    # xmanager has no field for the machine type: its Vertex client asks this module-level function for
    # the whole machine spec at launch, so the launcher wraps it and keeps its accelerator type and count.
    xmanager_machine_spec = vertex.get_machine_spec

    def machine_spec(job):
        return {**xmanager_machine_spec(job), "machine_type": machine_type}

    vertex.get_machine_spec = machine_spec


def submit_arguments(scheduling: dict[str, object]) -> dict[str, object]:
    """Returns xm_job.vertex_scheduling's arguments as CustomJob.submit takes them (the strategy as its enum)."""
    from google.cloud.aiplatform.compat.types import custom_job
    strategy = scheduling["scheduling_strategy"]
    return {**scheduling, "scheduling_strategy": strategy and custom_job.Scheduling.Strategy[strategy]}


def _pin_vertex_scheduling(scheduling: dict[str, object]) -> None:
    """Makes xm_local's Vertex backend submit its job with these scheduling arguments."""
    import functools
    from google.cloud import aiplatform
    # xmanager submits the CustomJob itself with no scheduling arguments: the launcher adds them to its call.
    submit = aiplatform.CustomJob.submit
    extra = submit_arguments(scheduling)

    @functools.wraps(submit)
    def submit_scheduled(self, **kwargs):
        return submit(self, **{**extra, **kwargs})

    aiplatform.CustomJob.submit = submit_scheduled


def _vertex_machine_spec(requirements) -> str:
    """Returns the machine spec xm_local's Vertex backend will submit for these requirements, as text."""
    from xmanager.cloud import vertex
    # get_machine_spec reads only the job's executor; the image is not built in a dry run.
    spec = vertex.get_machine_spec(xm.Job(executable=None, executor=xm_local.Vertex(requirements=requirements)))
    accelerator = spec.get("accelerator_type")
    gpus = f" with {spec['accelerator_count']} x {accelerator.name}" if accelerator is not None else ""
    return f"{spec['machine_type']}{gpus}"


def _check_vertex_supports(requirements) -> None:
    """Fails before the image build when xm_local's Vertex backend cannot place the requested TPU."""
    if requirements.accelerator not in xm.TpuType:
        return
    from xmanager.cloud import vertex
    # Private table, read rather than copied so a newer xmanager that maps more TPUs just works.
    supported = getattr(vertex, "_CLOUD_TPU_ACCELERATOR_TYPES", None)
    if supported is not None and requirements.accelerator not in supported:
        raise app.UsageError(
            f"xm_local's Vertex backend maps only {sorted(str(t) for t in supported)}, not "
            f"{requirements.accelerator}: launch TPU v5e/v5p/v6e slices with launch/gcloud_tpu.sh, "
            "or use an xm scheduler that places them")


def _print_plan(source, steps, requirements, args, env, overrides) -> None:
    print(f"backend:      {_BACKEND.value}")
    print(f"mounts:       {_MOUNT.value or '(none)'}")
    print(f"requirements: {requirements!r}")
    if _BACKEND.value == "vertex":
        print(f"machine:      {_vertex_machine_spec(requirements)}")
        print(f"scheduling:   {xm_job.describe_scheduling(xm_job.vertex_scheduling(_SPOT.value, _RESTART.value))}")
    print("overrides:    " + (", ".join(f"{k}={v!r}" for k, v in overrides.items()) or "(none)"))
    print(f"source:       {sum(1 for p in source.rglob('*') if p.is_file())} files staged from {REPO_ROOT}")
    print(f"base image:   {_BASE_IMAGE.value}")
    print("docker steps:\n  " + "\n  ".join(steps))
    print("command:      python -m rmsweb_jax.main " + " ".join(args))
    print("environment:  " + (" ".join(f"{k}={v}" for k, v in env.items()) or "(none)"))


if __name__ == "__main__":
    app.run(main)
