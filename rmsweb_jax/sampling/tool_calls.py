"""Tool calls in Qwen's format (Hermes-style): the tool turns of a prompt, and the calls in a reply.

Prompt side: the model reads `tools`, `role: "tool"` results and assistant `tool_calls` through its chat
template. The conversation reaches the template through `processing.chat.render_chat`, which passes plain
turns (role + content) only, so `plain_messages` writes the tool parts into plain turns exactly as
Qwen3-VL's published template writes them: the tool list appended to the system turn, each call as
`<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>` after the assistant's text, consecutive tool
results as one user turn of `<tool_response>` blocks. `renders_like_template` checks that claim against a
tokenizer's own template (`apply_chat_template(..., tools=)`); the server refuses tool requests for a
model whose template writes them otherwise, rather than prompting it in a format it was not trained on.

Reply side: `parse_tool_calls` is vLLM's `hermes` parser: every `<tool_call>{json}</tool_call>` (or a
last unclosed `<tool_call>{json}`) becomes an OpenAI tool call; the text before the first one is the
content (None when empty). A block that is not JSON with a "name" leaves the whole reply as content, as
there: a client then sees what the model wrote instead of a guess.
"""
from __future__ import annotations

import json
import re
import uuid
from typing import Any, Sequence

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)
TOOLS_PREAMBLE = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                  "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_POSTAMBLE = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                   "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
                   "\"arguments\": <args-json-object>}\n</tool_call>")


def _text(content: Any) -> str:
    """Returns the text of a checked message content (a str or a list of text parts)."""
    if isinstance(content, str):
        return content
    return "".join(part["text"] for part in content if part.get("type") == "text")


def tools_block(tools: Sequence[dict]) -> str:
    """Returns the system-turn text that lists `tools` (the template's `tool | tojson` per line)."""
    return TOOLS_PREAMBLE + "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools) + TOOLS_POSTAMBLE


def call_text(name: str, arguments: str) -> str:
    """Returns one call as the template writes it (`arguments`: a JSON object's text, written as is)."""
    return f'{TOOL_OPEN}\n{{"name": "{name}", "arguments": {arguments}}}\n{TOOL_CLOSE}'


def plain_messages(messages: Sequence[dict], tools: Sequence[dict] | None) -> list[dict]:
    """Returns checked `messages` (roles system / user / assistant / tool; assistants may carry `tool_calls`
    as [{"name", "arguments"}]) as plain system / user / assistant turns that render like the template's
    own tool turns, with `tools` (None: none) listed in the system turn."""
    out: list[dict] = []
    if tools:
        system = messages[0]["role"] == "system"
        head = _text(messages[0]["content"]) + "\n\n" if system else ""
        out.append({"role": "system", "content": head + tools_block(tools)})
        messages = messages[1:] if system else messages
    for message in messages:
        role, content = message["role"], message["content"]
        if role == "assistant" and message.get("tool_calls"):
            text = _text(content)
            calls = [("\n" if i or content else "") + call_text(c["name"], c["arguments"])
                     for i, c in enumerate(message["tool_calls"])]
            out.append({"role": "assistant", "content": text + "".join(calls)})
        elif role == "tool":
            block = f"<tool_response>\n{_text(content)}\n</tool_response>"
            if out and out[-1].get("tool_results"):  # results of one round share a user turn
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "tool_results": True})
        else:
            out.append(dict(message))
    for message in out:
        message.pop("tool_results", None)
    return out


def renders_like_template(tokenizer) -> str | None:
    """Returns None when `plain_messages` renders a conversation with tools, calls and results exactly as
    the tokenizer's chat template does; else what differs (or why it could not be rendered)."""
    tools = [{"type": "function", "function": {"name": "click", "description": "Clicks an element.",
                                               "parameters": {"type": "object", "properties": {
                                                   "id": {"type": "integer"}}, "required": ["id"]}}}]
    messages = [{"role": "system", "content": "You are a web agent."}, {"role": "user", "content": "Open it."},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "click", "arguments": '{"id": 3}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "clicked"},
                {"role": "assistant", "content": "Done.", "tool_calls": [
                    {"id": "call_2", "type": "function", "function": {"name": "click", "arguments": '{"id": 4}'}},
                    {"id": "call_3", "type": "function", "function": {"name": "click", "arguments": '{"id": 5}'}}]},
                {"role": "tool", "tool_call_id": "call_2", "content": "ok"},
                {"role": "tool", "tool_call_id": "call_3", "content": "ok too"}]
    checked = [{"role": m["role"], "content": m["content"],
                **({"tool_calls": [c["function"] for c in m["tool_calls"]]} if "tool_calls" in m else {})}
               for m in messages]
    try:
        want = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        got = tokenizer.apply_chat_template(plain_messages(checked, tools), tokenize=False, add_generation_prompt=True)
    except Exception as err:  # noqa: BLE001 — any template failure means: tools cannot be served
        return f"the chat template failed on a tool conversation: {type(err).__name__}: {err}"
    if got == want:
        return None
    at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return f"the chat template writes tool turns as {want[at - 20:at + 40]!r}, not {got[at - 20:at + 40]!r}"


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Returns (content, OpenAI tool calls) of a reply: (the text, []) when it holds no parsable call."""
    if TOOL_OPEN not in text:
        return text, []
    calls = []
    try:
        for closed, unclosed in _TOOL_CALL.findall(text):
            call = json.loads(closed or unclosed)
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                return text, []
            calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {
                "name": call["name"], "arguments": json.dumps(call.get("arguments", {}), ensure_ascii=False)}})
    except ValueError:  # not JSON
        return text, []
    content = text[:text.find(TOOL_OPEN)]
    return content or None, calls
