"""Reflection-conditioned retries: run each task, judge it, reflect on a failure, try again.

For every (task, seed): attempt 1 runs without reflections; the judge decides; on failure and
while attempts < K the policy writes a reflection (its own reflector: the teacher's, or the
model's through its endpoint) and the next attempt runs with every reflection so far. Every
attempt is recorded. A task group (all its attempts) goes to the store when it is solved or
out of attempts, so a killed run loses only unfinished groups and a rerun skips finished ones.

retry_mode "plain" is the baseline without reflection: a failed attempt is retried with no
reflection in context and no reflect() call (no reflection cost), as a fresh draw of the
policy's randomness (StepContext.draw = the attempt number), so a retry is not the same run
again. For the ScriptedTeacher the draw picks its injected mistakes; a model policy samples
afresh on every call in both modes (FlaxPolicy: a new sampling seed per call; an endpoint: its
own sampling), so what a plain retry re-draws is its sampling, governed by collect.temperature:
at temperature 0 (greedy) a plain retry repeats attempt 1 step for step, page seed included. A
store holds one retry mode (recorded in store.json; another is refused), because success@<=K
and the retried trajectories mean something else under each.

Many groups are in flight at once: N browser workers take attempts from one queue (retries
before new tasks, so open groups close soon), while judging and reflecting run beside them.

The judge sees the whole attempt (JudgeInput): every step's screenshot, URL, thought and action
text, the page after the last action, and the final answer (the text of a closing `answer`).
A judge that cannot decide (endpoint down, unparseable verdict, or a judge that raises) gives
an error verdict: never a success, and it ends the group unsolved, with no reflection and no
retry. A reflection on an undecided attempt would tell the policy it failed when it may not
have, and an endpoint that is down would fail the retry's judgement too; the attempt is
stored with its error verdict and the report counts the judge errors.

Browser faults are not the policy's doing, so a rerun after one never consumes an attempt number
and is never counted as a retry. The pool reruns a faulted episode from reset itself (up to
pool_max_attempts runs); when every run faults, the collector runs the same attempt again —
same number, same reflections — up to `fault_reruns` times. The faults of all those runs are
stored with the attempt that finally ran (TrajectoryRecord.faults), and the report counts them
apart from attempts. An attempt still lost after that is stored with a "pool" verdict and ends
its group unsolved (no reflection: there was nothing to reflect on).

Success is the judge's verdict; the programmatic judge applies config.collect.success (a
partial MiniWoB++ reward is a failure under "solved"), and the raw reward is stored beside it.

run() and run_pairs() block until the collection is done, also when called from a thread that
already runs an event loop (every Jupyter/Colab cell): asyncio.run() refuses that, so the
collection then runs on an event loop in a thread of its own (web/loop_thread.py run_sync).
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from typing import Any, Sequence

from absl import logging
from tqdm import tqdm

from rmsweb_jax.agents.policy import Policy, PolicyOutput, ReflectionRequest
from rmsweb_jax.collect.adapter import AttemptSpec, PolicyBridge, split_turn
from rmsweb_jax.collect.records import FAULT_JUDGE, StepRecord, TrajectoryRecord, request_id, task_key
from rmsweb_jax.collect.store import PLAIN, RETRY_MODES, StoreWriter, check_policy
from rmsweb_jax.collect.store_layout import RECORDINGS
from rmsweb_jax.config_block import block_fields
from rmsweb_jax.errors import UserError
from rmsweb_jax.judges.base import ERROR, Judge, JudgeInput, Verdict
from rmsweb_jax.web.episode import Episode, EpisodeRequest
from rmsweb_jax.web.loop_thread import run_sync
from rmsweb_jax.web.pool import AsyncWorkerPool
from rmsweb_jax.web.recording import RECORD, REPLAY, Tape
from rmsweb_jax.web.suite import Suite
from rmsweb_jax.web.worker import WorkerConfig

RECORD_MODES = ("", "har")

# Queue priorities: retries of open groups first, then new tasks, then the workers' stop signal.
_RETRY, _NEW, _STOP = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class CollectSummary:
    """What one run of the collector did (in-memory counts of this run; the report reads the
    store instead). `skipped` task groups were already in the store."""

    requested: int
    skipped: int
    collected: int
    trajectories: int
    steps: int
    solved_first: int
    solved: int
    fault_reruns: int  # attempts run again under the same number because every pool run faulted
    lost_to_faults: int  # groups ended by an attempt lost to browser faults after its reruns
    wall_s: float
    judge_errors: int = 0  # attempts the judge could not decide (each ended its group unsolved)
    pool_marker: str = ""
    endpoints_down: dict[str, str] = dataclasses.field(default_factory=dict)  # remote browsers given up: address
                                                                              # -> why (their episodes moved)
    bridge: dict[str, float] = dataclasses.field(default_factory=dict)
    policy: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict."""
        return dataclasses.asdict(self)


