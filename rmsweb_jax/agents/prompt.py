"""The one prompt every stage uses: system prompt with the computer_use tool, user turn, assistant target.

Collection, SFT, mining, Salvage-DS and evaluation all build their chat messages here, so the
model is trained on exactly the prompt it is sampled with. Messages are OpenAI chat format with
screenshots as PNG data-URL parts (`processing.chat` renders them through the chat template;
`HttpPolicy` sends them as they are).

What the model sees is config.prompt's choice: `observation` = "screenshot" (the default, what a
real Qwen3-VL checkpoint reads), "elements" (a text list of the page's elements with their centres
in the action's own coordinate grid and their state: no image at all, for small models trained
from scratch) or "both"; `system` = "qwen_tools" (Qwen's function-calling block with the full
tool schema, ~1,900 tokens) or "compact" (the same actions and coordinate rule in a few lines).
"""
from __future__ import annotations

import dataclasses
import json
import urllib.parse
from typing import Any

from rmsweb_jax.agents.policy import PastStep, ReflectionRequest, StepContext
from rmsweb_jax.errors import UserError
from rmsweb_jax.processing.chat import image_url_part
from rmsweb_jax.web.action_text import CLOSE, OPEN, TOOL_NAME
from rmsweb_jax.web.actions import ACTION_NAMES, MAX_WAIT_S, CoordinateSpace
from rmsweb_jax.web.elements import Element
from rmsweb_jax.web.observation import Observation

# What each action does, and the arguments it requires / may take (actions.py enforces the same).
ACTION_DOCS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "left_click": ("Click the left mouse button at `coordinate`.", ("coordinate",), ()),
    "double_click": ("Double-click the left mouse button at `coordinate`.", ("coordinate",), ()),
    "hover": ("Move the mouse to `coordinate` without clicking.", ("coordinate",), ()),
    "type": ("Type `text` into the focused field (or click `coordinate` first); `clear` empties the field "
             "first, `press_enter` presses Enter after typing.", ("text",), ("coordinate", "press_enter", "clear")),
    "key": ("Press a key or key combination, e.g. [\"Enter\"] or [\"Control\", \"a\"].", ("keys",), ()),
    "scroll": ("Scroll the page (or the element at `coordinate`) by `amount` pixels in `direction`.",
               ("direction", "amount"), ("coordinate",)),
    "go_back": ("Go back to the previous page in the browser history.", (), ()),
    "navigate": ("Open `url` in the current tab.", ("url",), ()),
    "wait": ("Wait `time` seconds for the page to change.", (), ("time",)),
    "answer": ("Finish the task, giving `text` as the final answer (a short confirmation when the task "
               "asks for no answer).", ("text",), ()),
}
ARGUMENT_TYPES: dict[str, dict[str, Any]] = {
    "coordinate": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2},
    "text": {"type": "string"},
    "press_enter": {"type": "boolean"},
    "clear": {"type": "boolean"},
    "keys": {"type": "array", "items": {"type": "string"}},
    "direction": {"type": "string", "enum": ["up", "down", "left", "right"]},
    "amount": {"type": "integer", "minimum": 1},
    "url": {"type": "string"},
    "time": {"type": "number", "minimum": 0, "maximum": MAX_WAIT_S},
}

AGENT_INTRO = ("You are a web agent. You complete the user's task in a web browser by looking at screenshots of "
               "the page and acting on it with the computer_use tool, one action per turn.")
RESPONSE_FORMAT = ("In each turn, first write a short thought about what you see and what to do next, then exactly "
                   "one tool call. When the task is complete, call the `answer` action.")
COMPACT_INTRO = "Web agent: a short thought, then one computer_use call per turn; answer when done."
REFLECTION_HEADER = "Reflections on your earlier failed attempts at this task (use them; do not repeat those mistakes):"


OBSERVATIONS = ("screenshot", "elements", "both")
SYSTEM_PROMPTS = ("qwen_tools", "compact")


