"""Stage manifests: what a stage read (config fields, its input stages' manifests) and wrote, so that
run_stages can skip a stage that is up to date and say why it reruns one that is not.

Each stage module declares, at its top:
- CONFIG_READS: the config sections or dotted fields it (and the helpers it calls) reads, e.g.
  ("salvage", "train", "data.buckets", *MODEL_LOADING, "seed");
- INPUT_STAGES: {stage: None | config key}: the stages whose outputs it reads. With a key, the
  dependency holds only while that key leaves the default path in place: its value is "" or names
  the stage among its comma-separated items (eval.policies = "sft,teacher" reads sft's export). A
  key that points elsewhere (mine.checkpoint = "hf:/ckpt", salvage.states = "/x.arrayrecord",
  eval.training_store = "none") drops the dependency: the path itself is a config field the stage
  reads, so changing it reruns the stage, but the files behind it are the user's, not hashed (a
  checkpoint can be 16 GB);
- OUTPUTS: {workdir-relative path: None | config key whose non-empty value replaces the path}: what
  must still be there for the stage to count as done. Those present when the stage completes are
  recorded with a fingerprint (a file: bytes and sha256, up to HASH_LIMIT; a folder: file count and
  bytes); a declared path the run did not write (sft/hf with train.export_hf=False) is not required.

The manifests live in <workdir>/manifests/<stage>.json rather than in each stage's folder: the
collect and model stages have no folder of their own (store/, collect_report.*, model_smoke.json),
and a manifest kept apart from the outputs survives their deletion, so the rerun can say "its
output mine/states.arrayrecord is missing" instead of "never ran".

A manifest is written (atomically) with complete = false when its stage starts and rewritten with
complete = true, the outputs and the times when it ends. A dependant records the sha256 of each input
stage's manifest file: a rerun of the input rewrites that file (new times), so the dependant reruns
too, and so on down the pipeline. `--config.rerun=mine,salvage` (or `all`) reruns stages whatever their
manifests say.

- FRESH_START (optional, default none): the workdir folders that hold the stage's training state (sft/,
  mine/, salvage/). A stage that reruns because something it read changed (a config field, an input
  stage, an output, config.rerun) must not resume from the state of the old inputs: those folders are
  moved, not deleted, to <workdir>/stale/<stage>-<UTC time>/ first, and the stage starts afresh. A stage
  whose last run did not complete resumes instead (its checkpoint, its store), as it does alone. Stages
  with none resume whatever the reason: collect and eval keep their stores, which refuse episodes of
  another policy or settings themselves (a store per policy identity under eval/).
- NON_RESULT_FIELDS (optional, default none): the fields among CONFIG_READS that cannot change what the stage
  computes: logging and checkpoint cadence, progress bars, browser workers, viewers (TRAINER_CADENCE,
  COLLECT_RUNTIME below). A change to them alone does not rerun a stage afresh: a stage whose last run did not
  complete resumes, a completed one is skipped as done, each saying which of them changed. The manifest keeps
  them apart from the other fields ("settings", dotted field -> value, beside "config"), and the digest a
  dependant records leaves them out (manifest_digest), so a completed stage's manifest takes their new values
  on a skip without rerunning the stages after it. A field that could change a result, however rarely, is not
  one of them: data.worker_count changes the Grain iterator state a checkpoint holds (a resume would fail).
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import pathlib

from rmsweb_jax import storage
from rmsweb_jax.durable import file_sha256
from rmsweb_jax.errors import UserError

MANIFEST_DIR = "manifests"
STALE_DIR = "stale"  # FRESH_START folders of stages rerun afresh, moved here (see set_aside)
HASH_LIMIT = 64 << 20  # files up to 64 MiB are fingerprinted by content; larger ones by size and mtime
# What loading a model reads besides model.init (rmsweb_jax/model_init.py, models/from_config.py):
# stages that load a checkpoint they name themselves (mine.checkpoint, salvage.init, eval's policies) read
# these, not model.init, so a new model.init for sft does not rerun them by itself.
MODEL_LOADING = ("model.param_dtype", "model.compute_dtype", "model.remat_policy", "model.attention_impl",
                 "model.scan_layers", "model.decode_layout", "model.decode_sharding", "model.group_decode",
                 "model.decode_compaction", "model.vision_window", "mesh", "sharding_rules")
# Fields that cannot change results (NON_RESULT_FIELDS), shared by the stages that read them.
# The trainer's (train/loop.py), whole blocks: train.metrics (what is logged, how often, where to; the MFU's
# peak, a reported figure), train.checkpoint (when state is saved, how many kept, async or not), and the
# steps a jax.profiler trace records (train.profile_steps: it observes, and waits for its steps' results). A
# resume from another checkpoint step is exact: the state, the data-iterator position and the RNG are saved.
TRAINER_CADENCE = ("train.metrics", "train.checkpoint", "train.profile_steps")
# The browser side of collect and eval (config.collect): the progress bar, how many browsers play at once and
# how long a policy batch waits for them, how often the store commits a shard pair, the HTML viewer. Episodes
# are seeded per (task, seed) and stored whole, so none of these decides what is in the store; a model policy
# batches the same prompts differently (equal up to float rounding of padded rows).
COLLECT_RUNTIME = ("collect.progress", "collect.workers", "collect.batch_window_s", "collect.flush_every_tasks",
                   "collect.flush_every_s", "collect.viewer")
ALL = "all"
MISSING = "<not in the config>"


@dataclasses.dataclass(frozen=True)
class Declaration:
    """What a stage module declares it reads and writes (see the module docstring)."""

    stage: str
    config_reads: tuple[str, ...]
    input_stages: dict[str, str | None]
    outputs: dict[str, str | None]
    fresh_start: tuple[str, ...] = ()
    non_result: tuple[str, ...] = ()  # NON_RESULT_FIELDS: dotted fields among config_reads

    def is_non_result(self, path: str) -> bool:
        """Returns whether the dotted config leaf `path` is (under) one of the stage's NON_RESULT_FIELDS."""
        return any(path == f or path.startswith(f + ".") for f in self.non_result)

    @classmethod
    def of(cls, stage: str, module) -> "Declaration":
        """Returns the declaration of `module` (the stage's module); raises ValueError when one is missing."""
        missing = [k for k in ("CONFIG_READS", "INPUT_STAGES", "OUTPUTS") if not hasattr(module, k)]
        if missing:
            raise ValueError(f"stage {stage!r} ({module.__name__}) declares no {', '.join(missing)} "
                             "(see rmsweb_jax/stages/manifest.py)")
        return cls(stage, tuple(module.CONFIG_READS), dict(module.INPUT_STAGES), dict(module.OUTPUTS),
                   tuple(getattr(module, "FRESH_START", ())), tuple(getattr(module, "NON_RESULT_FIELDS", ())))


