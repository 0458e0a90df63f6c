"""Our policies inside BrowserGym / AgentLab (the optional extra "browsergym").

    policy = FlaxPolicy(...) or HttpPolicy(...)          # or the ScriptedTeacher, any agents.policy.Policy
    agent = BrowserGymAgent(policy)
    env = gym.make("browsergym/workarena...", action_mapping=agent.action_set.to_python_code)
    obs, info = env.reset(seed=0)
    while True:
        action, agent_info = agent.get_action(agent.obs_preprocessor(obs))
        if action is None:                                # the policy answered on the previous step
            break
        obs, reward, terminated, truncated, info = env.step(action)

AgentLab / browsergym.experiments build the agent from BrowserGymAgentArgs (`make_agent()`) and run that loop
themselves (they stop at a None action as well).

Observations. A BrowserGym observation carries the page's accessibility tree (`axtree_object`, Chromium's
Accessibility.getFullAXTree), its DOM snapshot with layout boxes (`dom_object`, DOMSnapshot.captureSnapshot) and a
screenshot (an RGB array, captured at the task's zoom: MiniWoB++ 1.5x). They become our Observation through the very
function our own browser workers use (web/ax_tree.py elements_from_cdp), so a policy sees the same element list, in
the same CSS-pixel boxes, as in our environment; the screenshot goes in as PNG. The zoom is read off the observation
itself: BrowserGym's `extra_element_properties` boxes are the layout boxes times the zoom.

Actions. Our actions (Qwen's 0-1000 grid) map to BrowserGym's coordinate action set (HighLevelActionSet subsets
"coord", "chat", "nav"; screenshot pixels, which BrowserGym divides by the zoom): left_click -> mouse_click,
double_click -> mouse_dblclick, hover -> mouse_move, type -> [mouse_click] [Control+a, Backspace] keyboard_type
[Enter] (several lines: the set is built with multiaction), key -> keyboard_press, scroll -> scroll_at, go_back ->
go_back, navigate -> goto, wait -> noop, answer -> send_msg_to_user. After an answer the agent returns None: the
episode is over for the policy (WebArena reads the answer from the chat; MiniWoB++ scores the page as it stands).

Browsers. BrowserGym launches its Chromiums itself (the task's page and the chat window) through one global
Playwright; `use_system_chromium()` installs ours there, whose chromium.launch() starts Debian's Chromium
(web/browser.py find_chromium: $RMSWEB_CHROMIUM or /usr/bin/chromium) with our flags, never a downloaded browser.
It also mends BrowserGym's screenshot on the new headless Chromium, which left the page with a viewport shorter
by the toolbar (keep_viewport_after_screenshot).

browsergym-core 0.14.3 requires playwright==1.44; we pin 1.65.2 and install it without its dependencies (setup.py's
"browsergym" extra, BUILD.md). Its observation and action code runs on 1.65.2 (tests/agents/test_browsergym_agent.py).
"""
from __future__ import annotations

import dataclasses
import io
import statistics
from typing import Any, Callable, Mapping

try:  # the optional extra
    import browsergym.core.env as browsergym_env
    import playwright.sync_api
    from browsergym.core import _set_global_playwright
    from browsergym.core.action.highlevel import HighLevelActionSet
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("rmsweb_jax.agents.browsergym_agent needs BrowserGym: pip install --no-deps -c constraints.txt "
                      "browsergym-core browsergym-miniwob beautifulsoup4 soupsieve pyparsing (setup.py's "
                      "'browsergym' extra; --no-deps because browsergym-core pins playwright==1.44)") from e
from PIL import Image

from rmsweb_jax.agents.policy import PastStep, Policy, PolicyOutput, StepContext
from rmsweb_jax.web.action_text import format_action
from rmsweb_jax.web.actions import Action
from rmsweb_jax.web.ax_tree import elements_from_cdp, layout_boxes
from rmsweb_jax.web.browser import CHROMIUM_FLAGS, find_chromium
from rmsweb_jax.web.normalize import key_combo
from rmsweb_jax.web.observation import Observation

ACTION_SUBSETS = ("coord", "chat", "nav")


