"""The `table` stage: RMSWeb's table (collection, policies on held-out seeds, mining), demo_table.{md,json}.

    python -m rmsweb_jax.main --config=configs/demo.py --workdir=/tmp/run \
        --config.stages=collect,ground,sft,mine,salvage,eval,table [--config.ablations=all] [--config.rl_seeds=2]

The rows the main stages do not give are run as variants, each in <workdir>/variants/<name>/ through the
same stage runner (rmsweb_jax/stages/pipeline.py) with a copy of the config and a few fields changed, so
their stages are skipped and rerun by their own manifests exactly as the main ones:
- plain_collect: collect with collect.retry_mode = "plain" (same tasks, seeds, K) into its own store;
- sft_first: sft on the same store with data.attempts = "first", then eval of that SFT;
- transfer: the transfer stage (rmsweb_jax/stages/transfer.py) on the main sft, mine and salvage outputs: SFT vs
  RMSWeb on Salvage-DS's training states and on sft's held-out task groups, so the table tells "RL learned
  nothing" from "RL memorised its states";
- the ablations config.ablations names ("all", or some of ABLATION_NAMES): salvage_<piece> (salvage + eval from
  the main SFT export and state set, one piece of Salvage-DS switched: reward partial_credit / graded, gates none /
  contrast, anchor off, KL off) and rl_all_states, the ablation that tests mining: the same state budget drawn from
  all the training steps, routine ones included (mine with config.mine.uniform_states = the main state set's size,
  read from mine/summary.json, a draw that config.mine.max_states does not cap; then salvage, same number of
  updates, and eval). An ablation whose setting is already the main run's is not run (the table says so).
  Plain GRPO is the gates-none row: with group-standardised advantages a 1/0 reward and the polarized +-1 give the
  same update (up to the std's epsilon), and with no gate rejecting a group the anchor never acts
  (tests/salvage/test_learner.py checks it); config.salvage.algorithm=grpo runs it by name;
- config.rl_seeds = n: rmsweb_rl_seed_<s> for s = salvage.seed + 1 .. + n (salvage + eval from the main SFT export
  and state set, only Salvage-DS's seed changed: its state order and sampling keys), each a row, and RMSWeb - SFT
  averaged over the n + 1 Salvage-DS runs (per held-out pair, the share of the runs that solved it), since one RL
  run's seed alone moves the difference by several points at this scale (bench/README.md).
A variant reads the main stages' outputs through links: <variant>/links.json maps a folder name (sft,
mine, store) to the main workdir's folder (rmsweb_jax/stages/links.py; a file, not symbolic links, so a
gs:// workdir works the same) and <variant>/manifests/<stage>.json is a copy of the main manifest, so
when a main stage reruns, the copy changes and the variant's dependants rerun, as in one workdir.

The table is computed from the stores and reports alone: the collection figures from the two stores
(collect/report.py compute_report), the policy rows from their eval stores on the same held-out pairs
(evaluate/report.py build_report: Wilson interval, paired bootstrap interval and McNemar p against
the SFT on reflection-collected data), the mining summary from mine/report.json, the
Salvage-DS summary (gate acceptance, anchors, reward) from salvage/metrics.jsonl.
"""
from __future__ import annotations

import json
import pathlib
import statistics

import jax
import ml_collections
from jax.experimental import multihost_utils

from rmsweb_jax import storage
from rmsweb_jax.collect.report import compute_report
from rmsweb_jax.collect.store import TrajectoryStore
from rmsweb_jax.errors import UserError
from rmsweb_jax.evaluate.report import build_report, compare_mean_success, read_episodes
from rmsweb_jax.stages import collect, eval as eval_stage, links, manifest, mine, salvage, sft, transfer
from rmsweb_jax.stages.pipeline import run_pipeline
from rmsweb_jax.stages.table_markdown import markdown
from rmsweb_jax.train.metrics import read_metrics

# What the stage reads and writes (rmsweb_jax/stages/manifest.py decides from these whether it is up to date).
# The variants run collect, sft, mine, salvage and eval with the config: the table reads what they read.
CONFIG_READS = tuple(sorted({"ablations", "rl_seeds", *collect.CONFIG_READS, *sft.CONFIG_READS, *mine.CONFIG_READS,
                             *salvage.CONFIG_READS, *eval_stage.CONFIG_READS, *transfer.CONFIG_READS}))