@dataclasses.dataclass(frozen=True)
class Decision:
    """Whether a stage runs, and why (printed as "[<stage>] running: ..." or "[<stage>] skipped: ..."); `fresh`:
    it reruns because something it read changed, so its FRESH_START folders are set aside first."""

    run: bool
    reason: str
    fresh: bool = False
    settings_changed: bool = False  # a skipped stage whose NON_RESULT_FIELDS changed: record_settings records them


def lookup(config, dotted: str):
    """Returns the value at the dotted path of `config` ("<not in the config>" when absent)."""
    node = config
    for part in dotted.split("."):
        if part not in node:
            return MISSING
        node = node[part]
    return node


def _canonical(value):
    if hasattr(value, "to_dict"):
        value = value.to_dict()
    return json.loads(json.dumps(value, sort_keys=True, default=str))  # tuples as lists, as they read back


def config_fields(config, reads, non_result: tuple[str, ...] = ()) -> dict:
    """Returns {declared section or field: its value as canonical JSON} of `config`, without the leaves under
    `non_result` (dotted fields; settings_fields holds those)."""
    fields = {path: _canonical(lookup(config, path)) for path in sorted(set(reads))}
    for field in non_result:
        _drop(fields, field)
    return fields


def _drop(fields: dict, dotted: str) -> None:
    """Removes the dotted leaf from nested `fields` (keyed by declared section), and the dicts it leaves empty."""
    for section in list(fields):
        if dotted == section:
            del fields[section]
        elif dotted.startswith(section + "."):
            _drop_path(fields, [section, *dotted[len(section) + 1:].split(".")])


