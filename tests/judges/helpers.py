"""Helpers for judge tests: screenshots drawn with PIL, attempts built from real tasks, a
scripted chat callable standing in for the external judge model, and the JSON reply of the
OpenAI-compatible test servers."""
from __future__ import annotations

import io
import json
import threading
from typing import Callable

from PIL import Image, ImageDraw

from rmsweb_jax.agents.policy import PastStep
from rmsweb_jax.judges import JudgeInput
from rmsweb_jax.judges.llm import image_bytes
from rmsweb_jax.web.action_text import format_action
from rmsweb_jax.web.actions import Action


def screenshot(index: int, size: tuple[int, int] = (64, 48)) -> bytes:
    """Returns a small PNG whose top-left pixel encodes `index` (red = index % 256, green = index // 256)."""
    image = Image.new("RGB", size, (index % 256, index // 256, 200))
    ImageDraw.Draw(image).text((4, 4), str(index), fill=(255, 255, 255))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def screenshot_index(png: bytes) -> int:
    """Returns the index `screenshot` drew into `png`."""
    red, green, _ = Image.open(io.BytesIO(png)).convert("RGB").getpixel((0, 0))
    return red + 256 * green


def images_in(messages: list[dict]) -> list[int]:
    """Returns the screenshot indices of every image part in `messages`, in order."""
    out = []
    for message in messages:
        content = message["content"]
        for part in content if isinstance(content, list) else ():
            if part["type"] == "image_url":
                out.append(screenshot_index(image_bytes(part)))
    return out


def text_of(message: dict) -> str:
    """Returns the text parts of one message joined (a plain string content as is)."""
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(p["text"] for p in content if p["type"] == "text")


def make_attempt(task, n_steps: int, answer: str | None = None, final: bool = True) -> JudgeInput:
    """Returns an attempt on `task` with `n_steps` click steps (screenshots 0..n-1), then an answer
    step (screenshot n) when `answer` is given, and a final screenshot (index 999) if `final`."""
    steps = [PastStep(screenshot=screenshot(i), url=f"https://example.test/{i}", thought=f"step {i}",
                      action_text=format_action(Action.click(100 + i, 200 + i), f"thought {i}"))
             for i in range(n_steps)]
    if answer is not None:
        steps.append(PastStep(screenshot=screenshot(n_steps), url="https://example.test/end", thought="done",
                              action_text=format_action(Action.answer_with(answer), "I found it.")))
    return JudgeInput(task=task, instruction=task.instruction, steps=tuple(steps),
                      final_screenshot=screenshot(999) if final else None, final_answer=answer)


class ScriptedChat:
    """A chat callable standing in for the external judge LLM: `reply(messages) -> text` decides
    each answer; every call's messages are recorded (thread-safe, judges fan out)."""

    def __init__(self, reply: Callable[[list[dict]], str] | str):
        self.reply = reply if callable(reply) else (lambda messages: reply)
        self.calls: list[list[dict]] = []
        self._lock = threading.Lock()

    def __call__(self, messages: list[dict]) -> str:
        with self._lock:
            self.calls.append(messages)
        return self.reply(messages)


def send_json(handler, payload: dict) -> None:
    """Writes `payload` as the 200 JSON response of an http.server request handler."""
    data = json.dumps(payload).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