INPUT_STAGES = {"collect": None, "sft": None, "mine": None, "salvage": None, "eval": None}
OUTPUTS = {"demo_table.json": None, "demo_table.md": None}
NON_RESULT_FIELDS = tuple(sorted({*collect.NON_RESULT_FIELDS, *sft.NON_RESULT_FIELDS, *mine.NON_RESULT_FIELDS,
                                 *salvage.NON_RESULT_FIELDS, *eval_stage.NON_RESULT_FIELDS}))

NAME = "demo_table"
VARIANTS_DIR = "variants"
TEACHER_LABEL = "scripted collector with injected mistakes"
BASELINE = "sft"  # the row every policy row is compared with: SFT on reflection-collected data
ROWS = {"sft_first": "SFT (first-attempt data)", "sft": "SFT (reflection-collected data)",
        "rmsweb": "RMSWeb (SFT + mining + Salvage-DS)"}
# Ablation variants: (name, row, the config.salvage field switched ("loss.kl_beta": a nested one), its value).
ABLATIONS = (("salvage_reward_partial_credit", "Salvage-DS, reward partial_credit", "reward", "partial_credit"),
             ("salvage_reward_graded", "Salvage-DS, reward graded", "reward", "graded"),
             ("salvage_gates_none", "Salvage-DS, gates none (= plain GRPO: binary reward, no gates, no anchor)",
              "gates", "none"),
             ("salvage_gates_contrast", "Salvage-DS, gates contrast", "gates", "contrast"),
             ("salvage_anchor_off", "Salvage-DS, anchor off", "anchor", "off"),
             ("salvage_kl_off", "Salvage-DS, KL off (kl_beta 0)", "loss.kl_beta", 0.0))
ALL_STATES = ("rl_all_states", "RL on uniformly drawn states (no mining; same state count, same updates)")
ABLATION_NAMES = (*(a[0] for a in ABLATIONS), ALL_STATES[0])
RL_SEED_PREFIX = "rmsweb_rl_seed_"
RL_MEAN = "rmsweb_rl_mean"


def selected_ablations(config) -> tuple[str, ...]:
    """Returns the ablation variants config.ablations names, in ABLATION_NAMES order; UserError names the key and
    the unknown names otherwise."""
    value = config.ablations
    text = str(value).strip()
    if text.lower() in ("", "false"):
        return ()
    if text.lower() in ("all", "true"):
        return ABLATION_NAMES
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ABLATION_NAMES]
    if unknown:
        raise UserError(f"config.ablations = {value!r}: unknown row(s) {unknown}; expected \"all\", \"\" (none) or "
                        f"a comma-separated list of {list(ABLATION_NAMES)}")
    return tuple(n for n in ABLATION_NAMES if n in names)


def _salvage_value(config, field: str):
    node = config.salvage
    for part in field.split("."):
        node = node[part]
    return node


def ablations_to_run(config) -> tuple[list[tuple], list[tuple]]:
    """Returns (the ABLATIONS entries to run, those skipped because the main run already has their setting) among
    the selected ones; rl_all_states is run whenever selected (selected_ablations)."""
    chosen = set(selected_ablations(config))
    run, same = [], []
    for entry in ABLATIONS:
        if entry[0] in chosen:
            (same if _salvage_value(config, entry[2]) == entry[3] else run).append(entry)
    return run, same


def rl_seed_variants(config) -> list[tuple[str, int]]:
    """Returns [(variant name, its salvage.seed)] of the config.rl_seeds extra Salvage-DS runs."""
    n, base = config.rl_seeds, int(config.salvage.seed)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise UserError(f"config.rl_seeds = {n!r}: expected an int >= 0 (extra Salvage-DS runs from the same SFT "
                        "export and states, each with its own salvage.seed)")
    return [(f"{RL_SEED_PREFIX}{base + k}", base + k) for k in range(1, n + 1)]


def store_of(config, workdir: pathlib.Path) -> pathlib.Path:
    """Returns the main collect store: collect.store_dir, or <workdir>/store."""
    return storage.as_path(config.collect.store_dir) if config.collect.store_dir else storage.as_path(workdir) / "store"