def _drop_path(node: dict, parts: list[str]) -> None:
    head = parts[0]
    if len(parts) == 1:
        node.pop(head, None)
    elif isinstance(node.get(head), dict):
        _drop_path(node[head], parts[1:])
        if not node[head]:
            del node[head]


def settings_fields(decl: Declaration, config) -> dict:
    """Returns {dotted field or block: canonical value} of the stage's NON_RESULT_FIELDS in `config`."""
    return {path: _canonical(lookup(config, path)) for path in sorted(set(decl.non_result))}


def digest(value) -> str:
    """Returns the sha256 of `value` serialized canonically (sorted keys, no whitespace)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _names(value) -> list[str]:
    # "sft,teacher" / "tuned=sft" -> ["sft", "teacher"]: the spec after a label
    return [item.strip().rpartition("=")[2].strip() for item in str(value).split(",") if item.strip()]


def input_stages(decl: Declaration, config) -> list[str]:
    """Returns the stages whose outputs the stage reads under `config` (see INPUT_STAGES)."""
    out = []
    for stage, key in decl.input_stages.items():
        value = "" if key is None else lookup(config, key)
        if value == "" or stage in _names(value):
            out.append(stage)
    return sorted(out)


def output_paths(decl: Declaration, config, workdir: pathlib.Path) -> dict[str, pathlib.Path]:
    """Returns {declared output: its path} under `config` (a set key replaces the workdir path)."""
    out = {}
    for rel, key in decl.outputs.items():
        value = None if key is None else lookup(config, key)
        out[rel] = storage.as_path(value) if value and value != MISSING else storage.as_path(workdir) / rel
    return out


def fingerprint(path: pathlib.Path) -> dict | None:
    """Returns what identifies the file or folder at `path` (None when absent): a file's bytes and sha256
    (bytes and mtime above HASH_LIMIT), a folder's file count and bytes; on a bucket too."""
    if storage.is_remote(path):
        return _remote_fingerprint(storage.as_path(path))
    if path.is_file():
        size = path.stat().st_size
        if size <= HASH_LIMIT:
            return {"kind": "file", "bytes": size, "sha256": file_sha256(path)}
        return {"kind": "file", "bytes": size, "mtime_ns": path.stat().st_mtime_ns}
    if path.is_dir():
        files = [p for p in path.rglob("*") if p.is_file()]
        return {"kind": "folder", "files": len(files), "bytes": sum(p.stat().st_size for p in files)}
    return None


def _remote_fingerprint(path) -> dict | None:
    """Returns fingerprint() of a bucket object or folder (GCS keeps no mtime_ns: its seconds stand in)."""
    if path.is_file():
        stat = path.stat()
        if stat.length <= HASH_LIMIT:
            return {"kind": "file", "bytes": stat.length, "sha256": storage.file_digest(path)}
        return {"kind": "file", "bytes": stat.length, "mtime_ns": int(stat.mtime) * 10**9}
    files = storage.remote_files(path)
    if files:
        return {"kind": "folder", "files": len(files), "bytes": sum(files.values())}
    return None


def manifest_path(workdir: pathlib.Path, stage: str) -> pathlib.Path:
    """Returns where `stage`'s manifest lives: <workdir>/manifests/<stage>.json."""
    return storage.as_path(workdir) / MANIFEST_DIR / f"{stage}.json"


def read_manifest(workdir: pathlib.Path, stage: str) -> dict | None:
    """Returns `stage`'s manifest in `workdir`, or None when there is none (or it cannot be read)."""
    path = manifest_path(workdir, stage)
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def manifest_digest(workdir: pathlib.Path, stage: str) -> str | None:
    """Returns the sha256 of `stage`'s manifest as written but without its "settings" (None when absent): what
    a dependant records. A manifest without settings (one written before they were kept apart) digests as its
    file's bytes, so the digests its dependants recorded still hold."""
    manifest = read_manifest(workdir, stage)
    if manifest is None:
        return None
    return hashlib.sha256(_serialized({k: v for k, v in manifest.items() if k != "settings"}).encode()).hexdigest()


def _serialized(value: dict) -> str:
    return json.dumps(value, indent=2, sort_keys=True)


