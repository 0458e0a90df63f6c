"""The trajectory store's records: one StepRecord per step, one TrajectoryRecord per attempt.

Both serialize to msgpack maps (screenshots stay raw bytes) tagged with `schema` and `kind`.
This table is the schema, version SCHEMA_VERSION; change it here and bump the version.

StepRecord (kind "step") — one step of one attempt, self-contained:

| field | type | meaning |
|---|---|---|
| task_id, seed, attempt | str, int, int | the task, its seed, the retry attempt (1..K) |
| request_id | str | "<task id>#<seed>@<attempt>" |
| step | int | index of the step in the attempt (0-based) |
| instruction | str | the task instruction the page showed |
| screenshot | bytes | PNG of the page the action was chosen on |
| url, title | str | the page's URL and title |
| viewport, screenshot_size | (int, int) | CSS viewport and screenshot pixels |
| coordinates | str | "relative" (0-1000) or "pixel": how the action's coordinates read |
| elements | tuple[Element] | visible elements (role, name, box) |
| focused_id | int or None | the focused element's id |
| last_error | str or None | why the previous action failed on the page, if it did |
| text | str | the policy's raw assistant turn (thought + tool call) |
| thought | str | the thought before the tool call |
| action_text | str | the tool call alone (canonical form for a parsed action) |
| action | Action | the action executed, with its semantic target (a `wait` when unparseable) |
| parse_error | str or None | why `text` is not a valid action ("<reason>: <message>") |
| exec_error | str or None | why the executed action failed on the page, if it did |
| prompt_tokens, completion_tokens | int | token counts of the policy call (0 for the teacher) |
| label | str or None | the teacher's injected mistake kind here ("detour", "wrong_element", "early_stop"), else None |

TrajectoryRecord (kind "trajectory") — one attempt of one task:

| field | type | meaning |
|---|---|---|
| task_id, seed, attempt, request_id | | as in StepRecord |
| task | dict | the Task record (`Task.to_dict()`) |
| instruction | str | the instruction of this attempt |
| reflections | tuple[str] | reflections in the policy's context (empty on attempt 1) |
| verdict | Verdict | the judge's decision (outcome, reason, score, raw, judge, calls, prompt_tokens, completion_tokens: the judge model's tokens, 0 in stores written before they were counted); judge "pool": lost to faults |
| success | bool | verdict.success (programmatic judge: the raw reward under config.collect.success) |
| reward, suite_success | float/None, bool/None | what the suite reported: raw reward, solved or not |
| num_steps | int | steps taken (= StepRecords stored for this attempt) |
| status, end_reason | str, str/None | the episode's status ("complete"/"failed") and why it ended |
| done, truncated | bool | ended by the task / by the step or time limit |
| faults | tuple[str] | browser faults of this attempt's runs, each followed by a rerun (no new attempt number) |
| final_url, final_screenshot, final_answer | str, bytes/None, str/None | the page after the last action |
| wall_s, finished_at | float | the episode's wall time; unix time the attempt was judged |
| policy, judge | str | names of the policy and judge |
| prompt_tokens, completion_tokens, parse_errors | int | sums over this attempt's steps |
| steps_shard, steps_start | str, int | where the steps are: shard file name, first position (set on commit) |
| recording | dict/None | collect.record "har": the episode's recording in the store's recordings/ (web/recording.py Recording: har, state, sha256, bytes, started_ms); absent in stores written before |
| off_record | str/None | a replayed episode (eval.replay): the first URL its recording did not hold; such an episode is neither a success nor a failure |

`reward` is MiniWoB++'s raw page reward (WOB_RAW_REWARD_GLOBAL, no time discount), which is
partial on some pages (click-checkboxes: (#right - #wrong) / n); `success` is what the judge
made of it under the run's rule (suites/success_rule.py). An attempt with status "failed" was
lost to the browser faults listed, after its reruns.

Versions: 1 the first; 2 added StepRecord.label. A store of another version is refused (store.json
and every record carry the version; store_layout.read_meta says to collect into a new store):
a version-1 store cannot say which of its steps were teacher detours, so reading it as "no
labels" would silently train and mine on them as references.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import msgpack

from rmsweb_jax.agents.policy import PastStep
from rmsweb_jax.judges.base import Verdict
from rmsweb_jax.web.actions import Action, SemanticTarget
from rmsweb_jax.web.elements import Element
from rmsweb_jax.web.observation import Observation

SCHEMA_VERSION = 2
STEP, TRAJECTORY = "step", "trajectory"
# Verdict.judge of an attempt lost to browser faults: the collector's own verdict, no judge call.
FAULT_JUDGE = "pool"


class SchemaError(ValueError):
    """A stored record that this code cannot read: another schema version, another kind, or a
    missing field."""


def task_key(task_id: str, seed: int) -> tuple[str, int]:
    """Returns the key of a task group (all attempts of one task with one seed)."""
    return (task_id, int(seed))


def request_id(task_id: str, seed: int, attempt: int) -> str:
    """Returns the request id of one attempt: "<task id>#<seed>@<attempt>"."""
    return f"{task_id}#{seed}@{attempt}"


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One step of one attempt: the page the action was chosen on, the policy's turn, and the
    action executed (see the module docstring for every field)."""

    task_id: str
    seed: int
    attempt: int
    request_id: str
    step: int
    instruction: str
    screenshot: bytes
    url: str
    title: str
    viewport: tuple[int, int]
    screenshot_size: tuple[int, int]
    coordinates: str
    elements: tuple[Element, ...]
    focused_id: int | None
    last_error: str | None
    text: str
    thought: str
    action_text: str
    action: Action
    parse_error: str | None = None
    exec_error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    label: str | None = None

    @property
    def target(self) -> SemanticTarget | None:
        """Returns the semantic target of the executed action (element, point, text, ...)."""
        return self.action.target

    def observation(self) -> Observation:
        """Returns the Observation the action was chosen on (as a policy saw it)."""
        return Observation(url=self.url, title=self.title, screenshot=self.screenshot, viewport=self.viewport,
                           screenshot_size=self.screenshot_size, elements=self.elements, focused_id=self.focused_id,
                           instruction=self.instruction, step=self.step, last_error=self.last_error,
                           coordinates=self.coordinates)

    def past_step(self) -> PastStep:
        """Returns this step as a later step's prompt shows it."""
        return PastStep(screenshot=self.screenshot, url=self.url, thought=self.thought, action_text=self.action_text)

    def to_bytes(self) -> bytes:
        """Returns the msgpack encoding (schema and kind tagged; screenshot raw)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["viewport"], d["screenshot_size"] = list(self.viewport), list(self.screenshot_size)
        d["elements"] = [e.to_dict() for e in self.elements]
        d["action"] = self.action.to_dict()
        return _pack(STEP, d)

    @classmethod
    def from_bytes(cls, data: bytes) -> "StepRecord":
        """Returns the record stored by `to_bytes`; raises SchemaError for another schema version
        or kind, naming what was found and expected."""
        d = _unpack(data, STEP)
        try:
            d["viewport"], d["screenshot_size"] = tuple(d["viewport"]), tuple(d["screenshot_size"])
            d["elements"] = tuple(Element.from_dict(e) for e in d["elements"])
            d["action"] = Action.from_dict(d["action"])
        except KeyError as e:
            raise SchemaError(f"step record lacks field {e}") from None
        return _build(cls, d)


@dataclasses.dataclass(frozen=True)
class TrajectoryRecord:
    """One attempt of one task: reflections in context, the verdict, and where its steps are
    stored (see the module docstring for every field)."""

    task_id: str
    seed: int
    attempt: int
    request_id: str
    task: dict[str, Any]
    instruction: str
    reflections: tuple[str, ...]
    verdict: Verdict
    success: bool
    reward: float | None
    suite_success: bool | None
    num_steps: int
    status: str
    end_reason: str | None
    done: bool
    truncated: bool
    faults: tuple[str, ...] = ()
    final_url: str = ""
    final_screenshot: bytes | None = None
    final_answer: str | None = None
    wall_s: float = 0.0
    finished_at: float = 0.0
    policy: str = ""
    judge: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    parse_errors: int = 0
    steps_shard: str = ""
    steps_start: int = 0
    recording: dict[str, Any] | None = None
    off_record: str | None = None

    @property
    def key(self) -> tuple[str, int]:
        """Returns the task group this attempt belongs to: (task id, seed)."""
        return task_key(self.task_id, self.seed)

    def to_bytes(self) -> bytes:
        """Returns the msgpack encoding (schema and kind tagged)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["reflections"], d["faults"] = list(self.reflections), list(self.faults)
        d["verdict"] = self.verdict.to_dict()
        return _pack(TRAJECTORY, d)

    @classmethod
    def from_bytes(cls, data: bytes) -> "TrajectoryRecord":
        """Returns the record stored by `to_bytes`; raises SchemaError for another schema version
        or kind, naming what was found and expected."""
        d = _unpack(data, TRAJECTORY)
        try:
            d["reflections"], d["faults"] = tuple(d["reflections"]), tuple(d["faults"])
            d["verdict"] = Verdict.from_dict(d["verdict"])
        except KeyError as e:
            raise SchemaError(f"trajectory record lacks field {e}") from None
        return _build(cls, d)