def _copy_manifest(workdir: pathlib.Path, variant: pathlib.Path, stage: str) -> None:
    """Makes the main stage `stage` an input of the variant: its manifest copied into the variant's manifests
    (rewritten only when the main one changed, so the variant's dependants rerun exactly then)."""
    source = manifest.manifest_path(workdir, stage)
    if not source.is_file():
        raise UserError(f"the table's variants read the {stage} stage's outputs, but {source} is missing: run "
                        f"--config.stages=collect,sft,mine,salvage,eval,table in {workdir}")
    copy, data = manifest.manifest_path(variant, stage), source.read_bytes()
    if not copy.is_file() or copy.read_bytes() != data:
        storage.write_bytes_atomic(copy, data)


def _variant_config(config, stages: tuple[str, ...], **overrides) -> ml_collections.ConfigDict:
    c = config.copy_and_resolve_references()
    c.stages = stages
    c.rerun = ""  # config.rerun names the main stages; a variant reruns when the main stages it links rerun
    for dotted, value in overrides.items():
        *parents, leaf = dotted.split("__")
        node = c
        for p in parents:
            node = node[p]
        node[leaf] = value
    return c


def mined_state_count(workdir: pathlib.Path) -> int:
    """Returns how many states the main mine stage's state set holds (<workdir>/mine/summary.json): the
    rl_all_states ablation draws as many uniformly, so it differs from the main run only in the mining."""
    path = storage.as_path(workdir) / mine.NAME / "summary.json"
    if not path.is_file():
        raise UserError(f"{path} is missing: the table's rl_all_states ablation draws as many states as the main "
                        "state set holds; run the mine stage before the table")
    return int(json.loads(path.read_text())["state_set"]["states"])


def variants(config, workdir: pathlib.Path) -> dict[str, tuple[ml_collections.ConfigDict, dict]]:
    """Returns {variant name: (its config, {main stage: (folder, target) it links})}, in running order."""
    workdir = storage.as_path(workdir)
    store = store_of(config, workdir)
    trained_on = eval_stage.training_store(config, workdir)
    training_store = str(trained_on) if trained_on is not None else eval_stage.NO_CHECK
    evaluate = {"eval__compare": "", "eval__viewer": False, "eval__training_store": training_store}
    sft_links = {"sft": ("sft", workdir / "sft")}
    # mine and transfer read sft's split of the main store: the same store path as the split recorded
    data_store = config.data.store_dir or str(workdir / "store")
    out = {"plain_collect": (_variant_config(config, ("collect",), collect__retry_mode="plain", collect__store_dir="",
                                             collect__viewer=False), {}),
           "sft_first": (_variant_config(config, ("sft", "eval"), data__attempts="first", eval__policies="sft",
                                         **evaluate),
                         {**({} if config.data.store_dir else {"collect": ("store", store)}),
                          # both SFT rows start from the one grounded checkpoint: only their data differ
                          **({"ground": ("ground", workdir / "ground")} if config.sft.init == "ground" else {})}),
           "transfer": (_variant_config(config, ("transfer",), data__store_dir=data_store),
                        {**sft_links, "mine": ("mine", workdir / "mine"), "salvage": ("salvage", workdir / "salvage")})}
    rl_links = {**sft_links, "mine": ("mine", workdir / "mine")}
    for name, seed in rl_seed_variants(config):
        out[name] = (_variant_config(config, ("salvage", "eval"), eval__policies="salvage", salvage__seed=seed,
                                     **evaluate), rl_links)
    for name, _, field, value in ablations_to_run(config)[0]:
        out[name] = (_variant_config(config, ("salvage", "eval"), eval__policies="salvage",
                                     **{"salvage__" + field.replace(".", "__"): value}, **evaluate), rl_links)
    if ALL_STATES[0] in selected_ablations(config):
        out[ALL_STATES[0]] = (_variant_config(config, ("mine", "salvage", "eval"),
                                              mine__uniform_states=mined_state_count(workdir), mine__rollouts=False,
                                              data__store_dir=data_store, eval__policies="salvage", **evaluate),
                              sft_links)
    return out