def browsergym_action_set() -> HighLevelActionSet:
    """Returns the action set our actions map into: coordinates, the chat, navigation; several lines per step."""
    return HighLevelActionSet(subsets=list(ACTION_SUBSETS), multiaction=True, strict=False)


@dataclasses.dataclass(frozen=True)
class BrowserGymView:
    """One BrowserGym observation as our policies see it: the Observation, and the zoom (screenshot pixels per CSS
    pixel) that BrowserGym's coordinate actions divide by."""

    observation: Observation
    zoom: float


def screenshot_zoom(obs: Mapping[str, Any]) -> float:
    """Returns the screenshot's pixels per CSS pixel of a BrowserGym observation: the median ratio of an element's
    `extra_element_properties` box (zoomed) to its layout box in the DOM snapshot; 1.0 when no element has both."""
    boxes = layout_boxes(obs["dom_object"])
    extra = obs.get("extra_element_properties") or {}
    ratios = []
    for node in obs["axtree_object"]["nodes"]:
        bid, backend = node.get("browsergym_id"), node.get("backendDOMNodeId")
        zoomed = (extra.get(bid) or {}).get("bbox") if bid is not None else None
        if zoomed and backend in boxes and boxes[backend][0].width >= 4:
            ratios.append(zoomed[2] / boxes[backend][0].width)
    return statistics.median(ratios) if ratios else 1.0


def observation_from_browsergym(obs: Mapping[str, Any], *, step: int = 0) -> BrowserGymView:
    """Returns our Observation of a BrowserGym observation (its goal as the instruction, its screenshot as PNG, the
    element list our workers would read) and its zoom. Raises KeyError naming a missing observation key: the agent
    needs the raw `axtree_object` and `dom_object` (BrowserGymAgent.obs_preprocessor keeps them)."""
    for key in ("screenshot", "axtree_object", "dom_object", "url"):
        if key not in obs:
            raise KeyError(f"BrowserGym observation without {key!r} (keys: {sorted(obs)}); our agent needs the raw "
                           "observation: use BrowserGymAgent.obs_preprocessor, not BrowserGym's default one")
    pixels = Image.fromarray(obs["screenshot"])
    png = io.BytesIO()
    pixels.save(png, format="PNG")
    zoom = screenshot_zoom(obs)
    viewport = (round(pixels.width / zoom), round(pixels.height / zoom))
    elements, focused = elements_from_cdp(obs["axtree_object"]["nodes"], obs["dom_object"], viewport)
    titles, active = obs.get("open_pages_titles") or ("",), obs.get("active_page_index")
    title = titles[int(active[0])] if active is not None and len(titles) > int(active[0]) else titles[0]
    return BrowserGymView(Observation(
        url=obs["url"], title=str(title), screenshot=png.getvalue(), viewport=viewport,
        screenshot_size=(pixels.width, pixels.height), elements=elements, focused_id=focused,
        instruction=goal_text(obs), step=step, last_error=obs.get("last_action_error") or None,
        coordinates="relative"), zoom)


def goal_text(obs: Mapping[str, Any]) -> str:
    """Returns the task's instruction: the text parts of BrowserGym's `goal_object` (its legacy `goal` otherwise)."""
    parts = [m["text"] for m in obs.get("goal_object") or () if m.get("type") == "text"]
    return "\n".join(parts) if parts else str(obs.get("goal") or "")