@dataclasses.dataclass
class _Group:
    task: Any
    seed: int
    order: int
    reflections: tuple[str, ...] = ()
    attempts: list = dataclasses.field(default_factory=list)  # [(TrajectoryRecord, [StepRecord])]
    faults: tuple[str, ...] = ()  # faults of the next attempt's whole reruns so far (stored with it)
    fault_reruns: int = 0  # whole reruns of the next attempt so far

    @property
    def next_attempt(self) -> int:
        return len(self.attempts) + 1


@dataclasses.dataclass(frozen=True)
class CollectSettings:
    """config.collect's settings of the retry loop, validated. No defaults: configs/common.py holds them
    (`from_config`); eval and rollouts replace what they play differently (one attempt, their max_steps)."""

    attempts: int  # K: attempt 1 + up to K-1 retries
    retry_mode: str  # RETRY_MODES
    workers: int  # browser workers, and the policy's batch size
    max_steps: int
    step_timeout_s: float  # one action plus its observation (the workers' WorkerConfig)
    batch_window_s: float  # how long a policy batch waits for more workers' steps
    pool_max_attempts: int  # runs of an episode the browser pool makes when browsers crash
    fault_reruns: int  # then whole reruns of the attempt (same number, never a retry)
    progress: bool
    record: str  # RECORD_MODES: "har" records every episode into the store's recordings/
    progress_label: str  # the progress bar's name: not a config field (from_config: "collect"; eval and
                         # mine's rollouts, which play through this loop too, replace it with their stage's)
    replay: str  # not a config field: eval.replay's recordings folder ("" = play live; from_config: "")
    cdp_endpoints: tuple[str, ...]  # config.web's (cdp_endpoints): remote browsers; () = local ones

    def __post_init__(self):
        if self.retry_mode not in RETRY_MODES:
            raise UserError(f"config.collect.retry_mode must be one of {list(RETRY_MODES)}, got {self.retry_mode!r}")
        for name, low in (("attempts", 1), ("workers", 1), ("max_steps", 1), ("pool_max_attempts", 1),
                          ("fault_reruns", 0)):
            if getattr(self, name) < low:
                raise UserError(f"config.collect.{name} must be >= {low}, got {getattr(self, name)!r}")
        if self.record not in RECORD_MODES:
            raise UserError(f"config.collect.record = {self.record!r}: expected '' (no recording) or 'har' (each "
                            "episode's traffic, storage and clock recorded into the store, for eval.replay)")
        if self.record and self.replay:
            raise UserError(f"config.collect.record = {self.record!r} with eval.replay: a replay serves every request "
                            "from its recording; record live runs only")
        if self.step_timeout_s <= 0 or self.batch_window_s < 0:
            raise UserError(f"config.collect.step_timeout_s = {self.step_timeout_s!r} must be > 0 and "
                            f"batch_window_s = {self.batch_window_s!r} >= 0")

    @classmethod
    def from_config(cls, collect, web=None) -> "CollectSettings":
        """Returns the collect stage's settings of a config.collect-shaped block (each field read under its own
        name; the progress bar named "collect") and config.web's remote browsers (web None: local browsers);
        raises UserError naming the key of a bad value."""
        return cls(**{**block_fields(cls, collect, "config.collect",
                                     optional=("progress_label", "replay", "cdp_endpoints")),
                      "progress_label": "collect", "replay": "",
                      "cdp_endpoints": () if web is None else cdp_endpoints(web)})

    def worker_config(self, store_dir) -> WorkerConfig:
        """Returns the browser workers' settings: recording into store_dir/recordings (record "har"), or
        replaying from the `replay` folder."""
        tape = (Tape(RECORD, str(store_dir / RECORDINGS)) if self.record else
                Tape(REPLAY, self.replay) if self.replay else None)
        return WorkerConfig(step_timeout_s=self.step_timeout_s, tape=tape, cdp_endpoints=self.cdp_endpoints)


