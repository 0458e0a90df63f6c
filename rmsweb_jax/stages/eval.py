"""The `eval` stage: each policy of config.eval.policies plays the evaluation tasks x seeds closed loop
(one attempt, no reflection), then the report with intervals, paired comparisons and plots.

    python -m rmsweb_jax.main --config=configs/demo.py --config.stages=eval --workdir=/tmp/run \
        --config.eval.policies=sft,teacher --config.eval.num_seeds=20

    # a live benchmark (the open web, its official LLM judge; not in CI): one run per task
    python -m rmsweb_jax.main --config=configs/demo.py --config.stages=eval --workdir=/tmp/wv \
        --config.collect.suite=webvoyager --config.collect.task_list=/data/WebVoyager_data.jsonl \
        --config.collect.judge=http://judge.example:8000/v1#qwen3-vl-32b --config.eval.num_seeds=1 \
        --config.eval.max_steps=30 --config.eval.policies=sft,qwen=http:http://127.0.0.1:8000/v1#qwen3-vl-8b

Policies (comma-separated; each may be labelled, "<label>=<spec>"): `sft` and `salvage` (that
stage's HF export <workdir>/<stage>/hf, run in-process), `teacher` (ScriptedTeacher with
collect.teacher's mistakes: the collector's attempt-1 behaviour, a reference row and no result),
`hf:/path`, `flax:<model spec>` (e.g. flax:random:tiny), `http:<base_url>#<model>`. The policy's id
is "<label>@<identity>": the weights' digest for an in-process model (sampling/chat_model.py
checkpoint_name; a random preset's written weights too, so its seed counts), a hash of the spec for
an endpoint, a hash of the mistake settings for the teacher. Its episodes go to
<workdir>/eval/<id>/store, so another checkpoint's episodes are never reused and a rerun resumes
(committed task groups are skipped). What else decides an episode (max_steps, the judge, the
sampling, the prompt) is recorded beside the store in settings.json; a rerun with other values is
refused rather than mixed into the same figures.

The environment is config.collect's: suite, task file, judge, workers, step timeout, MiniWoB++'s
time limit, viewport (the same suite_from_config / judge_from_config as the collect stage); eval.tasks
"" takes collect.tasks. Success is the judge's verdict under the "solved" rule whatever collect.success
says (a partial MiniWoB++ reward is a failure).

Seeds: an evaluation on (task, seed) pairs the policy trained on measures memory, not skill. The
stage reads the task groups of the training store (eval.training_store; "" = the collect store)
and refuses every evaluation pair found there, naming some; live suites cannot be seeded, so there
a task id found in the training store is refused. "none" skips the check, with a warning.

Outputs in <workdir>/eval/: eval_report.{json,md,png} (rmsweb_jax/evaluate/report.py),
training_curves.png (the sft and salvage stages' TensorBoard scalars, those present) and, with
eval.viewer, viewer/index.html over every policy's store.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import re
import time

import jax
import ml_collections

from rmsweb_jax import storage
from rmsweb_jax.agents.from_config import PolicySettings, build_policy
from rmsweb_jax.agents.teacher import SOLVED_TASKS
from rmsweb_jax.collect.retries import CollectSettings, RetryCollector
from rmsweb_jax.collect.store import REFLECTION, StoreWriter, TrajectoryStore
from rmsweb_jax.collect.store_layout import RECORDINGS, STORE_FILE
from rmsweb_jax.collect.store_provenance import policy_provenance
from rmsweb_jax.errors import UserError
from rmsweb_jax.evaluate import host_shares, report as eval_report
from rmsweb_jax.evaluate.viewer import write_viewer
from rmsweb_jax.judges.cache import CACHE_DIR, JudgeCache
from rmsweb_jax.judges.from_config import judge_from_config, judge_spec
from rmsweb_jax.models.from_config import host_copy_config
from rmsweb_jax.stages import links
from rmsweb_jax.stages.manifest import COLLECT_RUNTIME, MODEL_LOADING
from rmsweb_jax.suites.from_config import live_tasks, miniwob_tasks, suite_from_config
from rmsweb_jax.suites.task import Task
from rmsweb_jax.web.recording import DamagedRecording, Recording, check_recording

# What the stage reads and writes (rmsweb_jax/stages/manifest.py decides from these whether it is up to date).
# The collect store for the seed check unless eval.training_store names another (or "none"); sft's / salvage's
# export when eval.policies names the stage. (The training-curve plot also draws the sft / salvage logs present:
# a by-product, no dependency.)
CONFIG_READS = ("eval", "collect", "web", "prompt", *MODEL_LOADING, "seed")
INPUT_STAGES = {"collect": "eval.training_store", "sft": "eval.policies", "salvage": "eval.policies"}
OUTPUTS = {"eval/eval_report.json": None}
NON_RESULT_FIELDS = (*COLLECT_RUNTIME, "eval.viewer")  # changed alone: a rerun resumes or skips (manifest.py)

EVAL_DIR = "eval"
REPORT_NAME = "eval_report"
STAGE_EXPORTS = ("sft", "salvage")  # policies named by a stage: its HF export <workdir>/<stage>/hf
SETTINGS_FILE = "settings.json"
NO_CHECK = "none"
_LABEL = re.compile(r"[A-Za-z0-9._-]+")


@dataclasses.dataclass(frozen=True)
class PolicyEntry:
    """One policy to evaluate: its label (in tables and `eval.compare`), the spec
    agents/from_config.py's build_policy takes, and the spec as config.eval.policies wrote it."""

    label: str
    spec: str
    given: str

    @property
    def is_model(self) -> bool:
        return self.spec != "teacher"


