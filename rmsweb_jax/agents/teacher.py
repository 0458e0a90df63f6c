"""ScriptedTeacher: a scripted stand-in for an LLM collector on MiniWoB++ — not a result.

It lets the whole RMSWeb recipe (collection with reflection-conditioned retries, the trajectory
store, SFT export) run offline on two CPU cores. Its success rates say nothing about any model.

It sees only what a model would see (the instruction, the observation's elements, its own
earlier steps and the reflections in context; the task id only picks the solver) and plans with
rmsweb_jax.agents.miniwob_solvers. SOLVED_TASKS, 23 MiniWoB++ task types:

    click-button, click-button-sequence, click-checkboxes, click-checkboxes-large,
    click-collapsible-nodelay, click-dialog, click-dialog-2, click-link, click-option,
    click-tab, click-test, click-test-2, choose-list, enter-date, enter-password, enter-text,
    enter-text-2, enter-time, focus-text, focus-text-2, login-user, simple-arithmetic,
    unicode-test

On a task without a solver it does not raise: it answers at once with a thought saying so
(MiniWoB scores that as a failure) and counts it in stats()["unsupported"]; pass `tasks=` to the
constructor to have unsupported tasks rejected up front instead.

Injected mistakes (MistakeConfig) are drawn per (task id, episode seed, draw, step), where the
draw is StepContext.draw: 1 on attempt 1 and on every reflection-conditioned retry, so such a
retry repeats attempt 1's mistakes unless a reflection in its context names the step and kind
("Step 2 (wrong element): ..."). The teacher's own reflect() writes exactly such text, so a
retry with reflections avoids them and drops the detours they name. A plain retry (no
reflection, collect.retry_mode "plain") comes with draw = its attempt number: fresh mistakes,
as a sampling policy would make them, and otherwise the same behaviour as any attempt without
reflections. (Retried successes are not shorter on average than first-attempt ones: the tasks
that fail first are the longer ones, and early stops end failed attempts early.)
Episode identity comes from StepContext.key, "<request id>/<step>", with request ids like
"<task id>#<seed>@<attempt>": the mistake draw uses the part before "@" (with "~<draw>" added
for a draw > 1), the per-episode memory the whole request id. `step` is StepContext.step,
0-based; reflections number steps from 1.
Every turn that is an injected mistake carries its kind as PolicyOutput.label, which the
collector stores as StepRecord.label (mining skips labelled detours as references); planned
moves and the teacher's other answers (done, unsupported, lost track) carry None.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import re
import threading
from typing import Any, Mapping, Sequence

from rmsweb_jax.agents import miniwob_solvers as solvers
from rmsweb_jax.agents.policy import PolicyOutput, ReflectionRequest, StepContext
from rmsweb_jax.web.action_text import format_action
from rmsweb_jax.web.actions import Action
from rmsweb_jax.web.elements import Element
from rmsweb_jax.web.observation import Observation

SOLVED_TASKS = solvers.SOLVED_TASKS
MISTAKE_KINDS = ("wrong_element", "detour", "early_stop")
# How reflections name each kind; parse_reflections reads the same words back.
KIND_WORDS = {"wrong_element": "wrong element", "detour": "needless detour", "early_stop": "early stop"}
_REFLECTED = re.compile(r"\bSteps? (\d+(?:, \d+)*) \((wrong element|needless detour|early stop)\)")
_WORD_KINDS = {v: k for k, v in KIND_WORDS.items()}
DETOUR_WAIT_S = 0.3

log = logging.getLogger(__name__)
_announced = threading.Event()


@dataclasses.dataclass(frozen=True)
class MistakeConfig:
    """Per-step probabilities of an injected mistake (at most one per step) and the seed of the
    draw: a wrong element (another plausible element of the same kind), a needless detour
    (hover / scroll / wait), or an early stop (an `answer` before the task is done)."""

    wrong_element_p: float = 0.0
    detour_p: float = 0.0
    early_stop_p: float = 0.0
    seed: int = 0

    def __post_init__(self):
        for name in ("wrong_element_p", "detour_p", "early_stop_p"):
            p = getattr(self, name)
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
                raise ValueError(f"MistakeConfig.{name} must be a probability in [0, 1], got {p!r}")
        if self.wrong_element_p + self.detour_p + self.early_stop_p > 1.0:
            raise ValueError(f"MistakeConfig probabilities must sum to <= 1, got {self}")

    def draw(self, task_id: str, episode: str, step: int) -> str | None:
        """Returns the mistake kind drawn for this (task, episode, step), or None."""
        u = _uniform(self.seed, "kind", task_id, episode, step)
        for kind, p in (("early_stop", self.early_stop_p), ("wrong_element", self.wrong_element_p),
                        ("detour", self.detour_p)):
            if u < p:
                return kind
            u -= p
        return None

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "MistakeConfig":
        """Returns the config stored by `to_dict`; raises KeyError naming an unknown key."""
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise KeyError(f"MistakeConfig: unknown keys {sorted(unknown)}")
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class InjectedMistake:
    """One mistake the teacher made on purpose: its 0-based `step`, `kind`, what it did, and the
    move it should have made (the plan's next move)."""

    step: int
    kind: str
    did: str
    wanted: str

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict."""
        return dataclasses.asdict(self)


@dataclasses.dataclass
class _Run:
    task_id: str
    episode: str
    plan: tuple[solvers.Move, ...]
    kinds: list[str] = dataclasses.field(default_factory=list)  # per step: "move", "finished" or a mistake kind
    mistakes: dict[int, InjectedMistake] = dataclasses.field(default_factory=dict)

    def progress(self, step: int) -> int:
        # A wrong-element step uses up its move (the agent believes it made it); detours don't.
        return sum(k in ("move", "wrong_element") for k in self.kinds[:step])


def parse_reflections(reflections: Sequence[str]) -> set[tuple[int, str]]:
    """Returns the (0-based step, mistake kind) pairs the reflections name, e.g. "Steps 1, 3
    (needless detour)" -> {(0, "detour"), (2, "detour")}."""
    named = set()
    for text in reflections:
        for steps, words in _REFLECTED.findall(text):
            named.update((int(s) - 1, _WORD_KINDS[words]) for s in steps.split(", "))
    return named


def episode_identity(ctx: StepContext) -> tuple[str, str]:
    """Returns (request id, episode id) for a context: the key before "/<step>", and that id
    without its "@<attempt>" suffix (task id and seed, the same for every attempt)."""
    request_id = ctx.key.rsplit("/", 1)[0] if ctx.key else f"{ctx.task_id}#{ctx.instruction}"
    return request_id, request_id.split("@", 1)[0]


class ScriptedTeacher:
    """A Policy that solves SOLVED_TASKS from the element list, with injected mistakes and its
    own reflections (a scripted stand-in for an LLM collector, not a result).

    `tasks`: task ids the caller will run; any without a solver raises ValueError here.
    `memory_size`: attempts remembered for reflect(); an attempt is forgotten once reflected on,
    and the least recently used ones beyond `memory_size` (finished successes, mostly) are
    dropped. Thread-safe: a pool's workers may call act() concurrently.
    """

    def __init__(self, mistakes: MistakeConfig | None = None, *, tasks: Sequence[str] | None = None,
                 memory_size: int = 1024, name: str = "scripted-teacher"):
        if memory_size < 1:
            raise ValueError(f"memory_size must be >= 1, got {memory_size!r}")
        unsupported = sorted(set(tasks or ()) - set(SOLVED_TASKS))
        if unsupported:
            raise ValueError(f"ScriptedTeacher has no solver for tasks {unsupported}; solved: {list(SOLVED_TASKS)}")
        self.name = name
        self.mistakes = mistakes or MistakeConfig()
        self.memory_size = memory_size
        self._runs: collections.OrderedDict[str, _Run] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._stats = collections.Counter()
        if not _announced.is_set():
            _announced.set()
            log.info("ScriptedTeacher: a scripted stand-in for an LLM collector on MiniWoB++ (%d task types, "
                     "mistakes %s); its success rates are not a result.", len(SOLVED_TASKS), self.mistakes.to_dict())

    # --- Policy -------------------------------------------------------------------------
    def act(self, contexts: Sequence[StepContext]) -> list[PolicyOutput]:
        """Returns one PolicyOutput per context, in order."""
        with self._lock:
            self._stats["calls"] += 1
            self._stats["steps"] += len(contexts)
            return [self._act(ctx) for ctx in contexts]

    def reflect(self, request: ReflectionRequest) -> str:
        """Returns the teacher's reflection on a failed attempt: each mistaken step by number and
        kind, what went wrong and what to do instead, then the whole plan. Forgets the attempt."""
        with self._lock:
            self._stats["reflections"] += 1
            run = self._runs.pop(request.key, None)
        head = f"Attempt {request.attempt} failed ({request.verdict_reason or request.verdict})."
        if run is None:
            return (f"{head} I have no record of this attempt (request {request.key!r}), so I cannot say which "
                    f"step went wrong; read the task again and act only on the elements it names.")
        return " ".join([head, *_mistake_sentences(run), "The whole task: " + _plan_text(run.plan) + "."])

    def stats(self) -> dict[str, int]:
        """Returns counts: calls, steps, episodes (runs from reset), reflections, unsupported,
        solver_errors, lost_track (steps of attempts no longer remembered), injected_<kind> and
        avoided_<kind> per mistake kind (avoided: drawn, but named by a reflection in context) and
        their totals mistakes_injected / mistakes_avoided; prompt/completion tokens are 0."""
        with self._lock:
            out = {"calls": 0, "steps": 0, "prompt_tokens": 0, "completion_tokens": 0, "episodes": 0,
                   "reflections": 0, "unsupported": 0, "solver_errors": 0, "lost_track": 0}
            out.update({f"{w}_{k}": 0 for w in ("injected", "avoided") for k in MISTAKE_KINDS})
            out.update(self._stats)
        out["mistakes_injected"] = sum(out[f"injected_{k}"] for k in MISTAKE_KINDS)
        out["mistakes_avoided"] = sum(out[f"avoided_{k}"] for k in MISTAKE_KINDS)
        return out

    def injected(self, request_id: str) -> tuple[InjectedMistake, ...]:
        """Returns the mistakes injected in an attempt still remembered (empty once forgotten)."""
        with self._lock:
            run = self._runs.get(request_id)
            return () if run is None else tuple(run.mistakes[s] for s in sorted(run.mistakes))

    def close(self) -> None:
        """Forgets every episode."""
        with self._lock:
            self._runs.clear()

    # --- one step -----------------------------------------------------------------------
    def _act(self, ctx: StepContext) -> PolicyOutput:
        obs = ctx.observation
        if ctx.task_id not in solvers.PLANNERS:
            self._stats["unsupported"] += 1
            return _answer(obs, f"ScriptedTeacher has no solver for task {ctx.task_id!r}, so I stop here.",
                           "unsupported task")
        request_id, episode = episode_identity(ctx)
        step = ctx.step
        run = self._runs.get(request_id)
        if step == 0 or run is None:
            if step > 0:
                self._stats["lost_track"] += 1
                return _answer(obs, f"I have lost track of episode {request_id!r} (forgotten after "
                               f"{self.memory_size} episodes), so I stop here.", "lost track")
            try:
                run = self._start(request_id, episode, ctx)
            except solvers.SolverError as e:
                self._stats["solver_errors"] += 1
                return _answer(obs, f"I cannot make sense of this page: {e}", "cannot solve")
        self._runs.move_to_end(request_id)
        del run.kinds[step:]  # the same step again: a re-run from reset
        for s in [s for s in run.mistakes if s >= step]:
            del run.mistakes[s]
        if len(run.kinds) < step:
            self._stats["lost_track"] += 1
            return _answer(obs, f"Steps {len(run.kinds) + 1}..{step} of {request_id!r} never reached me, so I "
                           f"stop here.", "lost track")
        done = run.progress(step)
        if done >= len(run.plan):
            run.kinds.append("finished")
            return _answer(obs, "I have done everything the task asks.", "done")
        move = run.plan[done]
        try:
            wanted = solvers.resolve(move.target, obs)
            output = self._mistake(run, ctx, step, move, wanted)
            if output is None:
                run.kinds.append("move")
                output = _output(obs, solvers.action_for(move, wanted, obs),
                                 _thought(ctx, step, move.goal, last=done == len(run.plan) - 1))
        except solvers.SolverError as e:
            self._stats["solver_errors"] += 1
            run.kinds.append("move")
            return _answer(obs, f"I cannot find {move.target.label}: {e}", "cannot solve")
        return output

    def _start(self, request_id: str, episode: str, ctx: StepContext) -> _Run:
        plan = solvers.plan(ctx.task_id, ctx.instruction, ctx.observation)
        # Draw 1 keeps the key of every attempt before draws existed, so stored runs replay exactly.
        run = _Run(ctx.task_id, episode if ctx.draw == 1 else f"{episode}~{ctx.draw}", plan)
        self._runs[request_id] = run
        while len(self._runs) > self.memory_size:
            self._runs.popitem(last=False)
        self._stats["episodes"] += 1
        return run

    def _mistake(self, run: _Run, ctx: StepContext, step: int, move: solvers.Move,
                 wanted: Element) -> PolicyOutput | None:
        kind = self.mistakes.draw(run.task_id, run.episode, step)
        if kind is None:
            return None
        obs = ctx.observation
        others = solvers.alternatives(move.target, obs) if kind == "wrong_element" else []
        if kind == "wrong_element" and not others:
            return None  # nothing on the page to confuse the target with
        if (step, kind) in parse_reflections(ctx.reflections):
            self._stats[f"avoided_{kind}"] += 1
            return None
        self._stats[f"injected_{kind}"] += 1
        run.kinds.append(kind)
        if kind == "early_stop":
            run.mistakes[step] = InjectedMistake(step, kind, "answered that the task was done", move.goal)
            return _answer(obs, "The task looks done.", "done", label=kind)
        if kind == "wrong_element":
            other = others[_pick(self.mistakes.seed, len(others), "which", run.task_id, run.episode, step)]
            label = _label(other, obs)
            wrong = dataclasses.replace(move, target=dataclasses.replace(move.target, label=label))
            did = f"clicked {label}" if move.kind == "click" else f'typed "{move.text}" into {label}'
            run.mistakes[step] = InjectedMistake(step, kind, did, move.goal)
            return _output(obs, solvers.action_for(wrong, other, obs), _thought(ctx, step, wrong.goal, last=False),
                           label=kind)
        # A detour: looks busy, changes nothing the task checks.
        variant = _pick(self.mistakes.seed, 3, "detour", run.task_id, run.episode, step)
        if variant == 0:
            # Another control (the instruction's text would make an odd thing to study).
            bystanders = [e for e in obs.elements if e.interactive and e.id != wanted.id and e.bbox.area > 0]
            bystanders = bystanders or [wanted]
            other = bystanders[_pick(self.mistakes.seed, len(bystanders), "hover", run.task_id, run.episode, step)]
            point = solvers.coordinate(solvers.point_on(other, obs), obs)
            action, did, thought = (Action("hover", coordinate=point), f"hovered over {_label(other, obs)}",
                                    f"Let me look at {_label(other, obs)} before going on.")
        elif variant == 1:
            action, did, thought = (Action("scroll", direction="down", amount=100), "scrolled down",
                                    "Let me scroll down to check for more of the page.")
        else:
            action, did, thought = (Action("wait", seconds=DETOUR_WAIT_S), "waited",
                                    "Let me wait a moment for the page to settle.")
        run.mistakes[step] = InjectedMistake(step, kind, did, move.goal)
        return _output(obs, action, thought, label=kind)


# --- text ---------------------------------------------------------------------------------
def _thought(ctx: StepContext, step: int, goal: str, *, last: bool) -> str:
    if step == 0:
        return f"The task: {ctx.instruction} {'So I' if last else 'First, I'} {goal}."
    return f"{'Finally' if last else 'Next'}, I {goal}."


def _label(element: Element, obs: Observation) -> str:
    name = element.name.strip()
    if name and element.role != "StaticText":
        return f'the "{name}" {element.role}'
    if name:
        return f'the text "{name}"'
    same = solvers.reading_order([e for e in obs.elements if e.role == element.role])
    rank = next((i for i, e in enumerate(same) if e.id == element.id), 0) + 1
    return f"{element.role} number {rank} from the top"


def _plan_text(plan: Sequence[solvers.Move]) -> str:
    return ", then ".join(m.goal for m in plan)


def _steps(steps: Sequence[int]) -> str:
    return ("Step " if len(steps) == 1 else "Steps ") + ", ".join(str(s + 1) for s in steps)


def _mistake_sentences(run: _Run) -> list[str]:
    mistakes = [run.mistakes[s] for s in sorted(run.mistakes)]
    if not mistakes:
        return ["I made no mistake I can name: every step followed the plan, so follow it again."]
    out = []
    for m in mistakes:
        if m.kind == "wrong_element":
            out.append(f"{_steps([m.step])} ({KIND_WORDS[m.kind]}): I {m.did}, but the task needs me to {m.wanted}; "
                       f"{m.wanted} instead.")
        elif m.kind == "early_stop":
            out.append(f"{_steps([m.step])} ({KIND_WORDS[m.kind]}): I {m.did} before it was; {m.wanted} and keep "
                       f"going until the page ends the task.")
    detours = [m for m in mistakes if m.kind == "detour"]
    if detours:
        did = "; ".join(f"step {m.step + 1} {m.did}" for m in detours)
        out.append(f"{_steps([m.step for m in detours])} ({KIND_WORDS['detour']}): {did}, none of which the task "
                   f"needs; go straight to the next action of the task.")
    return out


# --- helpers ------------------------------------------------------------------------------
def _output(obs: Observation, action: Action, thought: str, *, label: str | None = None) -> PolicyOutput:
    return PolicyOutput.from_text(format_action(action, thought), obs, label=label)


def _answer(obs: Observation, thought: str, text: str, *, label: str | None = None) -> PolicyOutput:
    return _output(obs, Action.answer_with(text), thought, label=label)


def _digest(*parts: Any) -> int:
    # blake2b, not hash(): Python salts str hashes per process, and draws must repeat across runs.
    return int.from_bytes(hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest(), "big")


def _uniform(*parts: Any) -> float:
    return _digest(*parts) / 2**64


def _pick(seed: int, n: int, *parts: Any) -> int:
    return _digest(seed, *parts) % n