def cdp_endpoints(web) -> tuple[str, ...]:
    """Returns the remote browsers of config.web.cdp_endpoint (comma-separated; () = launch locally); raises
    UserError naming one that is not a ws(s):// or http(s):// address."""
    endpoints = tuple(e.strip() for e in web.cdp_endpoint.split(",") if e.strip())
    for endpoint in endpoints:
        if not endpoint.startswith(("ws://", "wss://", "http://", "https://")) or not endpoint.partition("://")[2]:
            raise UserError(f"web.cdp_endpoint {endpoint!r}: expected a CDP endpoint, ws://host:port/devtools/browser/"
                            "<id> (browserless, a Selenium Grid node) or http://host:port (Chromium's "
                            "--remote-debugging-port), several separated by commas")
    return endpoints


class RetryCollector:
    """Collects trajectories with reflection-conditioned (or, retry_mode "plain", reflection-free)
    retries into a StoreWriter.

        collect = CollectSettings.from_config(config.collect)
        with StoreWriter(workdir / "store", flush_every_tasks=8, flush_every_s=30.0) as store:
            summary = RetryCollector(suite, policy, judge, store, collect).run(tasks, seeds)
    """

    def __init__(self, suite: Suite, policy: Policy, judge: Judge, store: StoreWriter, settings: CollectSettings):
        check_policy(store.directory, store.meta, policy.name)  # one store, one policy (see store.py)
        store.claim_retry_mode(settings.retry_mode)  # one store, one retry mode; raises StoreError for another
        if settings.record and store.remote:
            raise UserError(f"config.collect.record = {settings.record!r} into the bucket store {store.remote}: "
                            "recordings are written to local stores only; collect into a local store_dir and copy it")
        self.settings = settings
        self.retry_mode = settings.retry_mode
        self.suite, self.policy, self.judge, self.store = suite, policy, judge, store
        self.attempts, self.workers, self.max_steps = settings.attempts, settings.workers, settings.max_steps
        self.worker_config = settings.worker_config(store.directory)
        self.pool_max_attempts, self.fault_reruns = settings.pool_max_attempts, settings.fault_reruns
        self.progress = settings.progress
        self.pool: AsyncWorkerPool | None = None  # the browser pool while run() is in progress
        self.bridge = PolicyBridge(policy, max_batch=settings.workers, window_s=settings.batch_window_s)

    def run(self, tasks: Sequence[Any], seeds: Sequence[int]) -> CollectSummary:
        """Returns the summary after every (task, seed) not yet in the store is collected."""
        return run_sync(self.run_async(tasks, seeds))

    def run_pairs(self, pairs: Sequence[tuple[Any, int]]) -> CollectSummary:
        """Returns the summary after every (task, seed) pair not yet in the store is collected
        (pairs, not tasks x seeds: e.g. the task groups of another store)."""
        return run_sync(self.run_pairs_async(pairs))

    async def run_async(self, tasks: Sequence[Any], seeds: Sequence[int]) -> CollectSummary:
        """Returns the summary after every (task, seed) not yet in the store is collected."""
        return await self.run_pairs_async([(t, s) for t in tasks for s in seeds])

    async def run_pairs_async(self, pairs: Sequence[tuple[Any, int]]) -> CollectSummary:
        """Returns the summary after every (task, seed) pair not yet in the store is collected."""
        started = time.monotonic()
        # One group per (task id, seed), in the order given; repeats would collide in the store.
        pairs = list({task_key(_task_id(t), s): (t, int(s)) for t, s in pairs}.values())
        finished = self.store.finished_task_keys()
        todo = [_Group(task, seed, i) for i, (task, seed) in enumerate(pairs)
                if task_key(_task_id(task), seed) not in finished]
        self._counts = {"collected": 0, "trajectories": 0, "steps": 0, "solved_first": 0, "solved": 0,
                        "fault_reruns": 0, "lost_to_faults": 0, "judge_errors": 0}
        marker, self._endpoints_down = "", {}
        if todo:
            logging.info("collect: %d task groups to run, %d already in the store %s", len(todo),
                         len(pairs) - len(todo), self.store.directory)
            marker = await self._collect(todo)
        else:
            logging.info("collect: all %d task groups are already in the store %s", len(pairs), self.store.directory)
        self.store.flush()
        return CollectSummary(requested=len(pairs), skipped=len(pairs) - len(todo), wall_s=time.monotonic() - started,
                              pool_marker=marker, endpoints_down=self._endpoints_down, bridge=self.bridge.stats(),
                              policy=dict(self.policy.stats()), **self._counts)

    async def _collect(self, groups: list[_Group]) -> str:
        queue: asyncio.PriorityQueue = asyncio.PriorityQueue()
        counter = itertools.count()
        for group in groups:
            queue.put_nowait((_NEW, group.order, next(counter), group))
        self._open = len(groups)
        self._bar = tqdm(total=len(groups), desc=self.settings.progress_label, unit="task", disable=not self.progress,
                         dynamic_ncols=True)
        self._started = time.monotonic()
        pool = self.pool = AsyncWorkerPool(self.suite, self.workers, self.worker_config,
                                           max_attempts=self.pool_max_attempts)
        # The marker finds this run's browsers in /proc (cleanup after a kill -9 of this process).
        logging.info("collect: browser pool marker %s (%d workers)", pool.marker, self.workers)
        try:
            async with pool:
                async with asyncio.TaskGroup() as tg:
                    flusher = tg.create_task(self._flush_periodically())
                    workers = [tg.create_task(self._serve(slot, pool, queue, counter, tg))
                               for slot in range(self.workers)]
                    await asyncio.gather(*workers)
                    flusher.cancel()
        except BaseExceptionGroup as group:  # the first real error, not the group wrapper
            errors = [e for e in group.exceptions if not isinstance(e, asyncio.CancelledError)]
            raise (errors or list(group.exceptions))[0] from None
        finally:
            self._bar.close()
            self.pool = None
            self._endpoints_down = dict(pool.down_endpoints)
        return pool.marker

    async def _serve(self, slot: int, pool: AsyncWorkerPool, queue: asyncio.PriorityQueue, counter, tg) -> None:
        while True:
            priority, _, _, group = await queue.get()
            if priority == _STOP:
                return
            attempt = group.next_attempt
            rid = request_id(_task_id(group.task), group.seed, attempt)
            # A plain retry is a fresh draw of the policy's randomness; a reflection retry is attempt
            # 1's run again, changed only by its reflections (see the module docstring).
            draw = attempt if self.retry_mode == PLAIN else 1
            self.bridge.begin(rid, AttemptSpec(attempt=attempt, reflections=group.reflections, draw=draw))
            request = EpisodeRequest(task=group.task, seed=group.seed, max_steps=self.max_steps, request_id=rid)
            try:
                episode = await pool.run_episode(slot, request, self.bridge)
            finally:
                outputs = self.bridge.end(rid)
            tg.create_task(self._after(group, episode, outputs, queue, counter))

    async def _after(self, group: _Group, episode: Episode, outputs: dict[int, PolicyOutput],
                     queue: asyncio.PriorityQueue, counter) -> None:
        """Judges one finished attempt; then commits the group or queues the next attempt (or
        the same attempt again, when every pool run of it hit a browser fault)."""
        attempt = group.next_attempt
        if not episode.complete and group.fault_reruns < self.fault_reruns:
            # Nothing the policy did: the same attempt runs again, its number and reflections kept.
            logging.warning("collect: %s lost to browser faults, running it again (%d/%d): %s",
                            episode.request.request_id, group.fault_reruns + 1, self.fault_reruns,
                            "; ".join(episode.faults))
            group.faults = (*group.faults, *episode.faults)
            group.fault_reruns += 1
            self._counts["fault_reruns"] += 1
            queue.put_nowait((_RETRY, group.order, next(counter), group))
            return
        steps = _step_records(group, attempt, episode, outputs)
        past = tuple(s.past_step() for s in steps)
        final = episode.observations[-1] if episode.observations else None
        last = episode.actions[-1] if episode.actions else None
        final_answer = last.text if last is not None and last.name == "answer" else None
        if episode.complete:
            # Cut off at max_steps before the suite said anything: unsolved, not undecidable.
            suite_success = False if episode.success is None and episode.truncated else episode.success
            verdict = await self._judge(JudgeInput(
                task=group.task, instruction=episode.instruction, steps=past,
                final_screenshot=None if final is None else final.screenshot, final_answer=final_answer,
                reward=episode.reward, suite_success=suite_success), episode.request.request_id)
        else:  # every run of the attempt, reruns included, hit a browser fault: nothing to judge
            faults = (*group.faults, *episode.faults)
            verdict = Verdict(outcome=ERROR, reason=f"browser faults: {'; '.join(faults)}", judge=FAULT_JUDGE)
        judge_error = episode.complete and verdict.outcome == ERROR
        group.attempts.append((_trajectory_record(group, attempt, episode, steps, verdict, final, final_answer,
                                                  self.policy.name, self.judge.name), steps))
        group.faults, group.fault_reruns = (), 0
        self._counts["trajectories"] += 1
        self._counts["steps"] += len(steps)
        self._counts["judge_errors"] += judge_error
        self._counts["lost_to_faults"] += not episode.complete
        # See the module docstring: an undecided or lost attempt ends its group unsolved.
        if verdict.success or attempt >= self.attempts or judge_error or not episode.complete:
            self._commit(group, verdict.success, attempt)
            if self._open == 0:
                for _ in range(self.workers):
                    queue.put_nowait((_STOP, 0, next(counter), None))
            return
        if self.retry_mode == PLAIN:
            queue.put_nowait((_RETRY, group.order, next(counter), group))
            return
        reflection = await self.bridge.reflect(ReflectionRequest(
            task_id=_task_id(group.task), instruction=episode.instruction, attempt=attempt, steps=past,
            verdict=verdict.outcome, verdict_reason=verdict.reason, earlier_reflections=group.reflections,
            key=request_id(_task_id(group.task), group.seed, attempt)))
        group.reflections = (*group.reflections, reflection)
        queue.put_nowait((_RETRY, group.order, next(counter), group))

    async def _judge(self, attempt: JudgeInput, rid: str) -> Verdict:
        """Returns the judge's verdict on `attempt`; an error verdict when the judge raises (a
        judge bug or an endpoint failure it did not catch must not end the whole run)."""
        try:
            verdict = await asyncio.to_thread(self.judge.judge, attempt)
        except Exception as e:  # noqa: BLE001 — recorded in the verdict and logged, not swallowed
            logging.warning("collect: judge %r raised on %s: %s: %s", self.judge.name, rid, type(e).__name__, e)
            return Verdict(outcome=ERROR, reason=f"judge raised {type(e).__name__}: {e}", judge=self.judge.name)
        if not isinstance(verdict, Verdict):
            raise TypeError(f"judge {self.judge.name!r} returned {type(verdict).__name__}; expected a Verdict")
        if verdict.outcome == ERROR:
            logging.warning("collect: judge %r could not decide %s (the group ends unsolved): %s", self.judge.name,
                            rid, verdict.reason)
        return verdict

    def _commit(self, group: _Group, solved: bool, attempt: int) -> None:
        self.store.add_group(group.attempts)
        self._open -= 1
        counts = self._counts
        counts["collected"] += 1
        counts["solved"] += solved
        counts["solved_first"] += solved and attempt == 1
        elapsed = max(time.monotonic() - self._started, 1e-9)
        self._bar.set_postfix({"yield@1": f"{counts['solved_first'] / counts['collected']:.2f}",
                               "yield": f"{counts['solved'] / counts['collected']:.2f}",
                               "steps/s": f"{counts['steps'] / elapsed:.1f}"}, refresh=False)
        self._bar.update(1)

    async def _flush_periodically(self) -> None:
        # Groups that finish slowly still reach disk within flush_every_s.
        while True:
            await asyncio.sleep(1.0)
            self.store.maybe_flush()


