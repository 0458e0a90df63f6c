"""The judge of a config.collect-shaped block: `judge_spec` reads collect.judge, `judge_from_config` builds it.

Here, beside the judges, rather than in the collect stage: collect, eval and mine judge with the same keys
(collect.judge, success, judge_api_key_env, judge_screenshots), and eval passes its own copy of the block."""
from __future__ import annotations

from rmsweb_jax.agents.from_config import api_key, endpoint
from rmsweb_jax.errors import UserError
from rmsweb_jax.judges import JUDGES, LLM_JUDGES, chat_from_client, make_judge
from rmsweb_jax.judges.cache import cached_chat
from rmsweb_jax.suites.from_config import LIVE_SUITES, SUITES
from rmsweb_jax.suites.success_rule import check_success_rule

# How every LLM judge of a config samples its endpoint; part of a cached reply's key (judges/cache.py).
JUDGE_SAMPLING = {"max_tokens": 1024, "temperature": 0.0}

# The judge each benchmark's published numbers use; collect.judge = "<base_url>#<model>" picks it.
OFFICIAL_JUDGES = {"miniwob": "programmatic", "webvoyager": "webvoyager", "online_mind2web": "webjudge",
                   "webtailbench": "webtailbench"}


def judge_spec(cfg) -> tuple[str, str | None]:
    """Returns (judge name, "<base_url>#<model>" or None) of collect.judge for collect.suite:
    "" is the suite's official judge (an LLM judge then needs an endpoint), "<base_url>#<model>"
    the official judge on that endpoint, "<name>" or "<name>:<base_url>#<model>" a judge by name.
    Raises UserError for the programmatic judge on a live suite and for a missing endpoint."""
    suite, spec = cfg.suite, cfg.judge.strip()
    if suite not in OFFICIAL_JUDGES:
        raise UserError(f"collect.suite {suite!r}: expected one of {list(SUITES)}")
    official = OFFICIAL_JUDGES[suite]
    if spec.startswith(("http://", "https://")):
        if official not in LLM_JUDGES:
            raise UserError(f"collect.judge {spec!r}: the {suite} suite's own judge is {official!r}, which takes no "
                            "endpoint; to judge it with an LLM name one: '<judge>:<base_url>#<model>' with <judge> "
                            f"in {list(LLM_JUDGES)}")
        name, url = official, spec
    else:
        name, _, url = (spec or official).partition(":")
    if name not in JUDGES:
        raise UserError(f"collect.judge {cfg.judge!r}: unknown judge {name!r}; expected '<base_url>#<model>' (the "
                        f"{suite} suite's {official!r} judge) or one of {sorted(JUDGES)}")
    if suite in LIVE_SUITES and name not in LLM_JUDGES:
        raise UserError(f"collect.judge {name!r} cannot judge the live {suite} suite: live sites report no reward; "
                        f"use an LLM judge, the benchmark's official one is {official!r} "
                        f"(collect.judge='<base_url>#<model>' or '{official}:<base_url>#<model>')")
    if name in LLM_JUDGES:
        if not url:
            raise UserError(f"collect.judge {cfg.judge!r}: the {name!r} judge is an LLM judge and needs its endpoint: "
                            f"'{name}:<base_url>#<model>' (or '<base_url>#<model>' for the {suite} suite's official "
                            f"{official!r} judge), e.g. '{name}:http://127.0.0.1:8001/v1#qwen3-vl-32b'")
        endpoint(url, "collect.judge")
        return name, url
    if url:
        raise UserError(f"collect.judge {cfg.judge!r}: the {name!r} judge takes no endpoint")
    return name, None


def judge_from_config(cfg, cache=None):
    """Returns the judge of collect.judge (see judge_spec): the programmatic one under
    collect.success, or an LLM judge over its endpoint, with collect.judge_api_key_env's key and
    collect.judge_screenshots as its screenshot budget; with `cache` (a JudgeCache) the LLM judge's
    replies come from it when the same request was asked before (judges/cache.py)."""
    name, url = judge_spec(cfg)
    if url is None:  # the programmatic judge: the reward under collect.success decides
        return make_judge(name, success=check_success_rule(cfg.success, "collect.success"))
    from rmsweb_jax.agents.chat_client import ChatClient
    base_url, model = endpoint(url, "collect.judge")
    options = {}
    shots = cfg.judge_screenshots
    if shots:  # WebJudge keeps up to this many relevant screenshots; the others attach the last this many
        options["max_images" if name == "webjudge" else "max_screenshots"] = int(shots)
    key = api_key(cfg.judge_api_key_env, "collect.judge_api_key_env")
    client = ChatClient(base_url, model, api_key=key, max_concurrency=max(cfg.workers, 8))
    chat = chat_from_client(client, **JUDGE_SAMPLING)
    if cache is not None:
        chat = cached_chat(chat, cache, {"model": model, **JUDGE_SAMPLING})
    return make_judge(name, chat, **options)
