"""Multi-host start-up: `jax.distributed.initialize()` when RMSWEB_DISTRIBUTED asks for it.

    RMSWEB_DISTRIBUTED=1 python -m rmsweb_jax.main --config=... --workdir=...

Which arguments reach `jax.distributed.initialize`, first match wins:
  1. JAX_COORDINATOR_ADDRESS=host:port [+ JAX_NUM_PROCESSES, JAX_PROCESS_ID, JAX_LOCAL_DEVICE_IDS=0,1]
     (any GPU cluster; the names follow JAX's own JAX_COORDINATOR_ADDRESS / JAX_LOCAL_DEVICE_IDS).
  2. MASTER_ADDR + MASTER_PORT (or JAX_COORDINATOR_PORT) + WORLD_SIZE + RANK, the variables that
     Kubeflow's PyTorchJob, torchrun-style launchers and many GPU schedulers set; LOCAL_RANK pins one GPU
     per process when LOCAL_WORLD_SIZE > 1.
  3. Nothing: JAX detects the cluster itself (Cloud TPU VMs and pod slices, SLURM, Open MPI, GKE).

It must run before anything touches a JAX device (jax.devices(), the first jit): JAX refuses to
initialize once a backend exists. Process 0 is the coordinator; every process calls this.

GPU memory: JAX's GPU client takes 75% of each GPU's memory at start-up (XLA_PYTHON_CLIENT_MEM_FRACTION), while
`python -m rmsweb_jax.plan` budgets USABLE_HBM (90%) of it: a run the plan passed between the two would run out
of memory (bench/gpu_train_step.py's 2B step did at 75% and ran at 95%). `gpu_memory_fraction` sets the variable to
the plan's share before the client exists, unless the user set it; TPU and CPU clients do not read it.

TPU compiler flags: libtpu reads LIBTPU_INIT_ARGS once, when it loads. `libtpu_init_args` puts the config's
(config.tpu.libtpu_init_args: the presets' collective/compute overlap flags) there first, before anything the user
set, so the user's own flags win (libtpu keeps a flag's last value); `compiler_options` gives the same flags as
`jax.jit(...).lower(...).compile(compiler_options=...)` takes them, for ahead-of-time compiles.
"""
from __future__ import annotations

import os
from typing import Any, Mapping, MutableMapping

from absl import logging

from rmsweb_jax.errors import UserError

ENV_VAR = "RMSWEB_DISTRIBUTED"
GPU_MEMORY_VAR = "XLA_PYTHON_CLIENT_MEM_FRACTION"
LIBTPU_VAR = "LIBTPU_INIT_ARGS"
USABLE_HBM = 0.9  # the share of each accelerator's memory a plan may use, and a GPU run's client takes
_ON = frozenset({"1", "true", "yes", "on"})
_OFF = frozenset({"", "0", "false", "no", "off"})


def distributed_requested(environ: Mapping[str, str]) -> bool:
    """Returns whether RMSWEB_DISTRIBUTED is set to a true value (1/true/yes/on)."""
    raw = environ.get(ENV_VAR, "").strip().lower()
    if raw in _ON:
        return True
    if raw in _OFF:
        return False
    raise ValueError(f"{ENV_VAR}={environ[ENV_VAR]!r}: expected one of 1/true/yes/on or 0/false/no/off")


def distributed_kwargs(environ: Mapping[str, str]) -> dict[str, Any] | None:
    """Returns the kwargs for `jax.distributed.initialize` from `environ`, or None when not requested.

    An empty dict means "let JAX auto-detect" (TPU VMs, SLURM, Open MPI, GKE).
    """
    if not distributed_requested(environ):
        return None
    if environ.get("JAX_COORDINATOR_ADDRESS"):
        return _explicit_kwargs(environ)
    if environ.get("MASTER_ADDR"):
        return _master_addr_kwargs(environ)
    return {}


def gpu_memory_fraction(environ: MutableMapping[str, str] | None = None, fraction: float = USABLE_HBM) -> str:
    """Sets XLA_PYTHON_CLIENT_MEM_FRACTION to `fraction` unless `environ` (os.environ) holds it; returns a line
    saying which share a GPU client will take and why. Call before any JAX backend exists."""
    environ = os.environ if environ is None else environ
    given = environ.get(GPU_MEMORY_VAR)
    if given is None:
        environ[GPU_MEMORY_VAR] = f"{fraction:g}"
        return (f"GPU memory: JAX takes {fraction:.0%} of each GPU ({GPU_MEMORY_VAR}={fraction:g}; "
                "set it for another share)")
    try:
        value = float(given)
    except ValueError:
        raise ValueError(f"{GPU_MEMORY_VAR}={given!r}: expected a fraction in (0, 1]") from None
    if not 0 < value <= 1:
        raise ValueError(f"{GPU_MEMORY_VAR}={given!r}: expected a fraction in (0, 1]")
    return f"GPU memory: JAX takes {value:.0%} of each GPU ({GPU_MEMORY_VAR}={given}, as set; {fraction:.0%} unset)"