def browsergym_action(action: Action, view: BrowserGymView) -> str:
    """Returns BrowserGym code (the coordinate action set, one call per line) doing what `action` does in our
    environment (web/action_executor.py) on the observation `view`."""
    obs, zoom = view.observation, view.zoom

    def point(coordinate) -> tuple[float, float]:  # screenshot pixels: BrowserGym divides by the zoom
        x, y = obs.coordinate_space.to_css(coordinate, obs.viewport)
        return round(x * zoom, 2), round(y * zoom, 2)

    name = action.name
    if name in ("left_click", "double_click", "hover"):
        call = {"left_click": "mouse_click", "double_click": "mouse_dblclick", "hover": "mouse_move"}[name]
        return f"{call}({', '.join(map(repr, point(action.coordinate)))})"
    if name == "type":
        lines = [] if action.coordinate is None else [f"mouse_click({', '.join(map(repr, point(action.coordinate)))})"]
        if action.clear:
            lines += ["keyboard_press('Control+a')", "keyboard_press('Backspace')"]
        if action.text:
            lines.append(f"keyboard_type({action.text!r})")
        if action.press_enter:
            lines.append("keyboard_press('Enter')")
        return "\n".join(lines) or "noop(0)"
    if name == "key":
        return f"keyboard_press({key_combo(action.keys)!r})"
    if name == "scroll":
        x, y = point(action.coordinate) if action.coordinate is not None else (
            round(obs.viewport[0] / 2 * zoom, 2), round(obs.viewport[1] / 2 * zoom, 2))
        step = round(float(action.amount) * zoom, 2)
        dx, dy = {"up": (0, -step), "down": (0, step), "left": (-step, 0), "right": (step, 0)}[action.direction]
        return f"scroll_at({x!r}, {y!r}, {dx!r}, {dy!r})"
    if name == "go_back":
        return "go_back()"
    if name == "navigate":
        url = action.url.strip()
        if "://" not in url and not url.startswith(("about:", "data:")):
            url = "https://" + url
        return f"goto({url!r})"
    if name == "wait":
        return f"noop({round(1000 * (1.0 if action.seconds is None else action.seconds))})"
    if name == "answer":
        return f"send_msg_to_user({action.text!r})"
    raise ValueError(f"no BrowserGym action for our action {name!r}")  # Action validates names: a new action