def decode_record(data: bytes) -> StepRecord | TrajectoryRecord:
    """Returns the StepRecord or TrajectoryRecord encoded in `data`, whichever kind it is."""
    kind = _unpack(data, None)["kind"]
    return StepRecord.from_bytes(data) if kind == STEP else TrajectoryRecord.from_bytes(data)


def _pack(kind: str, fields: dict[str, Any]) -> bytes:
    return msgpack.packb({"schema": SCHEMA_VERSION, "kind": kind, **fields}, use_bin_type=True)


def _unpack(data: bytes, kind: str | None) -> dict[str, Any]:
    try:
        d = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as e:  # noqa: BLE001 — msgpack raises several types for corrupt input
        raise SchemaError(f"not a store record ({type(e).__name__}: {e})") from None
    if not isinstance(d, dict) or "schema" not in d:
        raise SchemaError(f"not a store record: expected a map with a 'schema' key, got {type(d).__name__}")
    if d["schema"] != SCHEMA_VERSION:
        raise SchemaError(f"record has schema version {d['schema']!r}; this code reads version {SCHEMA_VERSION}")
    if d.get("kind") not in (STEP, TRAJECTORY) or (kind is not None and d["kind"] != kind):
        raise SchemaError(f"record kind is {d.get('kind')!r}; expected {kind or (STEP, TRAJECTORY)!r}")
    return d


def _build(cls, d: Mapping[str, Any]):
    names = {f.name for f in dataclasses.fields(cls)}
    required = {f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    missing = sorted(required - set(d))
    if missing:
        raise SchemaError(f"{cls.__name__} record lacks fields {missing}")
    return cls(**{k: v for k, v in d.items() if k in names})