def run_variants(config, workdir: pathlib.Path) -> dict[str, list[dict]]:
    """Runs every variant in <workdir>/variants/<name>/; returns {name: its stage records}."""
    workdir, records = storage.as_path(workdir), {}
    for name, (vconfig, linked) in variants(config, workdir).items():
        vdir = workdir / VARIANTS_DIR / name
        if jax.process_index() == 0:  # one writer per workdir (pipeline.py); the others read what it wrote
            vdir.mkdir(parents=True, exist_ok=True)
            for stage in linked:
                _copy_manifest(workdir, vdir, stage)
            links.write_links(vdir, {folder: target for folder, target in linked.values()})
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"table variant {name} linked")
        records[name] = run_pipeline(vconfig, vdir, prefix=f"{name}/")
    return records


# --- the table from the stores -----------------------------------------------------------------
def _collection(store_dir: pathlib.Path, attempts: int, success_rule: str) -> dict:
    with TrajectoryStore(store_dir) as store:
        report = compute_report(store, attempts, success_rule=success_rule)
        wins = [next(t for t in g if t.success) for g in store.groups().values() if any(t.success for t in g)]
    return {"store_dir": str(store_dir), "retry_mode": report["retry_mode"], "groups": report["tasks"],
            "attempts_k": report["attempts_k"], "success_at_1": report["success_at_1"],
            "success_at_le_K": report["success_at_le_K"], "solved": report["solved"],
            "mean_steps_solved": sum(t.num_steps for t in wins) / len(wins) if wins else None}


def _eval_store(eval_dir: pathlib.Path, label: str) -> dict:
    """Returns the policy {"id", "label", "store_dir"} labelled `label` in eval_dir/eval_report.json."""
    path = storage.as_path(eval_dir) / f"{eval_stage.REPORT_NAME}.json"
    if not path.is_file():
        raise UserError(f"{path} is missing: the eval stage writes it (run it before the table)")
    found = [p for p in json.loads(path.read_text())["policies"] if p["label"] == label]
    if not found:
        raise UserError(f"{path} has no policy labelled {label!r}: the table needs config.eval.policies to name "
                        "sft and salvage unlabelled (e.g. --config.eval.policies=sft,salvage)")
    return {k: found[0][k] for k in ("id", "label", "store_dir")}


def eval_pairs(config, workdir: pathlib.Path) -> set[tuple[str, int]]:
    """Returns the held-out (task, seed) pairs the eval stage plays under `config`."""
    env = eval_stage.environment(config)
    entries = eval_stage.parse_policies(config.eval.policies, workdir)
    seeds = range(config.eval.first_seed, config.eval.first_seed + config.eval.num_seeds)
    return {(t.id, s) for t in eval_stage.eval_tasks(env, entries) for s in seeds}


def policy_rows(policies: list[dict], pairs: set[tuple[str, int]] | None, *, bootstrap_samples: int,
                seed: int) -> dict:
    """Returns the policy table of `policies` (dicts with "key" (one is BASELINE), "row", "id", "store_dir"):
    per row success, Wilson interval, mean steps on the pairs EVERY row solved, and the paired comparison
    with the BASELINE row (difference, paired bootstrap interval, McNemar p)."""
    keys = [p["key"] for p in policies]
    report = build_report([{"id": p["id"], "label": p["key"], "store_dir": p["store_dir"]} for p in policies], pairs,
                          [(k, BASELINE) for k in keys if k != BASELINE], bootstrap_samples=bootstrap_samples,
                          seed=seed)
    episodes = {p["key"]: read_episodes(p["store_dir"], pairs) for p in policies}
    shared = set.intersection(*(set(e) for e in episodes.values()))
    all_solved = sorted(k for k in shared if all(e[k].success for e in episodes.values()))
    by_key = {p["label"]: p for p in report["policies"]}
    versus = {c["a"]: c for c in report["comparisons"]}
    rows = []
    for p in policies:
        overall, c = by_key[p["key"]]["overall"], versus.get(p["key"])
        steps = [episodes[p["key"]][k].num_steps for k in all_solved]
        rows.append({"key": p["key"], "row": p["row"], "id": p["id"], "store_dir": str(p["store_dir"]),
                     "episodes": overall["episodes"], "solved": overall["solved"], "success": overall["success"],
                     "ci95": overall["ci95"], "mean_steps_all_solved": sum(steps) / len(steps) if steps else None,
                     "vs_baseline": None if c is None else {
                         "n": c["n"], "difference": c["difference"], "ci95": c["ci95"],
                         "mcnemar_p": c["mcnemar"]["p"], "only_row_solved": c["mcnemar"]["b"],
                         "only_baseline_solved": c["mcnemar"]["c"]}})
    return {"pairs": None if pairs is None else len(pairs),
            "pair_list": None if pairs is None else [list(pair) for pair in sorted(pairs)], "baseline": BASELINE, "all_solved_pairs": len(all_solved),
            "bootstrap": report["bootstrap"], "rows": rows}