class BrowserGymAgent:
    """A BrowserGym / AgentLab agent over one of our policies (FlaxPolicy, HttpPolicy, the ScriptedTeacher).

    Each get_action asks `policy.act` for one StepContext: our Observation of the page, the instruction, the
    episode's earlier steps (screenshot, URL, thought, action text). `task_id` is StepContext.task_id (only the
    scripted teacher reads it, to pick its solver); `episode_id` keys the contexts ("<episode_id>/<step>").
    An unparseable turn is played as noop() (as our collector plays a 0 s wait) and shown in agent_info.
    The agent plays one episode; `begin_episode` starts another with the same policy.
    """

    def __init__(self, policy: Policy, *, task_id: str = "", episode_id: str = "browsergym@1"):
        self.policy = policy
        self.action_set = browsergym_action_set()
        self.begin_episode(task_id, episode_id)

    def begin_episode(self, task_id: str, episode_id: str) -> None:
        """Forgets the episode so far; the next get_action is step 0 of `episode_id`."""
        self.task_id, self.episode_id = task_id, episode_id
        self.history: list[PastStep] = []
        self.outputs: list[PolicyOutput] = []
        self.last_view: BrowserGymView | None = None  # the observation the last action was chosen on
        self.finished = False

    def obs_preprocessor(self, obs: dict) -> dict:
        """Returns `obs` as it is: the agent reads the raw accessibility tree and DOM snapshot."""
        return obs

    def get_action(self, obs: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
        """Returns (BrowserGym action code, agent info: think, stats, extra_info); (None, ...) once the policy has
        answered, which ends the episode in BrowserGym's and AgentLab's loops."""
        if self.finished:
            return None, {"think": "", "stats": {}, "extra_info": {"reason": "the policy answered"}}
        step = len(self.history)
        view = self.last_view = observation_from_browsergym(obs, step=step)
        ctx = StepContext(task_id=self.task_id, instruction=view.observation.instruction, observation=view.observation,
                          history=tuple(self.history), step=step, key=f"{self.episode_id}/{step}")
        output = self.policy.act([ctx])[0]
        self.outputs.append(output)
        action = output.action
        code = "noop(0)" if action is None else browsergym_action(action, view)
        self.history.append(PastStep(screenshot=view.observation.screenshot, url=view.observation.url,
                                     thought=output.thought,
                                     action_text=output.text if action is None else format_action(action)))
        self.finished = action is not None and action.name == "answer"
        return code, {"think": output.thought, "stats": {"prompt_tokens": output.prompt_tokens,
                                                          "completion_tokens": output.completion_tokens},
                      "extra_info": {"text": output.text, "error": output.error, "label": output.label,
                                     "action": None if action is None else action.to_dict(), "zoom": view.zoom}}


@dataclasses.dataclass
class BrowserGymAgentArgs:
    """AgentLab's agent arguments (its AbstractAgentArgs shape): `policy_factory()` builds the policy in the
    experiment's process (a module-level function or functools.partial, so AgentLab can pickle it)."""

    policy_factory: Callable[[], Policy]
    task_id: str = ""
    agent_name: str = "rmsweb"
    policies: list = dataclasses.field(default_factory=list, repr=False)  # made by make_agent, closed by close

    def prepare(self) -> None:
        """Nothing to prepare: the policy is built by make_agent."""

    def close(self) -> None:
        """Closes every policy make_agent built (AgentLab calls it after the experiment)."""
        policies, self.policies = self.policies, []
        for policy in policies:
            policy.close()

    def make_agent(self) -> BrowserGymAgent:
        """Returns a fresh agent over a fresh policy."""
        self.policies.append(self.policy_factory())
        return BrowserGymAgent(self.policies[-1], task_id=self.task_id)


class _SystemChromium:
    """A Playwright BrowserType whose launch() runs Debian's Chromium with our flags (else: the wrapped one)."""

    def __init__(self, browser_type, executable: str):
        self._browser_type, self._executable = browser_type, executable

    def __getattr__(self, name):
        return getattr(self._browser_type, name)

    def launch(self, **kwargs):
        kwargs.setdefault("executable_path", self._executable)
        kwargs["args"] = [*CHROMIUM_FLAGS, *(kwargs.get("args") or ())]
        return self._browser_type.launch(**kwargs)


class _SystemPlaywright:
    def __init__(self, playwright, executable: str):
        self._playwright = playwright
        self.chromium = _SystemChromium(playwright.chromium, executable)

    def __getattr__(self, name):
        return getattr(self._playwright, name)


def use_system_chromium(executable: str | None = None):
    """Starts a (sync) Playwright and makes it BrowserGym's global one, launching Debian's Chromium (`executable`,
    $RMSWEB_CHROMIUM or /usr/bin/chromium: web/browser.py find_chromium) with our flags for every browser BrowserGym
    opens, the task page's and the chat's; and has BrowserGym's screenshots keep the page's viewport
    (keep_viewport_after_screenshot). Returns the Playwright: `.stop()` it when done. Call it before the first
    env.reset(), in the thread that steps the environments."""
    binary = find_chromium(executable)
    driver = playwright.sync_api.sync_playwright().start()
    _set_global_playwright(_SystemPlaywright(driver, binary))
    if not getattr(browsergym_env.extract_screenshot, "keeps_viewport", False):
        browsergym_env.extract_screenshot = keep_viewport_after_screenshot(browsergym_env.extract_screenshot)
    return driver


def keep_viewport_after_screenshot(extract_screenshot):
    """Returns BrowserGym's `extract_screenshot(page)` followed by putting the page's viewport back.

    BrowserGym 0.14.3 zooms the page for its screenshot through a CDP session of its own and detaches it; on the
    new headless Chromium (Debian's 156; Playwright 1.44's headless shell had no window frame) the page then falls
    back to its window's inner size, the viewport less the toolbar (MiniWoB++: 332x127 instead of 332x214), and
    clicks below that land nowhere. The fall-back reaches the page some time after the detach returns, so checking
    the page's size at once can miss it (a test saw 332x214 there, then 332x127 at the next click): a resize
    through Playwright after every screenshot puts its viewport back, queued after the detach on the browser's
    connection."""
    def screenshot(page):
        image = extract_screenshot(page)
        size = page.viewport_size
        if size is not None:
            page.set_viewport_size({"width": size["width"] + 1, "height": size["height"]})  # the same size is a no-op
            page.set_viewport_size(size)
        return image

    screenshot.keeps_viewport = True
    return screenshot
