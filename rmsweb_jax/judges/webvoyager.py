"""The WebVoyager judge: task + final answer + the last k screenshots → SUCCESS / NOT SUCCESS.

Protocol and prompt texts from MinorJerry/WebVoyager, evaluation/auto_eval.py (commit 0915447,
MIT License, Copyright (c) Tencent Holdings Ltd.): one call, system prompt below, user content =
"TASK / Result Response / <k> screenshots at the end:" text, the last k screenshots, then
"Your verdict:\\n"; the reply is read as the official script reads it: 'NOT SUCCESS' anywhere
→ failure, else 'SUCCESS' anywhere → success, else undecided (here: a judge error). The official
script gives up without a call when the agent never answered (counted 0); so does this judge.

Screenshot count: auto_eval.py's --max_attached_imgs defaults to 1 and evaluation/run_eval.sh
passes 15; this judge's default is 3 (configurable). Where the official template writes the
requested k into "<num> screenshots at the end", this judge writes how many it actually attached
(fewer when the attempt is shorter than k), so the text never claims images that are not there.
"""
from __future__ import annotations

import re

from rmsweb_jax.judges.base import FAILURE, SUCCESS, JudgeInput, Verdict
from rmsweb_jax.judges.llm import (Chat, ChatSession, JudgeFailure, error_verdict, image_part, preview, task_text,
                                   text_part, trajectory_screenshots)

SYSTEM_PROMPT = """As an evaluator, you will be presented with three primary components to assist you in your role:

1. Web Task Instruction: This is a clear and specific directive provided in natural language, detailing the online activity to be carried out. These requirements may include conducting searches, verifying information, comparing prices, checking availability, or any other action relevant to the specified web service (such as Amazon, Apple, ArXiv, BBC News, Booking etc).

2. Result Screenshots: This is a visual representation of the screen showing the result or intermediate state of performing a web task. It serves as visual proof of the actions taken in response to the instruction.

3. Result Response: This is a textual response obtained after the execution of the web task. It serves as textual result in response to the instruction.

-- You DO NOT NEED to interact with web pages or perform actions such as booking flights or conducting searches on websites.
-- You SHOULD NOT make assumptions based on information not presented in the screenshot when comparing it to the instructions.
-- Your primary responsibility is to conduct a thorough assessment of the web task instruction against the outcome depicted in the screenshot and in the response, evaluating whether the actions taken align with the given instructions.
-- NOTE that the instruction may involve more than one task, for example, locating the garage and summarizing the review. Failing to complete either task, such as not providing a summary, should be considered unsuccessful.
-- NOTE that the screenshot is authentic, but the response provided by LLM is generated at the end of web browsing, and there may be discrepancies between the text and the screenshots.
-- Note the difference: 1) Result response may contradict the screenshot, then the content of the screenshot prevails, 2) The content in the Result response is not mentioned on the screenshot, choose to believe the content.

You should elaborate on how you arrived at your final evaluation and then provide a definitive verdict on whether the task has been successfully accomplished, either as 'SUCCESS' or 'NOT SUCCESS'."""

USER_PROMPT = """TASK: <task>
Result Response: <answer>
<num> screenshots at the end: """

VERDICT_CUE = "Your verdict:\n"


def parse_webvoyager_verdict(text: str) -> str | None:
    """Returns "success", "failure", or None when the reply holds neither word — read exactly as
    auto_eval.py does (case-sensitive; 'NOT SUCCESS' wins over 'SUCCESS')."""
    if not isinstance(text, str):
        return None
    if "NOT SUCCESS" in text:
        return FAILURE
    if "SUCCESS" in text:
        return SUCCESS
    return None


class WebVoyagerJudge:
    """WebVoyager's GPT-4V auto-evaluator over any chat endpoint.

    `max_screenshots` is k (the last k screenshots are attached, oldest first); `require_answer`
    follows the official script: an attempt without a final answer fails without a call.
    """

    def __init__(self, chat: Chat, *, max_screenshots: int = 3, require_answer: bool = True, name: str = "webvoyager"):
        if not callable(chat):
            raise TypeError(f"chat must be callable (messages -> text), got {type(chat).__name__}")
        if isinstance(max_screenshots, bool) or not isinstance(max_screenshots, int) or max_screenshots < 1:
            raise ValueError(f"max_screenshots must be an int >= 1, got {max_screenshots!r}")
        self.chat, self.max_screenshots, self.require_answer, self.name = chat, max_screenshots, require_answer, name

    def build_messages(self, attempt: JudgeInput) -> list[dict]:
        """Returns the official judge messages for `attempt`."""
        shots = trajectory_screenshots(attempt)[-self.max_screenshots:]
        values = {"<task>": task_text(attempt), "<answer>": (attempt.final_answer or "").strip(), "<num>": str(len(shots))}
        # One pass, so a task or answer that happens to contain "<num>" stays as written.
        user = re.sub("<task>|<answer>|<num>", lambda m: values[m.group(0)], USER_PROMPT)
        content = [text_part(user)] + [image_part(png) for png in shots] + [text_part(VERDICT_CUE)]
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": content}]

    def judge(self, attempt: JudgeInput) -> Verdict:
        """Returns the judge model's verdict on `attempt`; an error when it cannot be read."""
        session = ChatSession(self.chat)
        try:
            if self.require_answer and not (attempt.final_answer or "").strip():
                task_text(attempt)  # a missing instruction is still an error, not a failure
                return Verdict(outcome=FAILURE, judge=self.name, calls=0,
                               reason="no final answer: the agent never answered (WebVoyager's auto_eval counts this "
                                      "as a failure without asking the judge)")
            text = session.ask(self.build_messages(attempt), "WebVoyager verdict")
            outcome = parse_webvoyager_verdict(text)
            if outcome is None:
                raise JudgeFailure(f"WebVoyager verdict: expected 'SUCCESS' or 'NOT SUCCESS' in the reply, got "
                                   f"{preview(text)}", raw=text)
        except JudgeFailure as failure:
            return error_verdict(self.name, failure, session)
        reason = f"judge said {'NOT SUCCESS' if outcome == FAILURE else 'SUCCESS'}: {preview(text, 300)}"
        return session.verdict(outcome, reason=reason, raw=text, judge=self.name)