def _task_id(task: Any) -> str:
    return str(getattr(task, "id", task))


def _step_records(group: _Group, attempt: int, episode: Episode, outputs: dict[int, PolicyOutput]) -> list[StepRecord]:
    rid = request_id(_task_id(group.task), group.seed, attempt)
    records = []
    for i, action in enumerate(episode.actions):
        if i not in outputs:
            raise RuntimeError(f"{rid}: the policy bridge has no turn recorded for step {i}")
        out, obs, after = outputs[i], episode.observations[i], episode.observations[i + 1]
        thought, action_text = split_turn(out)
        records.append(StepRecord(
            task_id=_task_id(group.task), seed=group.seed, attempt=attempt, request_id=rid, step=i,
            instruction=episode.instruction, screenshot=obs.screenshot, url=obs.url, title=obs.title,
            viewport=tuple(obs.viewport), screenshot_size=tuple(obs.screenshot_size), coordinates=obs.coordinates,
            elements=obs.elements, focused_id=obs.focused_id, last_error=obs.last_error, text=out.text,
            thought=thought, action_text=action_text, action=action, parse_error=out.error,
            exec_error=after.last_error, prompt_tokens=out.prompt_tokens, completion_tokens=out.completion_tokens,
            label=out.label))
    return records


def _trajectory_record(group: _Group, attempt: int, episode: Episode, steps: list[StepRecord], verdict: Verdict,
                       final, final_answer: str | None, policy: str, judge: str) -> TrajectoryRecord:
    task = group.task
    return TrajectoryRecord(
        task_id=_task_id(task), seed=group.seed, attempt=attempt,
        request_id=request_id(_task_id(task), group.seed, attempt),
        task=task.to_dict() if hasattr(task, "to_dict") else {"id": _task_id(task)},
        instruction=episode.instruction, reflections=group.reflections, verdict=verdict, success=verdict.success,
        reward=episode.reward, suite_success=episode.success, num_steps=len(steps), status=episode.status,
        end_reason=episode.reason, done=episode.done, truncated=episode.truncated,
        faults=(*group.faults, *episode.faults),
        final_url="" if final is None else final.url, final_screenshot=None if final is None else final.screenshot,
        final_answer=final_answer, wall_s=episode.wall_s, finished_at=time.time(), policy=policy,
        judge=verdict.judge or judge, prompt_tokens=sum(s.prompt_tokens for s in steps),
        completion_tokens=sum(s.completion_tokens for s in steps),
        parse_errors=sum(s.parse_error is not None for s in steps), recording=episode.recording,
        off_record=episode.off_record)