def write_json_atomic(path: pathlib.Path, value: dict) -> None:
    """Writes `value` as JSON to `path` whole or not at all (a synced temp file renamed into place; on a bucket
    one object upload)."""
    storage.write_text_atomic(path, _serialized(value))


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


def started(decl: Declaration, config, workdir: pathlib.Path) -> dict:
    """Writes and returns the incomplete manifest of a stage about to run: config fields (those that can change
    results; its NON_RESULT_FIELDS apart, as "settings"), input digests."""
    fields = config_fields(config, decl.config_reads, decl.non_result)
    manifest = {"stage": decl.stage, "complete": False, "started_at": _now(), "config": fields,
                "settings": settings_fields(decl, config), "config_digest": digest(fields),
                "inputs": {s: manifest_digest(workdir, s) for s in input_stages(decl, config)}}
    write_json_atomic(manifest_path(workdir, decl.stage), manifest)
    return manifest


def completed(decl: Declaration, manifest: dict, config, workdir: pathlib.Path, seconds: float) -> dict:
    """Writes and returns the complete manifest: `manifest` (from started) with the outputs and the times."""
    outputs = {}
    for rel, path in output_paths(decl, config, workdir).items():
        found = fingerprint(path)
        if found is not None:
            outputs[rel] = {"path": str(path), **found}
    done = {**manifest, "complete": True, "finished_at": _now(), "seconds": round(seconds, 2), "outputs": outputs}
    write_json_atomic(manifest_path(workdir, decl.stage), done)
    return done


def record_settings(decl: Declaration, config, workdir: pathlib.Path) -> dict:
    """Writes and returns the stage's manifest with its NON_RESULT_FIELDS' values of `config` ("settings"), the
    rest as it was: a skipped stage's record of what it was last run with. Its digest stays (manifest_digest)."""
    manifest = {**read_manifest(workdir, decl.stage), "settings": settings_fields(decl, config)}
    write_json_atomic(manifest_path(workdir, decl.stage), manifest)
    return manifest


def flatten(value, prefix: str = "") -> dict:
    """Returns {dotted path: leaf} of nested dicts (an empty dict is a leaf)."""
    if isinstance(value, dict) and value:
        out = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else k))
        return out
    return {prefix: value}


def changed_fields(old: dict, new: dict) -> list[str]:
    """Returns "key (old -> new)" for every config leaf that differs between two config_fields records."""
    a, b = flatten(old), flatten(new)
    return [f"{k} ({_short(a.get(k, MISSING))} -> {_short(b.get(k, MISSING))})"
            for k in sorted(set(a) | set(b)) if a.get(k, MISSING) != b.get(k, MISSING)]


def _leaves(config_record: dict, settings: dict) -> dict:
    """Returns {dotted config leaf: value} of a manifest's "config" and its "settings" (these win: a skip rewrote
    them, and an older manifest's "config" still holds the NON_RESULT_FIELDS)."""
    return {**(flatten(config_record) if config_record else {}), **(flatten(settings) if settings else {})}


def _listed(changed: list[str]) -> str:
    more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
    return f"{', '.join(changed[:3])}{more}"


def _short(value) -> str:
    text = json.dumps(value) if value != MISSING else "absent"
    return text if len(text) <= 60 else text[:57] + "..."


def _output_problem(stage_manifest: dict) -> str | None:
    """Returns why the recorded outputs of a manifest no longer hold (missing, changed), or None."""
    for rel, recorded in stage_manifest.get("outputs", {}).items():
        path = storage.as_path(recorded["path"])
        now = fingerprint(path)
        if now is None:
            return f"output {rel} is missing ({path}: deleted?)"
        if {k: v for k, v in recorded.items() if k != "path"} != now:
            return f"output {rel} changed since it completed ({path})"
    return None