@dataclasses.dataclass(frozen=True)
class PromptConfig:
    """What the prompt shows (every field from config.prompt: configs/common.py holds the defaults).

    `observation` is what the current page is shown as: its "screenshot", its "elements" (up to
    `max_elements` of them, with centre and state, names cut to `max_element_name` characters) or
    "both". `history_steps` earlier steps as text (thought + action), of which the last
    `history_images` also with their screenshot; `reflection_images` screenshots of the failed
    attempt (its last steps) go into the reflection prompt. `system` is the system prompt:
    "qwen_tools" (Qwen's tool block with the full schema) or "compact". `local_ports`: URLs on this
    machine (127.0.0.1, localhost, [::1]) shown with their port; False leaves it out (shown_url).
    """

    observation: str
    system: str
    history_steps: int
    history_images: int
    max_elements: int
    max_element_name: int
    reflection_images: int
    local_ports: bool

    def __post_init__(self):
        for name in ("history_steps", "history_images", "max_elements", "max_element_name", "reflection_images"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UserError(f"config.prompt.{name} must be a non-negative int, got {value!r}")
        if self.history_images > self.history_steps:
            raise UserError(f"config.prompt.history_images ({self.history_images}) must not exceed history_steps "
                            f"({self.history_steps}): a screenshot is shown only with its step's text")
        if self.observation not in OBSERVATIONS:
            raise UserError(f"config.prompt.observation = {self.observation!r}; expected one of {list(OBSERVATIONS)}")
        if self.system not in SYSTEM_PROMPTS:
            raise UserError(f"config.prompt.system = {self.system!r}; expected one of {list(SYSTEM_PROMPTS)}")
        if not isinstance(self.local_ports, bool):
            raise UserError(f"config.prompt.local_ports must be True or False, got {self.local_ports!r}")
        if self.max_element_name < 8:
            raise UserError(f"config.prompt.max_element_name must be >= 8 characters, got {self.max_element_name}")

    @property
    def shows_screenshot(self) -> bool:
        """Returns whether the current page's screenshot is in the user turn."""
        return self.observation in ("screenshot", "both")

    @property
    def shows_elements(self) -> bool:
        """Returns whether the current page's element list is in the user turn."""
        return self.observation in ("elements", "both")

    @classmethod
    def from_config(cls, cfg) -> "PromptConfig":
        """Returns the PromptConfig of a config.prompt section, which must name every field."""
        names = {f.name for f in dataclasses.fields(cls)}
        d = dict(cfg.to_dict() if hasattr(cfg, "to_dict") else cfg)
        if "include_elements" in d:
            raise UserError(f"config.prompt.include_elements (= {d['include_elements']!r}) was replaced by "
                            "config.prompt.observation: include_elements=False is observation='screenshot', True is "
                            "observation='both' ('elements' shows the list without the screenshot)")
        unknown, missing = sorted(set(d) - names), sorted(names - set(d))
        if unknown or missing:
            wrong = "; ".join(([f"unknown key(s) {unknown}"] if unknown else [])
                              + ([f"missing key(s) {missing}"] if missing else []))
            raise UserError(f"config.prompt: {wrong}; it takes exactly {sorted(names)} "
                            "(configs/common.py sets them all)")
        return cls(**d)


def prompt_config_from(config) -> PromptConfig:
    """Returns the PromptConfig of `config.prompt`, the one prompt block every stage reads."""
    if "prompt" not in config:
        raise UserError("the config has no `prompt` block; start it from configs/common.py's base_config(), "
                        "which sets config.prompt.*")
    return PromptConfig.from_config(config.prompt)


def coordinate_help(space: CoordinateSpace) -> str:
    """Returns how `coordinate` reads in `space` (told to the model in the tool description)."""
    if space.kind == "relative":
        return ("[x, y] on a 0-1000 grid over the screenshot, whatever its size: [0, 0] is the top-left corner, "
                "[1000, 1000] the bottom-right; x grows to the right, y downwards.")
    return (f"[x, y] in pixels of the {space.width}x{space.height} screenshot: [0, 0] is the top-left corner, "
            f"x grows to the right (0..{space.width}), y downwards (0..{space.height}).")


def tool_schema(space: CoordinateSpace) -> dict[str, Any]:
    """Returns the computer_use tool as a function-calling JSON schema (Qwen's `tools` entry form)."""
    required_by: dict[str, list[str]] = {arg: [] for arg in ARGUMENT_TYPES}
    optional_for: dict[str, list[str]] = {arg: [] for arg in ARGUMENT_TYPES}
    for name, (_, required, optional) in ACTION_DOCS.items():
        for arg in required:
            required_by[arg].append(name)
        for arg in optional:
            optional_for[arg].append(name)
    users = {arg: ([f"required by {', '.join(required_by[arg])}"] if required_by[arg] else [])
             + ([f"optional for {', '.join(optional_for[arg])}"] if optional_for[arg] else [])
             for arg in ARGUMENT_TYPES}
    notes = {"coordinate": coordinate_help(space), "text": "The text to type, or the final answer.",
             "press_enter": "Press Enter after typing.", "clear": "Empty the field before typing.",
             "keys": "Key names, pressed together.", "direction": "Scroll direction.",
             "amount": "Scroll distance in pixels.", "url": "The URL to open.", "time": "Seconds to wait."}
    properties: dict[str, Any] = {"action": {
        "type": "string", "enum": list(ACTION_NAMES),
        "description": "The action to perform:\n" + "\n".join(f"* `{n}`: {ACTION_DOCS[n][0]}" for n in ACTION_NAMES)}}
    for arg, schema in ARGUMENT_TYPES.items():
        properties[arg] = {**schema, "description": f"{notes[arg]} ({'; '.join(users[arg])})"}
    return {"type": "function", "function": {
        "name": TOOL_NAME,
        "description": "Use a mouse and keyboard to interact with the web page shown in the screenshot.",
        "parameters": {"type": "object", "properties": properties, "required": ["action"]}}}


def system_prompt(space: CoordinateSpace, kind: str = "qwen_tools") -> str:
    """Returns the system prompt of `kind` (config.prompt.system): the agent's role and the tool in
    Qwen's function-calling format ("qwen_tools"), or the same actions in a few lines ("compact")."""
    if kind == "compact":
        return compact_system_prompt(space)
    if kind != "qwen_tools":
        raise ValueError(f"system prompt kind {kind!r}; expected one of {list(SYSTEM_PROMPTS)}")
    tool = json.dumps(tool_schema(space), ensure_ascii=False)
    return (f"{AGENT_INTRO}\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tool}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            f"{OPEN}{CLOSE} XML tags:\n{OPEN}\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n"
            f"{CLOSE}\n\n{RESPONSE_FORMAT}")


def compact_system_prompt(space: CoordinateSpace) -> str:
    """Returns the compact system prompt: the call format, each action with its required arguments and
    the coordinate rule in ~300 characters (instead of the ~1,900-token tool schema); for small models
    trained on the prompt, where every prompt token is paid for in every example."""
    actions = " ".join(f"{name}({','.join(ACTION_DOCS[name][1])})" for name in ACTION_NAMES)
    grid = ("0-1000 grid over the page" if space.kind == "relative"
            else f"pixels of the {space.width}x{space.height} screenshot")
    return (f"{COMPACT_INTRO}\n{OPEN}\n{{\"name\": \"{TOOL_NAME}\", \"arguments\": {{\"action\": ...}}}}\n{CLOSE}\n"
            f"Actions: {actions}\ncoordinate: [x, y], {grid}, [0,0] top-left.")


def action_summary(action_text: str) -> str:
    """Returns the tool call of an action text as the history shows it: its arguments JSON, tags removed."""
    body = action_text
    if OPEN in body:
        body = body.split(OPEN, 1)[1]
    body = body.split(CLOSE, 1)[0].strip()
    try:
        payload = json.loads(body)
    except ValueError:
        return body
    if isinstance(payload, dict) and isinstance(payload.get("arguments"), dict):
        return json.dumps(payload["arguments"], ensure_ascii=False)
    return body


class PromptBuilder:
    """Builds the chat messages of an agent step, its assistant target, and the reflection prompt."""

    def __init__(self, config: PromptConfig):
        self.config = config

    def messages(self, ctx: StepContext) -> list[dict[str, Any]]:
        """Returns [system, user] messages for one step: task, reflections, history, current screenshot."""
        obs = ctx.observation
        return [{"role": "system", "content": system_prompt(obs.coordinate_space, self.config.system)},
                {"role": "user", "content": self.user_content(ctx)}]

    def user_content(self, ctx: StepContext) -> list[dict[str, Any]]:
        """Returns the user turn's parts (text and PNG data-URL images), in reading order."""
        cfg, obs = self.config, ctx.observation
        instruction = ctx.instruction or obs.instruction
        parts: list[dict[str, Any]] = [_text(f"Task: {instruction}")]
        if ctx.reflections:
            lines = [REFLECTION_HEADER] + [f"Reflection {i}: {r.strip()}" for i, r in enumerate(ctx.reflections, 1)]
            parts.append(_text("\n".join(lines)))
        history = ctx.history[-cfg.history_steps:] if cfg.history_steps else ()
        if history:
            first = len(ctx.history) - len(history)  # index of the first shown step
            omitted = f" (steps 1-{first} omitted)" if first else ""
            parts.append(_text(f"Previous steps{omitted}:"))
            with_image = len(history) - cfg.history_images
            for k, step in enumerate(history):
                number = first + k + 1
                if k >= with_image:
                    parts.append(_text(f"Step {number} screenshot:"))
                    parts.append(image_url_part(step.screenshot))
                parts.append(_text(_step_text(number, step)))
        notes = _observation_notes(obs)
        page = (f"Current page: {shown_url(obs.url, cfg)}" + (f" ({obs.title})" if obs.title else "")
                + "".join(f"\n{n}" for n in notes))
        if cfg.shows_screenshot:
            parts.append(_text(page + "\nCurrent screenshot:"))
            parts.append(image_url_part(obs.screenshot))
        else:
            parts.append(_text(page))
        if cfg.shows_elements:
            parts.append(_text(self.element_list(obs)))
        parts.append(_text("What is the next action? Write a short thought, then one tool call."))
        return _end(parts)

    def element_list(self, obs: Observation) -> str:
        """Returns the page's elements (id, role, name, value, state, centre in the action's coordinates).

        The id is the element's number in the list (1, 2, ...), not Element.id: that is Chromium's DOM node id,
        which grows with every page the browser has loaded, so the same page would read differently in each
        browser, run and worker (and actions are coordinates: nothing refers to an id)."""
        cfg, space = self.config, obs.coordinate_space
        shown = shown_elements(obs)
        lines = []
        for number, e in enumerate(shown[:cfg.max_elements], 1):
            x, y = space.from_css(e.bbox.center, obs.viewport)
            name = shown_name(e.name, cfg)
            value = f" value={json.dumps(e.value, ensure_ascii=False)}" if e.value else ""
            state = "".join(f" {s}" for s in element_states(e, obs))
            lines.append(f"[{number}] {e.role} {json.dumps(name, ensure_ascii=False)}{value}{state} at [{x}, {y}]")
        more = f"\n({len(shown) - cfg.max_elements} more elements not listed)" if len(shown) > cfg.max_elements else ""
        header = "Page elements (id, role, name, value, state, centre coordinate):"
        return header + ("\n" + "\n".join(lines) if lines else "\n(none)") + more

    @staticmethod
    def target(thought: str, action_text: str) -> str:
        """Returns the assistant turn: the thought, then the tool call (what parse_action reads back).

        `action_text` is a tool call as `format_action` writes it (`<tool_call>...</tool_call>`).
        """
        call = action_text.strip()
        if not call.startswith(OPEN) or not call.endswith(CLOSE) or call.count(OPEN) != 1:
            raise ValueError(f"action_text must be exactly one {OPEN}...{CLOSE} tool call, got {call[:120]!r}")
        if OPEN in thought or CLOSE in thought:
            raise ValueError(f"thought must not contain a tool-call tag, got {thought[:120]!r}")
        thought = thought.strip()
        return f"{thought}\n{call}" if thought else call

    def reflection_messages(self, req: ReflectionRequest) -> list[dict[str, Any]]:
        """Returns [system, user] messages asking for a reflection on a failed attempt."""
        system = ("You review a web agent's failed attempt at a task. Find the step where it went wrong, say what "
                  "went wrong there and what the agent should do instead on its next attempt. Be concrete (name the "
                  "element, text or page) and brief: at most four sentences of plain text, no tool calls.")
        parts: list[dict[str, Any]] = [_text(f"Task: {req.instruction}\nAttempt: {req.attempt}")]
        if req.earlier_reflections:
            parts.append(_text("Reflections written after earlier attempts:\n" + "\n".join(
                f"Reflection {i}: {r.strip()}" for i, r in enumerate(req.earlier_reflections, 1))))
        if req.steps:
            parts.append(_text("Steps of this attempt:\n" + "\n".join(
                f"{_step_text(i, s)}\n  url: {shown_url(s.url, self.config)}" for i, s in enumerate(req.steps, 1))))
        else:
            parts.append(_text("Steps of this attempt: (none: the attempt ended before its first action)"))
        first_image = max(len(req.steps) - self.config.reflection_images, 0)
        for i, step in enumerate(req.steps[first_image:], first_image + 1):
            parts.append(_text(f"Screenshot before step {i}:"))
            parts.append(image_url_part(step.screenshot))
        parts.append(_text(f"Judge's verdict: {req.verdict}\nReason: {req.verdict_reason}\n\n"
                           "Write the reflection: which step went wrong, what went wrong, and what to do instead."))
        return [{"role": "system", "content": system}, {"role": "user", "content": _end(parts)}]


def shown_elements(obs: Observation) -> list[Element]:
    """Returns the elements the prompt's element list shows, in its order, before its cap of
    PromptConfig.max_elements: those that are interactive or named."""
    return [e for e in obs.elements if e.interactive or e.name.strip()]


def shown_name(name: str, config: PromptConfig) -> str:
    """Returns `name` as the element list prints it: cut to config.max_element_name characters, '...' marking a cut."""
    return name if len(name) <= config.max_element_name else name[:config.max_element_name - 3] + "..."


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def shown_url(url: str, config: PromptConfig) -> str:
    """Returns `url` as the prompt shows it: without the port of a URL on this machine unless config.local_ports.
    A local server's port is picked when it starts (MiniWoB++'s: a free one, another each run), so the same page
    would read differently in collection, training and each evaluation."""
    if config.local_ports or not url:
        return url
    parts = urllib.parse.urlsplit(url)
    if parts.hostname not in LOOPBACK_HOSTS or parts.port is None:
        return url
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = (parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else "") + host
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def element_states(element: Element, obs: Observation) -> tuple[str, ...]:
    """Returns the element's state words as the element list shows them: "focused" (the observation's
    focused element) and the accessibility states the element carries (checked, selected, expanded, ...)."""
    return (("focused",) if element.id == obs.focused_id else ()) + element.states


def _text(text: str) -> dict[str, str]:
    # The template joins parts with nothing in between; each text part ends its own line.
    return {"type": "text", "text": text + "\n"}


def _end(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Returns parts with the last text part's trailing newline removed (the turn ends there)."""
    parts[-1] = {"type": "text", "text": parts[-1]["text"].rstrip("\n")}
    return parts


def _step_text(number: int, step: PastStep) -> str:
    thought = " ".join(step.thought.split()) or "(none)"
    return f"Step {number}: thought: {thought}\n  action: {action_summary(step.action_text)}"


def _observation_notes(obs: Observation) -> list[str]:
    """Returns lines about what happened since the last observation (a failed action, dialogs, popups)."""
    notes = []
    if obs.last_error:
        notes.append(f"The last action failed: {obs.last_error}")
    if obs.dialogs:
        notes.append("Dialogs were dismissed: " + "; ".join(obs.dialogs))
    if obs.blocked_urls:
        notes.append("Requests outside the task's sites were blocked: " + ", ".join(obs.blocked_urls[:5]))
    if obs.popups:
        notes.append("A popup opened and is now the active page: " + ", ".join(obs.popups[:3]))
    if obs.refused_downloads:
        notes.append("Downloads were refused: " + ", ".join(obs.refused_downloads[:3]))
    return notes
