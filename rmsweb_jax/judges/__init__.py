"""Judges: the programmatic MiniWoB++ judge and the LLM judges of WebVoyager, Online-Mind2Web
(WebJudge) and WebTailBench, all behind one interface (JudgeInput → Verdict)."""
from __future__ import annotations

from typing import Any

from rmsweb_jax.judges.base import ERROR, FAILURE, OUTCOMES, SUCCESS, Judge, JudgeInput, Verdict
from rmsweb_jax.judges.llm import Chat, chat_from_client, image_part, text_part
from rmsweb_jax.judges.programmatic import ProgrammaticJudge
from rmsweb_jax.judges.webjudge import WebJudge, WebJudgeRecord
from rmsweb_jax.judges.webtailbench import RubricRecord, WebTailBenchJudge
from rmsweb_jax.judges.webvoyager import WebVoyagerJudge

JUDGES = {"programmatic": ProgrammaticJudge, "webvoyager": WebVoyagerJudge, "webjudge": WebJudge,
          "webtailbench": WebTailBenchJudge}
LLM_JUDGES = ("webvoyager", "webjudge", "webtailbench")


def make_judge(name: str, chat: Chat | None = None, **options: Any) -> Judge:
    """Returns the judge called `name` ("programmatic", "webvoyager", "webjudge", "webtailbench"),
    built with `options` (its constructor's keyword arguments). LLM judges need `chat`; the
    programmatic judge takes none. Raises ValueError naming the name or argument at fault."""
    if name not in JUDGES:
        raise ValueError(f"unknown judge {name!r}; expected one of {sorted(JUDGES)}")
    if name in LLM_JUDGES:
        if chat is None:
            raise ValueError(f"judge {name!r} is an LLM judge: pass chat (messages -> text), e.g. "
                             "chat_from_client(ChatClient(base_url, model))")
        return JUDGES[name](chat, **options)
    if chat is not None:
        raise ValueError(f"judge {name!r} reads the suite's reward and takes no chat callable")
    return JUDGES[name](**options)


__all__ = [
    "Chat", "ERROR", "FAILURE", "JUDGES", "Judge", "JudgeInput", "LLM_JUDGES", "OUTCOMES", "ProgrammaticJudge",
    "RubricRecord", "SUCCESS", "Verdict", "WebJudge", "WebJudgeRecord", "WebTailBenchJudge", "WebVoyagerJudge",
    "chat_from_client", "image_part", "make_judge", "text_part",
]