def mining_summary(report_path: pathlib.Path) -> dict:
    """Returns critical vs routine states and the failure modes by share of the critical states (mine/report.json)."""
    report = json.loads(storage.as_path(report_path).read_text())
    modes = sorted(((m, n) for m, n in report["failure_modes"].items() if n), key=lambda x: (-x[1], x[0]))
    return {"report": str(report_path), "tau": report["tau"], "states": report["states"],
            "critical": report["critical"], "routine": report["routine"], "critical_share": report["critical_share"],
            "failure_modes": [{"mode": m, "states": n, "share": n / report["critical"]} for m, n in modes]}


SALVAGE_FIGURES = ("states_drawn", "groups_accepted", "groups_anchored", "groups_rejected", "shortfall",
                   "rows_policy_rows", "rows_anchor_rows", "rows_anchor_rows_dropped", "reward_mean", "correct_share")


def salvage_summary(run_dir: pathlib.Path) -> dict:
    """Returns what Salvage-DS trained on (salvage/metrics.jsonl): per update, the mean of each SALVAGE_FIGURES
    figure (each logged value is its window's mean, weighted here by the window's updates), the accepted and
    anchored shares of the groups drawn, and the sampled actions' correct share in the first and last window."""
    path = storage.as_path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise UserError(f"{path} is missing: the salvage stage writes it (run it before the table)")
    metrics, previous, weighted, updates = read_metrics(path), 0, dict.fromkeys(SALVAGE_FIGURES, 0.0), 0
    for step in sorted(metrics):
        span = step - previous
        for name in SALVAGE_FIGURES:
            weighted[name] += span * metrics[step].get(name, 0.0)
        updates, previous = updates + span, step
    per_update = {name: (v / updates if updates else None) for name, v in weighted.items()}
    drawn = per_update["states_drawn"]
    windows = [metrics[s] for s in sorted(metrics)]
    return {"metrics": str(path), "updates": updates, "windows": len(windows), "per_update": per_update,
            "accepted_share": per_update["groups_accepted"] / drawn if drawn else None,
            "anchored_share": per_update["groups_anchored"] / drawn if drawn else None,
            "correct_share_first": windows[0].get("correct_share") if windows else None,
            "correct_share_last": windows[-1].get("correct_share") if windows else None}


def transfer_summary(path: pathlib.Path) -> dict:
    """Returns the transfer stage's figures (its report.json, without the per-step records)."""
    path = storage.as_path(path)
    if not path.is_file():
        raise UserError(f"{path} is missing: the transfer stage writes it (the table runs it as a variant)")
    report = json.loads(path.read_text())
    return {k: report[k] for k in ("policies", "samples", "temperature", "training_states", "held_out_steps",
                                   "held_out_note")}


