"""Online-Mind2Web's WebJudge: key points, per-screenshot relevance, then the outcome.

Protocol of OSU-NLP-Group/Online-Mind2Web, src/methods/webjudge_online_mind2web.py and
src/utils.py (prompt texts verbatim in webjudge_prompts.py):
1. one call extracts the task's key points (the reply is cut after "**Key Points**:", else after
   the last "Key Points:");
2. one call per screenshot scores its relevance 1–5 with reasoning; screenshots scoring ≥ the
   threshold (3) are kept in trajectory order, at most `max_images` (50), each with the first
   paragraph of its reasoning as its "reason";
3. one call sees task, key points, the numbered action history (factual actions only: the
   closing answer is left out, as the benchmark asks) and the kept screenshots, and answers
   `Status: "success"` or `Status: "failure"`.

Where this judge differs, on purpose: an image-score reply with no readable 1–5 score counts as
0 (dropped) as in the original, but is named in the reason (or, with `strict_scores`, makes the
verdict an error); the final reply must name exactly one of success/failure after its last
"Status:" — the original counts any reply without "status:" as a failure and one whose tail
merely contains "success" as a success, here both are judge errors. Screenshots travel as PNG
(the original re-encodes to JPEG), with "detail": "high" as in the original.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import re
from typing import Any

from rmsweb_jax.judges import webjudge_prompts as prompts
from rmsweb_jax.judges.base import FAILURE, SUCCESS, JudgeInput, Verdict
from rmsweb_jax.judges.llm import (Chat, ChatSession, JudgeFailure, action_history, error_verdict, image_part, numbered,
                                   preview, task_text, text_part, trajectory_screenshots)

_SCORE = re.compile(r"\bscore\b(?:\s*\([^)\n]*\))?[\s*:：\-\[\]\"'=]*(\d+(?:\.\d+)?)", re.I)
_STATUS = re.compile(r"status\**\s*[:：]", re.I)
_OUTCOME_WORD = re.compile(r"\b(success|failure)\b", re.I)


def parse_key_points(text: str) -> str:
    """Returns the key-point list of a key-point reply, cut as the original does; raises
    JudgeFailure when nothing is left."""
    text = (text or "").replace("\n\n", "\n")
    if "**Key Points**:" in text:
        text = text.split("**Key Points**:")[1]
    else:
        text = text.split("Key Points:")[-1]
    points = "\n".join(line.lstrip() for line in text.splitlines())
    if not points.strip():
        raise JudgeFailure("WebJudge key points: expected a numbered list of key points, got an empty reply",
                           raw=text)
    return points


def parse_image_score(text: str) -> int | None:
    """Returns the 1–5 relevance score in an image-score reply ("**Score**: 4", "Score: [4]",
    "Score: 4/5"; the last one written), or None when there is none or it is out of range."""
    matches = list(_SCORE.finditer(text or ""))
    if not matches:
        return None
    value = float(matches[-1].group(1))
    return int(value) if value.is_integer() and 1 <= value <= 5 else None


def image_thought(text: str) -> str:
    """Returns the screenshot's reason as the original takes it: the first paragraph after the
    last "**Reasoning**:", on one line."""
    return (text or "").split("**Reasoning**:")[-1].strip().lstrip("\n").split("\n\n")[0].replace("\n", " ")


def parse_status(text: str) -> str | None:
    """Returns "success" / "failure" from the line after the last "Status:" (quotes, markdown
    and case tolerated), or None when there is no such line or it names both or neither."""
    matches = list(_STATUS.finditer(text or ""))
    if not matches:
        return None
    # The verdict may sit on the same line or, after a bare "**Status:**", on the next one.
    line = next((ln for ln in text[matches[-1].end():].splitlines() if ln.strip(" \t*\"'`")), "")
    words = {w.lower() for w in _OUTCOME_WORD.findall(line)}
    return words.pop() if len(words) == 1 else None


@dataclasses.dataclass(frozen=True)
class ImageScore:
    """One screenshot's relevance call: its index in the trajectory, the score (0 when the reply
    held no readable 1–5 score), the reason kept with it, and the reply."""

    index: int
    score: int
    thought: str
    readable: bool
    raw: str

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class WebJudgeRecord:
    """A WebJudge run in full: the verdict, the key points, every screenshot's score, and the
    indices of the screenshots shown to the final call."""

    verdict: Verdict
    key_points: str = ""
    image_scores: tuple[ImageScore, ...] = ()
    kept: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict."""
        return {"verdict": self.verdict.to_dict(), "key_points": self.key_points,
                "image_scores": [s.to_dict() for s in self.image_scores], "kept": list(self.kept)}


def select_screenshots(scores: list[ImageScore], threshold: int, max_images: int) -> list[ImageScore]:
    """Returns the screenshots shown to the final call: score ≥ threshold, in trajectory order,
    the first `max_images` of them (the original truncates, it does not rank)."""
    return [s for s in scores if s.score >= threshold][:max_images]


