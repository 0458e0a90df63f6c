"""Returns scripted plans for MiniWoB++ tasks, read off what a model would see (part of the
ScriptedTeacher, a stand-in for an LLM collector — not a result).

A plan is a tuple of Moves made from the instruction and the first observation. Each Move names
its target by role and accessible name (or visual order), not by coordinates, and is resolved
against the *current* observation when it is carried out, so moving elements are found where
they are. Solved task types (SOLVED_TASKS; without injected mistakes each one scored reward 1.0
on every one of seeds 0-99 in a sweep through WorkerPool + MiniWoBSuite; tests/agents/
test_teacher.py checks two more seeds of each):

    click-button, click-button-sequence, click-checkboxes, click-checkboxes-large,
    click-collapsible-nodelay, click-dialog, click-dialog-2, click-link, click-option,
    click-tab, click-test, click-test-2, choose-list, enter-date, enter-password, enter-text,
    enter-text-2, enter-time, focus-text, focus-text-2, login-user, simple-arithmetic,
    unicode-test
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Callable

from rmsweb_jax.web.actions import Action
from rmsweb_jax.web.elements import Element, element_at
from rmsweb_jax.web.observation import Observation


class SolverError(LookupError):
    """A plan cannot be made or a move cannot be resolved on the observation at hand."""


@dataclasses.dataclass(frozen=True)
class Target:
    """Which element a move acts on: `role` and exact accessible `name` (None: any name), the
    `index`-th match in reading order (top to bottom, left to right). `where` is "center", or
    "left" for date/time inputs whose first segment must take the typing.

    `alternatives` says which other elements a careless agent could take for this one: "role"
    (same role, another name), "words" (another one-word text: MiniWoB's links) or "none".
    """

    role: str
    name: str | None = None
    index: int = 0
    where: str = "center"
    alternatives: str = "role"
    label: str = ""  # how the thought refers to it, e.g. 'the "OK" button'


@dataclasses.dataclass(frozen=True)
class Move:
    """One step of a plan: click the target, or type `text` into it (clicking it first)."""

    kind: str
    target: Target
    text: str | None = None

    @property
    def goal(self) -> str:
        """Returns what the move does, as a phrase ('click the "OK" button')."""
        label = self.target.label or f"the {self.target.role}"
        return f"click {label}" if self.kind == "click" else f'type "{self.text}" into {label}'


def _click(role: str, name: str | None = None, index: int = 0, *, label: str = "", alternatives: str = "role") -> Move:
    label = label or (f'the "{name}" {role}' if name is not None else f"the {role}")
    return Move("click", Target(role, name, index, alternatives=alternatives, label=label))


def _type(text: str, role: str = "textbox", index: int = 0, *, label: str = "", where: str = "center",
          alternatives: str = "role") -> Move:
    return Move("type", Target(role, None, index, where, alternatives, label or f"the {role}"), text)


def _quoted(instruction: str, count: int = 1) -> list[str]:
    found = re.findall(r'"([^"]*)"', instruction)
    if len(found) < count:
        raise SolverError(f"instruction {instruction!r}: expected {count} quoted value(s), found {found}")
    return found


def _match(pattern: str, instruction: str) -> re.Match:
    m = re.search(pattern, instruction)
    if m is None:
        raise SolverError(f"instruction {instruction!r} does not match {pattern!r}")
    return m


def _submit(name: str = "Submit") -> Move:
    return _click("button", name, label=f'the "{name}" button', alternatives="none")


def _select_names(instruction: str) -> list[str]:
    wanted = _match(r"^Select (.*) and click Submit\.$", instruction).group(1)
    return [] if wanted == "nothing" else [n.strip() for n in wanted.split(",")]


# --- planners: (instruction, first observation) -> moves --------------------------------------
def _click_quoted_button(instruction: str, obs: Observation) -> tuple[Move, ...]:
    return (_click("button", _quoted(instruction)[0]),)


def _click_button_sequence(instruction: str, obs: Observation) -> tuple[Move, ...]:
    first, second = _match(r"Click button (\S+), then click button (\S+)\.", instruction).groups()
    return (_click("button", first, label=f'button {first}'), _click("button", second, label=f'button {second}'))


def _click_test_2(instruction: str, obs: Observation) -> tuple[Move, ...]:
    name = _match(r"Click button (\S+)\.", instruction).group(1)
    return (_click("button", name, label=f"button {name}"),)


def _click_link(instruction: str, obs: Observation) -> tuple[Move, ...]:
    # MiniWoB's links are spans: the accessibility tree shows them as one-word StaticText.
    word = _quoted(instruction)[0]
    return (_click("StaticText", word, label=f'the link "{word}"', alternatives="words"),)


def _click_dialog(instruction: str, obs: Observation) -> tuple[Move, ...]:
    return (_click("button", "Close", label='the dialog\'s "x" (Close) button', alternatives="none"),)


def _click_dialog_2(instruction: str, obs: Observation) -> tuple[Move, ...]:
    name = _quoted(instruction)[0]
    name = "Close" if name == "x" else name
    return (_click("button", name, label=f'the "{name}" button in the dialog'),)


def _click_tab(instruction: str, obs: Observation) -> tuple[Move, ...]:
    number = _match(r"Tab #(\d+)", instruction).group(1)
    return (_click("tab", f"Tab #{number}"),)


def _click_test(instruction: str, obs: Observation) -> tuple[Move, ...]:
    return (_click("button", "Click Me!", label='the "Click Me!" button', alternatives="none"),)


def _click_checkboxes(instruction: str, obs: Observation) -> tuple[Move, ...]:
    return tuple(_click("checkbox", n) for n in _select_names(instruction)) + (_submit(),)


def _click_option(instruction: str, obs: Observation) -> tuple[Move, ...]:
    names = _select_names(instruction)
    if len(names) != 1:
        raise SolverError(f"instruction {instruction!r}: expected one option to select, got {names}")
    return (_click("radio", names[0], label=f'the "{names[0]}" option'), _submit())


def _click_collapsible(instruction: str, obs: Observation) -> tuple[Move, ...]:
    headers = [e for e in obs.elements if e.role == "tab" and e.name.strip().startswith("Section")]
    if not headers:
        raise SolverError(f"no section header (tab 'Section #n') among {_roles(obs)}")
    name = headers[0].name.strip()
    return (_click("tab", name, label=f'the section header "{name}"', alternatives="none"), _submit())


def _choose_list(instruction: str, obs: Observation) -> tuple[Move, ...]:
    item = _match(r"^Select (.*) from the list and click Submit\.$", instruction).group(1)
    # Typing into a focused <select> picks the option by its label; Enter closes the list.
    move = _type(item, "combobox", label="the list", alternatives="none")
    return (dataclasses.replace(move, kind="select"), _submit())


def _enter_text(instruction: str, obs: Observation) -> tuple[Move, ...]:
    return (_type(_quoted(instruction)[0], label="the text field", alternatives="none"), _submit())


def _enter_text_2(instruction: str, obs: Observation) -> tuple[Move, ...]:
    m = _match(r'Type "(.*)" in all (upper|lower) case letters', instruction)
    text = m.group(1).upper() if m.group(2) == "upper" else m.group(1).lower()
    return (_type(text, label="the text field", alternatives="none"), _submit())


def _enter_password(instruction: str, obs: Observation) -> tuple[Move, ...]:
    password = _quoted(instruction)[0]
    return (_type(password, index=0, label="the Password field"),
            _type(password, index=1, label="the Verify password field"), _submit())


def _login_user(instruction: str, obs: Observation) -> tuple[Move, ...]:
    user, password = _quoted(instruction, 2)[:2]
    return (_type(user, index=0, label="the Username field"), _type(password, index=1, label="the Password field"),
            _submit("Login"))


def _focus_text(instruction: str, obs: Observation) -> tuple[Move, ...]:
    return (_click("textbox", label="the text box", alternatives="none"),)


def _focus_text_2(instruction: str, obs: Observation) -> tuple[Move, ...]:
    ordinal = _match(r"Focus into the (\d)(?:st|nd|rd|th) input textbox", instruction).group(1)
    return (_click("textbox", index=int(ordinal) - 1, label=f"text box number {ordinal} from the top"),)


def _enter_date(instruction: str, obs: Observation) -> tuple[Move, ...]:
    date = _match(r"(\d\d/\d\d/\d{4})", instruction).group(1)
    return (_type(date, "Date", where="left", label="the date field", alternatives="none"), _submit())


def _enter_time(instruction: str, obs: Observation) -> tuple[Move, ...]:
    hour, minute, half = _match(r"(\d{1,2}):(\d\d) ([AP]M)", instruction).groups()
    # Chromium's time input takes "hhmm" then the first letter of AM / PM.
    return (_type(f"{int(hour):02d}{minute}{half[0]}", "InputTime", where="left", label="the time field",
                  alternatives="none"), _submit())


def _simple_arithmetic(instruction: str, obs: Observation) -> tuple[Move, ...]:
    for e in obs.elements:
        m = re.fullmatch(r"\s*(-?\d+)\s*([-+x])\s*(-?\d+)\s*=\s*", e.name)
        if m:
            a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
            value = a + b if op == "+" else a - b if op == "-" else a * b
            return (_type(str(value), label="the answer box", alternatives="none"), _submit())
    raise SolverError(f"no 'a + b =' problem among {_roles(obs)}")


PLANNERS: dict[str, Callable[[str, Observation], tuple[Move, ...]]] = {
    "miniwob.click-button": _click_quoted_button, "miniwob.click-button-sequence": _click_button_sequence,
    "miniwob.click-checkboxes": _click_checkboxes, "miniwob.click-checkboxes-large": _click_checkboxes,
    "miniwob.click-collapsible-nodelay": _click_collapsible, "miniwob.click-dialog": _click_dialog,
    "miniwob.click-dialog-2": _click_dialog_2, "miniwob.click-link": _click_link, "miniwob.click-option": _click_option,
    "miniwob.click-tab": _click_tab, "miniwob.click-test": _click_test, "miniwob.click-test-2": _click_test_2,
    "miniwob.choose-list": _choose_list, "miniwob.enter-date": _enter_date, "miniwob.enter-password": _enter_password,
    "miniwob.enter-text": _enter_text, "miniwob.enter-text-2": _enter_text_2, "miniwob.enter-time": _enter_time,
    "miniwob.focus-text": _focus_text, "miniwob.focus-text-2": _focus_text_2, "miniwob.login-user": _login_user,
    "miniwob.simple-arithmetic": _simple_arithmetic, "miniwob.unicode-test": _click_quoted_button,
}
SOLVED_TASKS: tuple[str, ...] = tuple(sorted(PLANNERS))


def plan(task_id: str, instruction: str, observation: Observation) -> tuple[Move, ...]:
    """Returns the moves that solve `task_id`; raises KeyError for a task without a planner and
    SolverError when the instruction or page is not what the planner expects."""
    if task_id not in PLANNERS:
        raise KeyError(f"no scripted solver for task {task_id!r}; solved tasks: {list(SOLVED_TASKS)}")
    return PLANNERS[task_id](instruction, observation)


# --- resolving moves on an observation --------------------------------------------------------
def reading_order(elements: list[Element]) -> list[Element]:
    """Returns `elements` top to bottom, then left to right (how a reader counts "the 2nd box")."""
    return sorted(elements, key=lambda e: (round(e.bbox.y), e.bbox.x))


def resolve(target: Target, obs: Observation) -> Element:
    """Returns the element `target` names on `obs`; raises SolverError naming what is there."""
    hits = reading_order([e for e in obs.elements if e.role == target.role
                           and (target.name is None or e.name.strip() == target.name)])
    if len(hits) <= target.index:
        raise SolverError(f"no {target.role} {target.name!r} (#{target.index + 1}) on {obs.url}; "
                          f"elements: {_roles(obs)}")
    return hits[target.index]


def alternatives(target: Target, obs: Observation) -> list[Element]:
    """Returns the elements a careless agent could take for `target` (same role, another name or
    place; for "words", other one-word texts), in reading order."""
    if target.alternatives == "none":
        return []
    wanted = resolve(target, obs)
    if target.alternatives == "words":
        pool = [e for e in obs.elements if e.role == target.role and re.fullmatch(r"\w+", e.name.strip())]
    else:
        pool = [e for e in obs.elements if e.role == target.role]
    return reading_order([e for e in pool if e.id != wanted.id and e.bbox.area > 0
                           and (target.name is None or e.name.strip() != target.name)])


def point_on(element: Element, obs: Observation, where: str = "center") -> tuple[float, float]:
    """Returns a CSS point inside `element` where a click reaches it, well clear of any element
    painted over it: the centre when a few pixels around it are free, else the free point of a
    ~2 px grid farthest from covered points and from the element's edges."""
    b = element.bbox
    if where == "left":
        return (b.x + min(8.0, b.width / 2), b.y + b.height / 2)

    def reaches(x: float, y: float) -> bool:
        hit = element_at(obs.elements, x, y)
        return hit is not None and (hit.id == element.id or hit.owner == element.id or hit.id == element.owner)

    cx, cy = b.center
    r = min(4.0, b.width / 4, b.height / 4)
    if all(reaches(cx + dx * r, cy + dy * r) for dx in (-1, 0, 1) for dy in (-1, 0, 1)):
        return (cx, cy)
    # Overlapping controls (click-button-sequence puts buttons at random places): a point a
    # rounding step from the covering box can land on it, so maximise the clearance.
    nx, ny = (min(24, max(4, math.ceil(size / 2))) for size in (b.width, b.height))
    grid = [(b.x + b.width * (i + 0.5) / nx, b.y + b.height * (j + 0.5) / ny) for j in range(ny) for i in range(nx)]
    free = [p for p in grid if reaches(*p)]
    covered = [p for p in grid if not reaches(*p)]
    if not free:
        return (cx, cy)

    def clearance(p: tuple[float, float]) -> float:
        edge = min(p[0] - b.x, b.x + b.width - p[0], p[1] - b.y, b.y + b.height - p[1])
        return min([edge] + [math.dist(p, q) for q in covered])

    return max(free, key=clearance)


def coordinate(point: tuple[float, float], obs: Observation) -> tuple[int, int]:
    """Returns the action coordinate for a CSS point in `obs`'s coordinate space, the point first
    moved inside the viewport (an element partly off screen still gets a valid coordinate)."""
    vw, vh = obs.viewport
    inside = (min(max(point[0], 0.0), vw - 1.0), min(max(point[1], 0.0), vh - 1.0))
    return obs.coordinate_space.from_css(inside, obs.viewport)


def action_for(move: Move, element: Element, obs: Observation) -> Action:
    """Returns the Action carrying out `move` on `element`, in `obs`'s coordinate space."""
    point = coordinate(point_on(element, obs, move.target.where), obs)
    if move.kind == "click":
        return Action.click(*point)
    return Action.type_text(move.text or "", coordinate=point, press_enter=move.kind == "select")


def _roles(obs: Observation) -> list[tuple[str, str]]:
    return [(e.role, e.name[:30]) for e in obs.elements][:20]
