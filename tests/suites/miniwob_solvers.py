"""Scripted solutions for a handful of simple MiniWoB++ tasks, read off the first observation.

Each planner turns (instruction, element list) into the full action sequence; a policy replays
it step by step. They use only what the agent sees (instruction and elements), as a model would.
"""
import re

from rmsweb_jax.web.actions import RELATIVE, Action
from rmsweb_jax.web.elements import Element


def quoted(text: str) -> list[str]:
    return re.findall(r'"([^"]*)"', text)


def element(obs, role: str, name: str | None = None, index: int = 0) -> Element:
    hits = [e for e in obs.elements if e.role == role and (name is None or e.name.strip() == name)]
    if len(hits) <= index:
        raise LookupError(f"no {role} {name!r} (#{index}) in {[(e.role, e.name) for e in obs.elements]}")
    return hits[index]


def click(obs, el: Element, dx: float = 0.0, dy: float = 0.0) -> Action:
    x, y = el.bbox.center
    return Action.click(*RELATIVE.from_css((x + dx, y + dy), obs.viewport))


def _click_button(obs):
    return [click(obs, element(obs, "button", quoted(obs.instruction)[0]))]


def _click_link(obs):
    want = quoted(obs.instruction)[0]
    return [click(obs, next(e for e in obs.elements if e.role in ("StaticText", "link") and e.name.strip() == want))]


def _enter_text(obs):
    return [click(obs, element(obs, "textbox")), Action.type_text(quoted(obs.instruction)[0]),
            click(obs, element(obs, "button", "Submit"))]


def _click_checkboxes(obs):
    wanted = re.match(r"Select (.*) and click Submit\.", obs.instruction).group(1)
    names = [] if wanted == "nothing" else [n.strip() for n in wanted.split(",")]
    return [click(obs, element(obs, "checkbox", n)) for n in names] + [click(obs, element(obs, "button", "Submit"))]


def _focus_text(obs):
    return [click(obs, element(obs, "textbox"))]


def _login_user(obs):
    user, password = quoted(obs.instruction)[:2]
    return [click(obs, element(obs, "textbox", index=0)), Action.type_text(user),
            click(obs, element(obs, "textbox", index=1)), Action.type_text(password),
            click(obs, element(obs, "button", "Login"))]


def _click_dialog(obs):
    return [click(obs, element(obs, "button", "Close"))]


def _click_tab(obs):
    number = re.search(r"Tab #(\d+)", obs.instruction).group(1)
    return [click(obs, element(obs, "tab", f"Tab #{number}"))]


def _click_option(obs):
    want = re.match(r"Select (.*) and click Submit\.", obs.instruction).group(1)
    return [click(obs, element(obs, "radio", want)), click(obs, element(obs, "button", "Submit"))]


def _enter_password(obs):
    password = quoted(obs.instruction)[0]
    return [click(obs, element(obs, "textbox", index=0)), Action.type_text(password),
            click(obs, element(obs, "textbox", index=1)), Action.type_text(password),
            click(obs, element(obs, "button", "Submit"))]


PLANNERS = {
    "miniwob.click-button": _click_button, "miniwob.click-link": _click_link, "miniwob.enter-text": _enter_text,
    "miniwob.click-checkboxes": _click_checkboxes, "miniwob.focus-text": _focus_text,
    "miniwob.login-user": _login_user, "miniwob.click-dialog": _click_dialog, "miniwob.click-tab": _click_tab,
    "miniwob.click-option": _click_option, "miniwob.enter-password": _enter_password,
}


def plan(task_id: str, obs) -> list[Action]:
    """Returns the action sequence that solves `task_id` from its first observation."""
    return PLANNERS[task_id](obs)


def solving_policy(history) -> Action:
    """A pool policy replaying the plan made on the episode's first observation."""
    actions = plan(history.request.task.id, history.observations[0])
    return actions[len(history.actions)]


def wrong_click(task_id: str, obs) -> Action:
    """Returns a click on a control the instruction did not ask for (click-button, click-tab)."""
    if task_id == "miniwob.click-button":
        want = quoted(obs.instruction)[0]
        return click(obs, next(e for e in obs.elements if e.role == "button" and e.name != want))
    if task_id == "miniwob.click-tab":
        number = re.search(r"Tab #(\d+)", obs.instruction).group(1)
        want = f"Tab #{number}"
        return click(obs, next(e for e in obs.elements if e.role == "tab" and e.name != want))
    raise KeyError(task_id)