class WebJudge:
    """WebJudge over any chat endpoint. `score_threshold` (3) and `max_images` (50) are the
    original's; `workers` bounds the concurrent screenshot calls (the original sends them all at
    once); `strict_scores` makes an unreadable screenshot score a judge error."""

    def __init__(self, chat: Chat, *, score_threshold: int = 3, max_images: int = 50, workers: int = 8,
                 strict_scores: bool = False, name: str = "webjudge"):
        if not callable(chat):
            raise TypeError(f"chat must be callable (messages -> text), got {type(chat).__name__}")
        if isinstance(score_threshold, bool) or not isinstance(score_threshold, int) or not 1 <= score_threshold <= 5:
            raise ValueError(f"score_threshold must be an int in 1..5, got {score_threshold!r}")
        for key, value in (("max_images", max_images), ("workers", workers)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key} must be an int >= 1, got {value!r}")
        self.chat, self.score_threshold, self.max_images = chat, score_threshold, max_images
        self.workers, self.strict_scores, self.name = workers, strict_scores, name

    # --- the three prompts --------------------------------------------------------------------
    @staticmethod
    def key_points_messages(task: str) -> list[dict]:
        """Returns the messages of step 1 (key points)."""
        return [{"role": "system", "content": prompts.KEY_POINTS_SYSTEM},
                {"role": "user", "content": [text_part(prompts.KEY_POINTS_USER.format(task=task))]}]

    @staticmethod
    def image_messages(task: str, key_points: str, png: bytes) -> list[dict]:
        """Returns the messages of step 2 for one screenshot."""
        text = prompts.IMAGE_USER.format(task=task, key_points=key_points)
        return [{"role": "system", "content": prompts.IMAGE_SYSTEM},
                {"role": "user", "content": [text_part(text), image_part(png, detail="high")]}]

    @staticmethod
    def final_messages(task: str, key_points: str, actions: list[str], kept: list[tuple[bytes, str]]) -> list[dict]:
        """Returns the messages of step 3: `kept` holds (screenshot, reason) pairs in order."""
        thoughts = [thought for _, thought in kept if thought != ""]
        template = prompts.FINAL_USER if kept else prompts.FINAL_USER_NO_IMAGES
        text = template.format(task=task, key_points=key_points, last_actions=numbered(actions),
                               thoughts=numbered(thoughts))
        images = [image_part(png, detail="high") for png, _ in kept]
        return [{"role": "system", "content": prompts.FINAL_SYSTEM},
                {"role": "user", "content": [text_part(text)] + images}]

    # --- the run ------------------------------------------------------------------------------
    def evaluate(self, attempt: JudgeInput) -> WebJudgeRecord:
        """Returns the full record of judging `attempt` (its verdict is an error when a call
        failed or a reply could not be read)."""
        session = ChatSession(self.chat)
        key_points, scores = "", []
        try:
            task = task_text(attempt)
            key_points = parse_key_points(session.ask(self.key_points_messages(task), "WebJudge key points"))
            shots = trajectory_screenshots(attempt)
            scores = self._score_images(session, task, key_points, shots)
            unreadable = [s.index for s in scores if not s.readable]
            if unreadable and self.strict_scores:
                bad = scores[unreadable[0]]
                raise JudgeFailure(f"WebJudge screenshot {bad.index}: expected 'Score: N' with N in 1..5, got "
                                   f"{preview(bad.raw)}", raw=bad.raw)
            kept = select_screenshots(scores, self.score_threshold, self.max_images)
            messages = self.final_messages(task, key_points, action_history(attempt, drop_answer=True),
                                           [(shots[s.index], s.thought) for s in kept])
            text = session.ask(messages, "WebJudge verdict")
            status = parse_status(text)
            if status is None:
                raise JudgeFailure("WebJudge verdict: expected a final line 'Status: \"success\"' or "
                                   "'Status: \"failure\"', "
                                   f"got {preview(text[-200:] if text else text)}", raw=text)
        except JudgeFailure as failure:
            return WebJudgeRecord(error_verdict(self.name, failure, session), key_points, tuple(scores))
        reason = (f"Status: {status}; {len(kept)}/{len(scores)} screenshots kept (score >= {self.score_threshold}, "
                  f"max {self.max_images}); scores {[s.score for s in scores]}")
        if unreadable:
            reason += f"; no readable score for screenshots {unreadable} (counted 0)"
        verdict = session.verdict(SUCCESS if status == SUCCESS else FAILURE, reason=reason, raw=text, judge=self.name)
        return WebJudgeRecord(verdict, key_points, tuple(scores), tuple(s.index for s in kept))

    def judge(self, attempt: JudgeInput) -> Verdict:
        """Returns WebJudge's verdict on `attempt`."""
        return self.evaluate(attempt).verdict

    def _score_images(self, session: ChatSession, task: str, key_points: str, shots: list[bytes]) -> list[ImageScore]:
        def score(index: int) -> ImageScore:
            text = session.ask(self.image_messages(task, key_points, shots[index]), f"WebJudge screenshot {index}")
            value = parse_image_score(text)
            return ImageScore(index=index, score=value or 0, thought=image_thought(text) if value else "",
                              readable=value is not None, raw=text)

        if not shots:
            return []
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(self.workers, len(shots))) as pool:
            return list(pool.map(score, range(len(shots))))