def compiler_options(flags: str) -> dict[str, str]:
    """Returns {name: value} of a LIBTPU_INIT_ARGS-style string ('--xla_a=true --xla_b=8'); raises UserError
    naming a word that is not --name=value."""
    out = {}
    for word in flags.split():
        name, eq, value = word.partition("=")
        if not name.startswith("--") or not eq or len(name) < 3:
            raise UserError(f"config.tpu.libtpu_init_args: {word!r} is not --name=value (e.g. --xla_flag=true)")
        out[name[2:]] = value
    return out


def libtpu_init_args(flags: str, environ: MutableMapping[str, str] | None = None) -> str:
    """Sets LIBTPU_INIT_ARGS to `flags` followed by what `environ` (os.environ) already holds; returns the value.
    Call before any JAX backend exists."""
    environ = os.environ if environ is None else environ
    compiler_options(flags)  # a malformed word answers here, not as libtpu's abort
    value = " ".join(part for part in (flags.strip(), environ.get(LIBTPU_VAR, "").strip()) if part)
    if value:
        environ[LIBTPU_VAR] = value
    return value


def maybe_initialize_distributed(environ: Mapping[str, str] | None = None) -> bool:
    """Calls `jax.distributed.initialize` if RMSWEB_DISTRIBUTED is on; returns whether it did."""
    environ = os.environ if environ is None else environ
    kwargs = distributed_kwargs(environ)
    if kwargs is None:
        return False
    import jax  # deferred: reading the env above must not need jax (and must not create a backend)

    logging.info("jax.distributed.initialize(%s)", ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
                 or "auto-detect")
    jax.distributed.initialize(**kwargs)
    logging.info("process %d of %d: %d local / %d global devices", jax.process_index(), jax.process_count(),
                 jax.local_device_count(), jax.device_count())
    return True


def _explicit_kwargs(environ: Mapping[str, str]) -> dict[str, Any]:
    address = environ["JAX_COORDINATOR_ADDRESS"]
    _check_address("JAX_COORDINATOR_ADDRESS", address)
    kwargs: dict[str, Any] = {"coordinator_address": address}
    has_n, has_id = "JAX_NUM_PROCESSES" in environ, "JAX_PROCESS_ID" in environ
    if has_n != has_id:
        # One without the other would let JAX auto-detect half of the pair from a different source.
        raise ValueError("JAX_NUM_PROCESSES and JAX_PROCESS_ID must be set together "
                         f"(got only {'JAX_NUM_PROCESSES' if has_n else 'JAX_PROCESS_ID'})")
    if has_n:
        kwargs.update(_count_and_id(environ, "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"))
    if environ.get("JAX_LOCAL_DEVICE_IDS"):
        kwargs["local_device_ids"] = _int_list("JAX_LOCAL_DEVICE_IDS", environ["JAX_LOCAL_DEVICE_IDS"])
    return kwargs


def _master_addr_kwargs(environ: Mapping[str, str]) -> dict[str, Any]:
    # JAX_COORDINATOR_PORT wins so a launcher whose own rendezvous already holds MASTER_PORT
    # (torchrun's c10d store does) can give JAX a different port.
    port = environ.get("JAX_COORDINATOR_PORT") or environ.get("MASTER_PORT")
    if not port:
        raise ValueError("MASTER_ADDR is set but neither JAX_COORDINATOR_PORT nor MASTER_PORT is: "
                         "the coordinator needs a port")
    _int("MASTER_PORT/JAX_COORDINATOR_PORT", port)
    for name in ("WORLD_SIZE", "RANK"):
        if name not in environ:
            raise ValueError(f"MASTER_ADDR is set but {name} is not: expected WORLD_SIZE and RANK beside it")
    kwargs: dict[str, Any] = {"coordinator_address": f"{environ['MASTER_ADDR']}:{port}"}
    kwargs.update(_count_and_id(environ, "WORLD_SIZE", "RANK"))
    if "LOCAL_RANK" in environ and _int("LOCAL_WORLD_SIZE", environ.get("LOCAL_WORLD_SIZE", "1")) > 1:
        # One process per GPU: each process sees only its own device.
        kwargs["local_device_ids"] = [_int("LOCAL_RANK", environ["LOCAL_RANK"])]
    return kwargs


def _count_and_id(environ: Mapping[str, str], count_name: str, id_name: str) -> dict[str, int]:
    count, index = _int(count_name, environ[count_name]), _int(id_name, environ[id_name])
    if count < 1:
        raise ValueError(f"{count_name}={count}: expected a positive number of processes")
    if not 0 <= index < count:
        raise ValueError(f"{id_name}={index}: expected 0 <= {id_name} < {count_name}={count}")
    return {"num_processes": count, "process_id": index}


def _check_address(name: str, address: str) -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{name}={address!r}: expected host:port, e.g. 10.0.0.1:8476")
    _int(name + " port", port)


def _int(name: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected an integer") from None


def _int_list(name: str, raw: str) -> list[int]:
    return [_int(name, part.strip()) for part in raw.split(",") if part.strip()]