def build_table(config, workdir: pathlib.Path) -> dict:
    """Returns the table's figures from the main and variant workdirs' stores and reports."""
    workdir = storage.as_path(workdir)
    vdir = workdir / VARIANTS_DIR
    attempts, rule = int(config.collect.attempts), config.collect.success
    collector = TEACHER_LABEL if config.collect.policy == "teacher" else f"collector policy {config.collect.policy}"
    collection = {"collector": collector, "attempts_k": attempts, "success_rule": rule,
                  "plain": _collection(vdir / "plain_collect" / "store", attempts, rule),
                  "reflection": _collection(store_of(config, workdir), attempts, rule)}
    main_eval = workdir / eval_stage.EVAL_DIR
    policies = [{"key": "sft_first", "row": ROWS["sft_first"],
                 **_eval_store(vdir / "sft_first" / eval_stage.EVAL_DIR, "sft")},
                {"key": "sft", "row": ROWS["sft"], **_eval_store(main_eval, "sft")},
                {"key": "rmsweb", "row": ROWS["rmsweb"], **_eval_store(main_eval, "salvage")}]
    for name, seed in rl_seed_variants(config):
        policies.append({"key": name, "row": f"RMSWeb, Salvage-DS seed {seed}",
                         **_eval_store(vdir / name / eval_stage.EVAL_DIR, "salvage")})
    ran, same = ablations_to_run(config)
    for name, row in [a[:2] for a in ran] + ([ALL_STATES] if ALL_STATES[0] in selected_ablations(config) else []):
        policies.append({"key": name, "row": row, **_eval_store(vdir / name / eval_stage.EVAL_DIR, "salvage")})
    pairs = eval_pairs(config, workdir)
    samples, seed = int(config.eval.bootstrap_samples), int(config.eval.bootstrap_seed)
    table = {"collection": collection,
             "policies": policy_rows(policies, pairs, bootstrap_samples=samples, seed=seed),
             "rl_mean": rl_mean(policies, salvage_seeds(config), pairs, bootstrap_samples=samples, seed=seed),
             "mining": mining_summary(workdir / mine.NAME / "report.json"),
             "salvage": salvage_summary(workdir / salvage.NAME),
             "transfer": transfer_summary(vdir / "transfer" / transfer.NAME / "report.json"),
             "ablations": list(selected_ablations(config)),
             "ablations_not_run": [{"key": name, "row": row, "setting": f"salvage.{field} = {value!r}"}
                                   for name, row, field, value in same]}
    return table


def salvage_seeds(config) -> dict[str, int]:
    """Returns {policy row key: its salvage.seed} of the Salvage-DS runs that differ only in that seed: the main
    "rmsweb" row and the config.rl_seeds rows."""
    return {"rmsweb": int(config.salvage.seed), **dict(rl_seed_variants(config))}


def rl_mean(policies: list[dict], seeds: dict[str, int], pairs: set[tuple[str, int]] | None, *,
            bootstrap_samples: int, seed: int) -> dict | None:
    """Returns RMSWeb - SFT averaged over the Salvage-DS runs `seeds` names (salvage_seeds): compare_mean_success's
    figures with the runs' keys, seeds and the sample standard deviation of their own differences; None for fewer
    than two such rows."""
    runs = [p for p in policies if p["key"] in seeds]
    if len(runs) < 2:
        return None
    baseline = next(p for p in policies if p["key"] == BASELINE)
    c = compare_mean_success([read_episodes(p["store_dir"], pairs) for p in runs],
                             read_episodes(baseline["store_dir"], pairs), bootstrap_samples=bootstrap_samples,
                             seed=seed)
    return {"key": RL_MEAN, "row": f"RMSWeb, mean over {len(runs)} Salvage-DS seeds", "keys": [p["key"] for p in runs],
            "seeds": [seeds[p["key"]] for p in runs], **c, "per_run_sd": statistics.stdev(c["per_run"])}


def check_config(config, workdir) -> None:
    """Returns None having checked config.ablations and config.rl_seeds (UserError names the key): the table's
    variants change a few fields to fixed values, and the stages they run are checked with the main ones' settings
    when config.stages names them (the variants' own configs need the main outputs). The pipeline calls it before
    any stage runs (stages/pipeline.py check_stages)."""
    ablations_to_run(config)
    rl_seed_variants(config)


def run(config, workdir: pathlib.Path) -> dict:
    """Runs the variants, then writes <workdir>/demo_table.{json,md} and prints the markdown; returns the table."""
    workdir = storage.as_path(workdir)  # local, or gs://
    records = run_variants(config, workdir)
    table = build_table(config, workdir)
    table["variants"] = {name: [{k: r[k] for k in ("stage", "ran", "reason")} for r in recs]
                         for name, recs in records.items()}
    text = markdown(table)
    if jax.process_index() == 0:
        storage.write_text_atomic(workdir / f"{NAME}.json", json.dumps(table, indent=2))
        storage.write_text_atomic(workdir / f"{NAME}.md", text)
        print(text, flush=True)
    return table
