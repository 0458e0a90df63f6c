"""Policies from a spec string: "teacher", "flax:<model spec>" or "http:<base_url>#<model>" (`build_policy`).

Here, beside the policies, rather than in a stage: collect, eval and mine each build policies, and a new
policy type is one more branch of `build_policy`, not an edit of a stage that other stages import.
`endpoint` and `api_key` read the "<base_url>#<model>" and API-key settings that the LLM judges share
(judges/from_config.py)."""
from __future__ import annotations

import dataclasses
import os
import pathlib

from rmsweb_jax.errors import UserError


def endpoint(spec: str, what: str) -> tuple[str, str]:
    """Returns (base_url, model) of "<base_url>#<model>"; UserError names `what` (the config key) otherwise."""
    # The model name cannot contain "#", a URL rarely does.
    base_url, sep, model = spec.rpartition("#")
    if not sep or not base_url or not model:
        raise UserError(f"{what} {spec!r}: expected '<base_url>#<model>', e.g. 'http://127.0.0.1:8000/v1#qwen3-vl'")
    return base_url, model


def api_key(name: str, key: str) -> str | None:
    """Returns the value of env var `name` (None for "": no key), which config key `key` names."""
    if not name:
        return None
    if name not in os.environ:
        raise UserError(f"{key} names ${name}, which is not set")
    return os.environ[name]


def _prompt_builder(config):
    from rmsweb_jax.agents.prompt import PromptBuilder, prompt_config_from
    return PromptBuilder(prompt_config_from(config))


@dataclasses.dataclass(frozen=True)
class PolicySettings:
    """What building a policy takes besides its spec: the suite it plays, the model's batch size,
    its sampling, the teacher's mistakes (MistakeConfig fields), the env var holding an endpoint's
    API key, and the config key that named the spec (for error messages)."""

    suite: str
    max_batch: int
    max_new_tokens: int
    temperature: float
    teacher: dict
    api_key_env: str
    key: str


def build_policy(spec: str, settings: PolicySettings, *, config, workdir: pathlib.Path, task_ids: list[str],
                 devices=None):
    """Returns the Policy of `spec`: "teacher" (ScriptedTeacher with settings.teacher's mistakes),
    "flax:<model spec>" (our model in-process, e.g. flax:random:tiny or flax:hf:/ckpt, with the
    run's config for dtypes, mesh and prompt) or "http:<base_url>#<model>" (an OpenAI-compatible
    endpoint). A flax model is placed on `devices` (default: the global mesh's): jax.local_devices() when each
    host plays its own episodes, sampling at its own browsers' pace. Raises UserError naming settings.key for
    an unknown spec or a teacher on a live suite."""
    if spec == "teacher" and settings.suite != "miniwob":
        raise UserError(f"{settings.key} 'teacher' cannot play the {settings.suite} suite: the ScriptedTeacher only "
                        "knows MiniWoB++; use 'http:<base_url>#<model>' or 'flax:<model spec>'")
    if spec == "teacher":
        # deferred, here and below: a builder imports only the policy type it builds (the teacher needs no jax)
        from rmsweb_jax.agents.teacher import MistakeConfig, ScriptedTeacher
        return ScriptedTeacher(MistakeConfig.from_dict(settings.teacher), tasks=task_ids)
    kind, _, rest = spec.partition(":")
    if kind == "flax" and rest:
        from rmsweb_jax.sampling.chat_model import ChatModel
        from rmsweb_jax.agents.flax_policy import FlaxPolicy
        from rmsweb_jax.sampling.sampler import SamplingParams
        chat_model = ChatModel.load(rest, workdir, config=config, max_batch=settings.max_batch, devices=devices)
        params = SamplingParams(max_new_tokens=settings.max_new_tokens, temperature=settings.temperature)
        return FlaxPolicy(chat_model, _prompt_builder(config), params, seed=config.seed, owns_model=True)
    if kind == "http" and rest:
        from rmsweb_jax.agents.chat_client import ChatClient
        from rmsweb_jax.agents.http_policy import HttpPolicy
        base_url, model = endpoint(rest, settings.key)
        client = ChatClient(base_url, model, api_key=api_key(settings.api_key_env, "collect.api_key_env"),
                            max_concurrency=settings.max_batch)
        return HttpPolicy(client, _prompt_builder(config), max_tokens=settings.max_new_tokens,
                          temperature=settings.temperature)
    raise UserError(f"{settings.key} {spec!r}: expected 'teacher', 'flax:<model spec>' or 'http:<base_url>#<model>'")