def parse_policies(text: str, workdir: pathlib.Path) -> list[PolicyEntry]:
    """Returns the policies of config.eval.policies, in order; raises UserError for an empty list, an
    unknown spec, a stage named whose export is missing, or a label given twice."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise UserError("eval.policies is empty: name at least one policy, e.g. --config.eval.policies=sft,teacher "
                        "(sft | salvage | teacher | hf:/path | flax:<model spec> | http:<base_url>#<model>)")
    entries = []
    for item in items:
        label, sep, spec = item.partition("=")
        if not sep or ":" in label:  # no label (an endpoint's URL may hold "=")
            label, spec = "", item
        label, spec = label.strip(), spec.strip()
        entry = _entry(spec, label, workdir, item)
        if not _LABEL.fullmatch(entry.label):
            raise UserError(f"eval.policies {item!r}: label {entry.label!r} may hold only letters, digits, '.', '_' "
                            "and '-' (give one: '<label>=<spec>')")
        entries.append(entry)
    seen: dict[str, str] = {}
    for e in entries:
        if e.label in seen:
            raise UserError(f"eval.policies: {seen[e.label]!r} and {e.given!r} are both labelled {e.label!r}; label "
                            f"one of them: '<label>={e.given}'")
        seen[e.label] = e.given
    return entries


def _entry(spec: str, label: str, workdir: pathlib.Path, given: str) -> PolicyEntry:
    if spec in STAGE_EXPORTS:
        export = links.folder(workdir, spec) / "hf"
        if not (export / "config.json").is_file():
            raise UserError(f"eval.policies names {spec!r} but {export} holds no HF export (config.json): run the "
                            f"{spec} stage in this workdir with train.export_hf=True first, or name a checkpoint "
                            "with hf:/path")
        return PolicyEntry(label or spec, f"flax:hf:{export}", given)
    if spec == "teacher":
        return PolicyEntry(label or "teacher", "teacher", given)
    kind, _, rest = spec.partition(":")
    if kind == "hf" and rest:
        path = storage.user_path(rest)
        if not (path / "config.json").is_file():
            raise UserError(f"eval.policies {given!r}: {path} holds no HF checkpoint (config.json)")
        name = path.name if storage.is_remote(path) else path.resolve().name
        return PolicyEntry(label or _sanitize(name), f"flax:hf:{path}", given)
    if kind == "flax" and rest:
        return PolicyEntry(label or _sanitize(rest.rstrip("/").rsplit("/", 1)[-1]), spec, given)
    if kind == "http" and rest:
        _, sep, model = rest.rpartition("#")
        if not sep or not model:
            raise UserError(f"eval.policies {given!r}: expected 'http:<base_url>#<model>', e.g. "
                            "'http:http://127.0.0.1:8000/v1#qwen3-vl'")
        return PolicyEntry(label or _sanitize(model), spec, given)
    raise UserError(f"eval.policies {given!r}: unknown policy; expected one of sft, salvage, teacher, hf:/path, "
                    "flax:<model spec> (e.g. flax:random:tiny), http:<base_url>#<model>, each optionally "
                    "'<label>=<spec>'")


def _sanitize(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "policy"


def comparisons(text: str, labels: list[str]) -> list[tuple[str, str]]:
    """Returns the (label a, label b) pairs of config.eval.compare: "" = every policy against the
    first, else "a:b,c:d"; raises UserError naming an unknown label or a malformed pair."""
    if not text.strip():
        return [(labels[0], other) for other in labels[1:]]
    pairs = []
    for item in (i.strip() for i in text.split(",") if i.strip()):
        a, sep, b = item.partition(":")
        if not sep or not a.strip() or not b.strip() or a.strip() == b.strip():
            raise UserError(f"eval.compare {item!r}: expected '<label a>:<label b>' of two policies, e.g. "
                            f"'{labels[0]}:{labels[-1]}'")
        unknown = [x for x in (a.strip(), b.strip()) if x not in labels]
        if unknown:
            raise UserError(f"eval.compare {item!r}: {unknown} not among the policies' labels {labels}")
        pairs.append((a.strip(), b.strip()))
    return pairs


def environment(config) -> ml_collections.ConfigDict:
    """Returns config.collect as the evaluation plays it: eval.tasks (when set) for collect.tasks,
    no task limit beyond collect.limit, success "solved"."""
    env = ml_collections.ConfigDict(config.collect.to_dict())
    if config.eval.tasks:
        env.tasks = config.eval.tasks
    env.success = "solved"
    return env


def eval_tasks(env, entries: list[PolicyEntry]) -> list:
    """Returns the evaluation's tasks (collect's loaders over env.tasks)."""
    if env.suite != "miniwob":
        return live_tasks(env)
    if not env.tasks and any(e.is_model for e in entries):
        raise UserError("eval.tasks and collect.tasks are both empty: name the MiniWoB++ task ids to evaluate a "
                        "model on, e.g. --config.eval.tasks=click-button,click-test")
    return miniwob_tasks(env, SOLVED_TASKS)  # "" = every task type the teacher solves (collect's rule)


def training_store(config, workdir: pathlib.Path) -> pathlib.Path | None:
    """Returns the training store the seeds are checked against (None: eval.training_store = "none")."""
    given = config.eval.training_store
    if given == NO_CHECK:
        return None
    if given:
        return storage.as_path(given)
    return storage.as_path(config.collect.store_dir) if config.collect.store_dir else links.folder(workdir, "store")


def check_disjoint(pairs: list[tuple[str, int]], trained: set[tuple[str, int]], suite: str, source) -> None:
    """Raises UserError naming evaluation pairs found in the training store: (task, seed) pairs for
    MiniWoB++, task ids for the live suites (which cannot be seeded)."""
    if suite == "miniwob":
        seen = sorted(set(pairs) & trained)
        if seen:
            last = max(s for _, s in trained)
            raise UserError(f"eval seeds overlap the training store {source}: {len(seen)} (task, seed) pairs were "
                            f"trained on, e.g. {seen[:3]}; set eval.first_seed past the trained seeds (e.g. "
                            f"--config.eval.first_seed={last + 1}), or eval.training_store to the store trained on")
        return
    seen = sorted({t for t, _ in pairs} & {t for t, _ in trained})
    if seen:
        raise UserError(f"eval tasks of the live {suite} suite are in the training store {source}: {len(seen)} task "
                        f"ids, e.g. {seen[:3]} (live sites cannot be seeded apart); evaluate on other tasks "
                        "(eval.tasks or another collect.task_list)")


def check_training_seeds(config, workdir: pathlib.Path, pairs: list[tuple[str, int]], suite: str) -> None:
    """Checks the evaluation pairs against the training store (see check_disjoint); prints a warning
    when eval.training_store is "none"; raises UserError when the store is missing."""
    store = training_store(config, workdir)
    if store is None:
        print("[eval] WARNING: eval.training_store = 'none': the evaluation seeds are NOT checked against the seeds "
              "the policies trained on")
        return
    if not (store / STORE_FILE).is_file():
        raise UserError(f"eval.training_store: no trajectory store at {store} ({STORE_FILE} missing) to check the "
                        "evaluation seeds against; name the store the policies trained on "
                        "(--config.eval.training_store=/path/to/store), or 'none' to skip the check")
    with TrajectoryStore(store) as reader:
        trained = reader.finished_task_keys()
    check_disjoint(pairs, trained, suite, store)


def identity(entry: PolicyEntry, policy, settings_teacher: dict) -> str:
    """Returns the policy id "<label>@<identity>" (see the module docstring)."""
    if entry.spec == "teacher":
        digest = _digest(settings_teacher)
    elif entry.spec.startswith("flax:"):
        digest = policy.name.rpartition("@")[2]  # "flax:<folder>@<weights digest>" (checkpoint_name)
    else:
        digest = _digest(entry.spec)
    return f"{entry.label}@{digest}"


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:10]


def episode_settings(config, env, entry: PolicyEntry) -> dict:
    """Returns what, besides the policy, decides the meaning of its stored episodes."""
    judge, endpoint = judge_spec(env)
    out = {"suite": env.suite, "max_steps": config.eval.max_steps, "judge": judge, "judge_endpoint": endpoint,
           "success": env.success, "episode_time_limit_s": env.episode_time_limit_s}
    if config.eval.replay:  # a replay's episodes are not a live run's
        out["replay"] = config.eval.replay
    if entry.is_model:
        out.update(max_new_tokens=config.eval.max_new_tokens, temperature=config.eval.temperature,
                   prompt=config.prompt.to_dict())
    return json.loads(json.dumps(out))  # tuples as lists, as they read back


def check_settings(directory: pathlib.Path, settings: dict) -> None:
    """Records `settings` in directory/settings.json, or raises UserError when an earlier run there
    recorded other values (its episodes would be mixed with these)."""
    path = directory / SETTINGS_FILE
    if path.is_file():
        old = json.loads(path.read_text())
        differ = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
        if differ:
            raise UserError(f"{directory}: its episodes were played with other settings ({', '.join(differ)}: "
                            f"then {[old.get(k) for k in differ]}, now {[settings.get(k) for k in differ]}); set them "
                            f"back to resume there, or delete {directory} to evaluate afresh")
        return
    storage.write_text_atomic(path, json.dumps(settings, indent=2, sort_keys=True))


def play(env, settings: CollectSettings, policy, judge, store_dir: pathlib.Path, pairs: list[tuple]):
    """Returns the CollectSummary of `policy` playing the (task, seed) pairs with `settings` (one attempt each:
    check_config's, with this policy's batch window and the replay's recordings) into the store at store_dir
    (through RetryCollector, so exactly as the collect stage plays; pairs already in the store are skipped). env
    is a config.collect-shaped block (its suite and the store's flush cadence).

    With several processes each plays its share of the pairs into its own part store and process 0
    merges the parts into store_dir (evaluate/host_shares.py); the summary is this process's."""
    target, pairs = host_shares.this_hosts_share(store_dir, pairs)
    with suite_from_config(env) as suite, StoreWriter(target, flush_every_tasks=env.flush_every_tasks,
                                               flush_every_s=env.flush_every_s, policy=policy.name,
                                               provenance=policy_provenance(policy)) as store:
        summary = RetryCollector(suite, policy, judge, store, settings).run_pairs(pairs)
    host_shares.merge_when_played(store_dir, "eval")
    return summary


def _check_fields(ev) -> None:
    for key in ("num_seeds", "max_steps", "max_new_tokens", "bootstrap_samples"):
        if isinstance(ev[key], bool) or not isinstance(ev[key], int) or ev[key] < 1:
            raise UserError(f"eval.{key} must be an int >= 1, got {ev[key]!r}")
    if isinstance(ev.first_seed, bool) or not isinstance(ev.first_seed, int) or ev.first_seed < 0:
        raise UserError(f"eval.first_seed must be an int >= 0, got {ev.first_seed!r}")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _ci(interval) -> str:
    return f"{100 * interval[0]:.1f}-{100 * interval[1]:.1f}%"


def policy_settings(config, env) -> PolicySettings:
    """Returns what building an evaluated policy takes besides its spec (env: environment(config))."""
    ev = config.eval
    return PolicySettings(suite=env.suite, max_batch=env.workers, max_new_tokens=ev.max_new_tokens,
                          temperature=ev.temperature, teacher=dict(env.teacher.to_dict()),
                          api_key_env=env.api_key_env, key="eval.policies")


def check_config(config, workdir) -> CollectSettings:
    """Returns the settings every policy's episodes are played with (config.collect's retry loop and config.web's
    browsers; one attempt, eval.max_steps steps) once config.eval's fields and the environment it plays
    (config.collect with eval.tasks: judge, retry-loop settings) check; raises UserError naming the key.
    eval.policies is checked when the stage starts: it may name the exports of stages that have not run yet. The
    pipeline calls it before any stage runs (stages/pipeline.py check_stages), run() as its first step."""
    ev = config.eval
    _check_fields(ev)
    env = environment(config)
    judge_spec(env)
    settings = CollectSettings.from_config(env, config.web)
    if ev.replay and settings.record:
        raise UserError(f"eval.replay {ev.replay!r} with collect.record = {settings.record!r}: a replay serves "
                        "every request from its recordings; set collect.record='' to replay")
    policy_settings(config, env)
    return dataclasses.replace(settings, attempts=1, retry_mode=REFLECTION, max_steps=ev.max_steps,
                               progress_label="eval")


def replay_pairs(store_dir) -> tuple[pathlib.Path, list[tuple[Task, int]]]:
    """Returns (the recordings folder, the recorded (task, seed) pairs) of the store eval.replay names: each task
    group's first attempt, its recording checked against the sha256 the store recorded. Raises UserError naming
    the store when it holds no recorded episode, or the file when a recording is missing or damaged."""
    store_dir = storage.as_path(store_dir)
    if not (store_dir / STORE_FILE).is_file():
        raise UserError(f"eval.replay: no trajectory store at {store_dir} ({STORE_FILE} missing); name a store "
                        "recorded with --config.collect.record=har")
    recordings = store_dir / RECORDINGS
    pairs = []
    with TrajectoryStore(store_dir) as store:
        for key, group in sorted(store.groups().items()):
            first = group[0]
            if first.attempt != 1 or not first.recording:
                continue
            try:
                check_recording(recordings, Recording.from_dict(first.recording))
            except DamagedRecording as e:
                raise UserError(f"eval.replay: {e}") from None
            pairs.append((Task.from_dict(first.task), first.seed))
    if not pairs:
        raise UserError(f"eval.replay: the store at {store_dir} holds no recorded episode; record one with "
                        "--config.collect.record=har")
    return recordings, pairs


def run(config, workdir: pathlib.Path) -> dict:
    """Plays every policy of config.eval on the evaluation tasks x seeds and writes
    workdir/eval/{eval_report.*, training_curves.png, viewer/}; returns the report, with "seconds": the
    wall time of playing, of the report (and plots) and of the viewer."""
    ev = config.eval
    workdir = storage.as_path(workdir)  # local, or gs:// (stores through their mirrors, reports written there)
    out_dir = workdir / EVAL_DIR
    episodes = check_config(config, workdir)
    # Every mistake a user can make is caught here, before a browser starts or a model loads.
    entries = parse_policies(ev.policies, workdir)
    compare = comparisons(ev.compare, [e.label for e in entries])
    writer = jax.process_index() == 0  # on several hosts each plays its share (play); one writes the outputs
    # Each host's browsers ask for steps at their own pace, so the hosts never call a sampling program in
    # lockstep: on several, each host samples an in-process model on its own devices (weights read by every host),
    # in the compute dtype on the mesh models/from_config.py fits to one host.
    devices = jax.local_devices() if jax.process_count() > 1 else None
    model_config = config if devices is None else host_copy_config(config)
    env = environment(config)
    judge = judge_from_config(env)
    if ev.replay:  # the recorded task groups, every request served from their recordings
        recordings, played = replay_pairs(ev.replay)
        tasks, seeds = list({t.id: t for t, _ in played}.values()), sorted({s for _, s in played})
    else:
        recordings, tasks = None, eval_tasks(env, entries)
        seeds = list(range(ev.first_seed, ev.first_seed + ev.num_seeds))
        played = [(t, s) for t in tasks for s in seeds]
    pairs = [(t.id, s) for t, s in played]
    check_training_seeds(config, workdir, pairs, env.suite)
    settings = policy_settings(config, env)
    if env.suite != "miniwob" and any(e.spec == "teacher" for e in entries):
        build_policy("teacher", settings, config=config, workdir=workdir, task_ids=[])  # raises: MiniWoB++ only
    if env.suite != "miniwob" and len(seeds) > 1:
        print(f"[eval] live sites cannot be seeded: each of the {len(seeds)} seeds is one more independent run")
    print(f"[eval] {len(entries)} policies x {len(tasks)} tasks x seeds {seeds[0]}..{seeds[-1]}, one attempt, "
          f"max {ev.max_steps} steps, {env.workers} workers, judge {judge.name}, success solved; in {out_dir}")
    if recordings is not None:
        print(f"[eval] replaying {len(played)} recorded episodes offline from {recordings} (a request the recording "
              "lacks is refused and its episode reported off_record, apart from the figures)")

    policies, seconds = [], {"play": 0.0, "report": 0.0, "viewer": 0.0}
    started = time.perf_counter()
    for entry in entries:
        policy = build_policy(entry.spec, settings, config=model_config, workdir=workdir,
                              task_ids=[t.id for t in tasks], devices=devices)
        try:
            policy_id = identity(entry, policy, settings.teacher)
            directory = out_dir / policy_id
            if writer:
                check_settings(directory, episode_settings(config, env, entry))
            if entry.spec == "teacher":
                print("[eval] teacher: the ScriptedTeacher with collect.teacher's mistakes (a reference row, no "
                      "result)")
            # The scripted teacher answers each step alone: a batch window would only delay it (~10% of
            # the wall time at collect.batch_window_s = 20 ms, bench/eval_throughput.py).
            window = env.batch_window_s if entry.is_model else 0.0
            if env.record or recordings is not None:  # judge replies cached in the store (judges/cache.py)
                cache = JudgeCache(directory / "store" / CACHE_DIR,
                                   read_also=() if recordings is None else (recordings.parent / CACHE_DIR,))
                judge = judge_from_config(env, cache=cache)
            summary = play(env, dataclasses.replace(episodes, batch_window_s=window,
                                                    replay="" if recordings is None else str(recordings)),
                           policy, judge, directory / "store", played)
        finally:
            policy.close()
        policies.append({"id": policy_id, "label": entry.label, "store_dir": str(directory / "store")})
        overall = eval_report.policy_figures(directory / "store", set(pairs), bootstrap_samples=ev.bootstrap_samples,
                                             seed=ev.bootstrap_seed)["overall"]
        print(f"[eval] {policy_id}: {overall['solved']}/{overall['episodes']} solved = {_pct(overall['success'])} "
              f"(95% CI Wilson {_ci(overall['ci95'])}, task-clustered bootstrap {_ci(overall['ci95_bootstrap'])}); "
              f"this run played {summary.collected} task groups, {summary.skipped} were stored already, "
              f"{summary.wall_s:.1f} s" + (f"; {overall['off_record']} went off their recording (not counted)"
                                           if overall["off_record"] else ""))
        for endpoint, why in summary.endpoints_down.items():
            print(f"[eval] the remote Chromium at {endpoint} went down for good; its episodes ran on the other "
                  f"endpoints ({why})")

    seconds["play"] = time.perf_counter() - started
    started = time.perf_counter()
    labels = {p["label"]: p["id"] for p in policies}
    report = eval_report.build_report(policies, set(pairs), compare, bootstrap_samples=ev.bootstrap_samples,
                                      seed=ev.bootstrap_seed)
    if writer:
        eval_report.write_report(report, out_dir, name=REPORT_NAME)
    for c in report["comparisons"]:
        head = f"[eval] {labels[c['a']]} vs {labels[c['b']]} on {c['n']} shared pairs"
        if not c["n"]:
            print(f"{head}: nothing to compare")
            continue
        print(f"{head}: {_pct(c['success_a'])} vs {_pct(c['success_b'])}, difference {100 * c['difference']:+.1f} "
              f"points (paired bootstrap 95% CI {100 * c['ci95'][0]:+.1f} to {100 * c['ci95'][1]:+.1f}), McNemar "
              f"exact p = {c['mcnemar']['p']:.3g}")
    curves = _training_curves(workdir, out_dir) if writer else None
    seconds["report"] = time.perf_counter() - started
    started = time.perf_counter()
    if ev.viewer and writer:
        index = write_viewer([p["store_dir"] for p in policies], out_dir / "viewer",
                             labels=[p["label"] for p in policies])
        print(f"[eval] trajectory viewer: {index}")
    seconds["viewer"] = time.perf_counter() - started
    if writer:
        print(f"[eval] report {out_dir / (REPORT_NAME + '.md')}" + (f"; training curves {curves}" if curves else ""))
    return {**report, "seconds": {k: round(v, 3) for k, v in seconds.items()}}


def _training_curves(workdir: pathlib.Path, out_dir: pathlib.Path) -> pathlib.Path | None:
    """Writes out_dir/training_curves.png from the sft / salvage TensorBoard logs present; returns its path."""
    logs = {stage: links.folder(workdir, stage) / "tensorboard" for stage in STAGE_EXPORTS}
    logs = {stage: log for stage, log in logs.items() if log.is_dir()}
    if not logs:
        return None
    from rmsweb_jax.evaluate.plots import training_curves_png  # deferred: the event reader imports tensorboardX (~1 s)
    from rmsweb_jax.evaluate.tb_events import read_scalars  # deferred with the plots: only this report reads them
    curves = {stage: c for stage, c in ((stage, read_scalars(storage.pull_tree(log))) for stage, log in logs.items())
              if c}
    if not curves:
        return None
    path = out_dir / "training_curves.png"
    training_curves_png(curves, path)
    return path