def decide(decl: Declaration, config, workdir: pathlib.Path, *, forced: bool) -> Decision:
    """Returns whether the stage runs: it is skipped only when its manifest is complete, its config
    fields equal (NON_RESULT_FIELDS aside: a change to those alone is named, and recorded on a skip), its input
    stages' manifests the ones it read, complete and with their outputs, and its own outputs present and
    unchanged; else the first reason it is not up to date."""
    if forced:
        return Decision(True, "forced by config.rerun", fresh=True)
    old = read_manifest(workdir, decl.stage)
    if old is None:
        return Decision(True, f"no manifest ({manifest_path(workdir, decl.stage)}): first run in this workdir")
    then = _leaves(old.get("config", {}), old.get("settings", {}))
    now = _leaves(config_fields(config, decl.config_reads, decl.non_result), settings_fields(decl, config))
    keys = [k for k in sorted(set(then) | set(now)) if then.get(k, MISSING) != now.get(k, MISSING)]
    results = changed_fields({k: then.get(k, MISSING) for k in keys if not decl.is_non_result(k)},
                             {k: now.get(k, MISSING) for k in keys if not decl.is_non_result(k)})
    if results:  # also after an interrupted run: its state is the old config's
        return Decision(True, f"config changed: {_listed(results)}", fresh=True)
    settings = changed_fields({k: then.get(k, MISSING) for k in keys}, {k: now.get(k, MISSING) for k in keys})
    only = (f"; only fields that cannot change results changed: {_listed(settings)}" if settings else "")
    if not old.get("complete"):
        return Decision(True, f"its last run (started {old.get('started_at')}) did not complete: resuming{only}")
    wanted, recorded = input_stages(decl, config), old.get("inputs", {})
    if sorted(recorded) != wanted:
        return Decision(True, f"its input stages changed (then {sorted(recorded) or 'none'}, now {wanted or 'none'})",
                        fresh=True)
    for stage in wanted:
        theirs = read_manifest(workdir, stage)
        if theirs is None:
            return Decision(True, f"input stage {stage} has no manifest (deleted, or {stage} never ran here)",
                            fresh=True)
        if not theirs.get("complete"):
            return Decision(True, f"input stage {stage} did not complete (started {theirs.get('started_at')})",
                            fresh=True)
        if manifest_digest(workdir, stage) != recorded[stage]:
            return Decision(True, f"input stage {stage} reran (finished {theirs.get('finished_at')})", fresh=True)
        problem = _output_problem(theirs)
        if problem:
            return Decision(True, f"input stage {stage}'s {problem}", fresh=True)
    problem = _output_problem(old)
    if problem:
        return Decision(True, f"its {problem}", fresh=True)
    inputs = f"inputs {', '.join(wanted)} unchanged" if wanted else "no input stages"
    if settings:
        return Decision(False, f"done (completed {old.get('finished_at')}): only fields that cannot change results "
                               f"changed, now recorded: {_listed(settings)}; {inputs}, "
                               f"{len(old.get('outputs', {}))} outputs present", settings_changed=True)
    return Decision(False, f"up to date (completed {old.get('finished_at')}; config unchanged, {inputs}, "
                           f"{len(old.get('outputs', {}))} outputs present)")


def forced_stages(rerun, stages: list[str], known) -> set[str]:
    """Returns the stages config.rerun forces ("all", or comma-separated names among config.stages);
    raises UserError naming an unknown stage or one this run does not run."""
    parts = [rerun] if isinstance(rerun, str) else list(rerun)
    names = [n.strip() for part in parts for n in str(part).split(",") if n.strip()]
    if ALL in names:
        return set(stages)
    unknown = [n for n in names if n not in known]
    absent = [n for n in names if n in known and n not in stages]
    if unknown or absent:
        what = f"unknown stage(s) {unknown}" if unknown else f"{absent}, not among config.stages {stages}"
        raise UserError(f"config.rerun = {rerun!r} names {what}; expected 'all' or comma-separated stages of "
                        f"config.stages (e.g. --config.rerun={stages[-1]})")
    return set(names)


def set_aside(decl: Declaration, workdir: pathlib.Path) -> pathlib.Path | None:
    """Moves the stage's FRESH_START folders that exist to <workdir>/stale/<stage>-<UTC time>/ (so the
    stage starts afresh and nothing is lost); returns that folder, or None when there was nothing to move."""
    workdir = storage.as_path(workdir)
    present = [rel for rel in decl.fresh_start if (workdir / rel).exists()]
    if not present:
        return None
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    target = workdir / STALE_DIR / f"{decl.stage}-{stamp}"
    target.mkdir(parents=True)
    for rel in present:  # a rename locally; on a bucket a copy then a delete (GCS has no rename)
        storage.move_tree(workdir / rel, target / rel)
    return target
