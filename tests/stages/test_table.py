"""The `table` stage: RMSWeb's table from the stores and reports, every figure recomputed here from the stores
themselves; the variants (plain collection, first-attempt SFT, ablations) run in sub-workdirs under their own
manifests. Fast: the policy table on stores written with StoreWriter. Slow: the micro pipeline
collect -> sft -> mine -> salvage -> eval -> table in Chromium, then its rerun."""
import json
import pathlib

import numpy as np
import pytest

from configs.common import base_config
from rmsweb_jax.collect.store import TrajectoryStore
from rmsweb_jax.collect.store_fixture import retry_group
from rmsweb_jax.evaluate.stats import mcnemar_exact, paired_bootstrap_interval, wilson_interval
from rmsweb_jax.main import STAGES, run_stages
from rmsweb_jax.mining.state_set import StateSet
from rmsweb_jax.stages import links, manifest, table
from rmsweb_jax.train.metrics import read_metrics
from tests.stages.micro_pipeline import micro_pipeline_config
from tests.settings import store_writer

TASKS = ("t0", "t1", "t2", "t3")
SEEDS = range(5)
PAIRS = {(t, s) for t in TASKS for s in SEEDS}


def _write(path: pathlib.Path, solved: set, steps: int, policy: str) -> str:
    with store_writer(path, flush_every_tasks=4, policy=policy) as store:
        for task, seed in sorted(PAIRS):
            store.add_group(retry_group(task, seed, solved_at=1 if (task, seed) in solved else None, attempts=1,
                                        steps=steps, policy=policy))
    return str(path)


def test_the_policy_rows_compare_each_row_with_the_reflection_sft_on_the_same_pairs(tmp_path):
    base = {(t, 0) for t in TASKS} | {("t0", 1)}                     # 5 of 20
    first = (base - {("t0", 1)}) | {("t1", 1)}                       # as many, one pair swapped
    stores = {"sft_first": _write(tmp_path / "first", first, 3, "first"),
              "sft": _write(tmp_path / "sft", base, 2, "sft"),
              "rmsweb": _write(tmp_path / "rmsweb", PAIRS, 4, "rmsweb")}  # solves every pair
    policies = [{"key": k, "row": table.ROWS[k], "id": f"{k}@x", "store_dir": d} for k, d in stores.items()]
    got = table.policy_rows(policies, PAIRS, bootstrap_samples=2000, seed=3)
    rows = {r["key"]: r for r in got["rows"]}
    assert [r["key"] for r in got["rows"]] == ["sft_first", "sft", "rmsweb"] and got["pairs"] == 20
    assert got["pair_list"] == [list(p) for p in sorted(PAIRS)]  # table_spread pools on these
    assert got["all_solved_pairs"] == 4  # (t*, 0) and nothing else is solved by all three
    for key, solved, steps in (("sft_first", first, 3), ("sft", base, 2), ("rmsweb", PAIRS, 4)):
        r = rows[key]
        assert (r["solved"], r["episodes"], r["success"]) == (len(solved), 20, len(solved) / 20)
        assert r["ci95"] == list(wilson_interval(len(solved), 20))
        assert r["mean_steps_all_solved"] == steps  # retry_group: a solving attempt takes `steps` steps
    assert rows["sft"]["vs_baseline"] is None
    order = sorted(PAIRS)
    for key, solved in (("sft_first", first), ("rmsweb", PAIRS)):
        a, b = [float(k in solved) for k in order], [float(k in base) for k in order]
        v = rows[key]["vs_baseline"]
        assert v["difference"] == pytest.approx((sum(a) - sum(b)) / 20)
        assert v["ci95"] == list(paired_bootstrap_interval(a, b, [t for t, _ in order], samples=2000, seed=3))
        only_row, only_base = len(solved - base), len(base - solved)
        assert (v["only_row_solved"], v["only_baseline_solved"]) == (only_row, only_base)
        assert v["mcnemar_p"] == mcnemar_exact(only_row, only_base)
    assert rows["rmsweb"]["vs_baseline"]["ci95"][0] > 0 and rows["sft_first"]["vs_baseline"]["ci95"][0] < 0
    text = table.markdown({"collection": {"collector": table.TEACHER_LABEL, "attempts_k": 2, "success_rule": "solved",
                                          "plain": {"groups": 20, "success_at_1": 0.5, "success_at_le_K": 0.6,
                                                    "mean_steps_solved": 2.0},
                                          "reflection": {"groups": 20, "success_at_1": 0.5, "success_at_le_K": 0.7,
                                                         "mean_steps_solved": None}},
                           "policies": got, "mining": {"states": 3, "critical": 2, "routine": 1, "critical_share": 2 / 3,
                                                       "tau": 0.5, "failure_modes": [
                                                           {"mode": "wrong_target", "states": 2, "share": 1.0}]}})
    assert "- RMSWeb (SFT + mining + Salvage-DS): +75.0 pts vs SFT (reflection-collected data); the paired " \
           "interval excludes 0: above it at this scale." in text
    assert "- SFT (first-attempt data): +0.0 pts vs SFT (reflection-collected data); the paired interval includes " \
           "0: a difference is not shown at this scale." in text
    assert "| SFT (reflection-collected data) | 5 / 20 | 25.0% |" in text and "| wrong_target | 2 | 100.0% |" in text
    assert "| plain (no reflection, randomness re-drawn) | 50.0% | 60.0% | 2.00 |" in text
    assert "## Salvage-DS" not in text  # a table without the salvage summary (older runs) has no such section


def _empty_table():
    return {"collection": {"collector": "c", "attempts_k": 2, "success_rule": "solved",
                           "plain": {"groups": 1, "success_at_1": 0.0, "success_at_le_K": 0.0, "mean_steps_solved": None},
                           "reflection": {"groups": 1, "success_at_1": 0.0, "success_at_le_K": 0.0,
                                          "mean_steps_solved": None}},
            "policies": {"pairs": 0, "all_solved_pairs": 0, "rows": [], "bootstrap": {"samples": 10}},
            "mining": {"states": 0, "critical": 0, "routine": 0, "critical_share": 0.0, "tau": 0.5,
                       "failure_modes": []}}


def test_the_salvage_summary_weights_each_logged_window_by_its_updates(tmp_path):
    run_dir = tmp_path / "salvage"
    run_dir.mkdir()
    # Logged at updates 2 and 5: window means over updates 1-2 and 3-5.
    base = dict.fromkeys(table.SALVAGE_FIGURES, 0.0)
    lines = [{**base, "step": 2, "states_drawn": 4.0, "groups_accepted": 1.0, "groups_anchored": 3.0,
              "reward_mean": -0.5, "correct_share": 0.25},
             {**base, "step": 5, "states_drawn": 2.0, "groups_accepted": 2.0, "groups_anchored": 0.0,
              "reward_mean": 0.5, "correct_share": 0.75}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    got = table.salvage_summary(run_dir)
    u = got["per_update"]
    assert got["updates"] == 5
    assert u["states_drawn"] == pytest.approx((2 * 4 + 3 * 2) / 5)
    assert u["groups_accepted"] == pytest.approx((2 * 1 + 3 * 2) / 5)
    assert u["reward_mean"] == pytest.approx((2 * -0.5 + 3 * 0.5) / 5)
    assert got["accepted_share"] == pytest.approx(8 / 14) and got["anchored_share"] == pytest.approx(6 / 14)
    assert (got["correct_share_first"], got["correct_share_last"]) == (0.25, 0.75)
    text = table.markdown({**_empty_table(), "salvage": got})
    assert "5 updates. Per update: 2.80 states drawn, 1.60 groups accepted by the gates (57.1% of those drawn), " \
           "1.20 anchored (42.9%;" in text
    assert "right 25.0% in the first logged window, 75.0% in the last." in text
    one = table.markdown({**_empty_table(), "salvage": {**got, "windows": 1}})
    assert f"right {100 * got['per_update']['correct_share']:.1f}% (one logged window)." in one
    with pytest.raises(table.UserError, match="metrics.jsonl is missing"):
        table.salvage_summary(tmp_path / "nowhere")


def test_the_variants_change_only_their_fields_and_link_the_main_stages_they_read(tmp_path):
    config = base_config()
    assert STAGES["table"] == "table" and config.ablations == "" and config.rl_seeds == 0
    names = list(table.variants(config, tmp_path))
    assert names == ["plain_collect", "sft_first", "transfer"]
    config.ablations, config.collect.viewer = "all", True
    config.salvage.loss.kl_beta = 0.1  # so that the KL-off row differs from the main run
    with pytest.raises(table.UserError, match="summary.json is missing: the table's rl_all_states ablation"):
        table.variants(config, tmp_path)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "summary.json").write_text(json.dumps({"state_set": {"states": 37, "critical": 30}}))
    got = table.variants(config, tmp_path)
    assert list(got) == ["plain_collect", "sft_first", "transfer", *(a[0] for a in table.ABLATIONS), "rl_all_states"]
    plain, _ = got["plain_collect"]
    assert plain.stages == ("collect",) and plain.collect.retry_mode == "plain"
    changed = manifest.changed_fields(manifest.config_fields(config, ["collect"]),
                                      manifest.config_fields(plain, ["collect"]))
    assert [c.split(" ")[0] for c in changed] == ["collect.retry_mode", "collect.viewer"]
    first, links = got["sft_first"]
    assert first.data.attempts == "first" and first.eval.policies == "sft" and links == {
        "collect": ("store", tmp_path / "store")}
    measure, links = got["transfer"]  # SFT vs RMSWeb on the main stages' outputs, the main store's split
    assert measure.stages == ("transfer",) and set(links) == {"sft", "mine", "salvage"}
    assert measure.data.store_dir == str(tmp_path / "store")
    for name, _, field, value in table.ABLATIONS:
        c, links = got[name]
        assert c.stages == ("salvage", "eval") and set(links) == {"sft", "mine"}
        changed = manifest.changed_fields(config.salvage.to_dict(), c.salvage.to_dict())
        assert [x.split(" ")[0] for x in changed] == [field] and table._salvage_value(c, field) == value
    every, links = got["rl_all_states"]
    assert every.stages == ("mine", "salvage", "eval") and set(links) == {"sft"}
    # the mined set's size, drawn from all the training steps (stages/mine.py state_indices): no mining
    changed = manifest.changed_fields(config.mine.to_dict(), every.mine.to_dict())
    assert [c.split(" ")[0] for c in changed] == ["uniform_states"] and every.mine.uniform_states == 37
    assert every.train.optimizer.total_steps == config.train.optimizer.total_steps  # same number of updates


def test_ablations_are_chosen_by_name_and_one_the_main_run_already_has_is_not_run(tmp_path):
    config = base_config()
    assert config.salvage.loss.kl_beta == 0.0 and config.salvage.anchor != "off"
    config.ablations = "salvage_anchor_off, salvage_kl_off"
    assert table.selected_ablations(config) == ("salvage_anchor_off", "salvage_kl_off")
    ran, same = table.ablations_to_run(config)
    assert [a[0] for a in ran] == ["salvage_anchor_off"] and [a[0] for a in same] == ["salvage_kl_off"]
    assert list(table.variants(config, tmp_path))[3:] == ["salvage_anchor_off"]
    for alias, want in (("True", table.ABLATION_NAMES), ("all", table.ABLATION_NAMES), ("False", ()), ("", ())):
        config.ablations = alias
        assert table.selected_ablations(config) == want
    config.ablations = "salvage_anchor_off,rl_grpo"
    with pytest.raises(table.UserError, match=r"config.ablations = 'salvage_anchor_off,rl_grpo': unknown row\(s\) "
                                              r"\['rl_grpo'\]; expected \"all\", \"\" \(none\) or a comma-separated"):
        table.check_config(config, tmp_path)


def test_rl_seeds_rerun_salvage_with_only_its_seed_changed(tmp_path):
    config = base_config()
    config.salvage.seed, config.rl_seeds = 5, 2
    got = table.variants(config, tmp_path)
    assert list(got)[3:] == [f"{table.RL_SEED_PREFIX}6", f"{table.RL_SEED_PREFIX}7"]
    for name, seed in ((f"{table.RL_SEED_PREFIX}6", 6), (f"{table.RL_SEED_PREFIX}7", 7)):
        c, links = got[name]
        assert c.stages == ("salvage", "eval") and c.eval.policies == "salvage" and set(links) == {"sft", "mine"}
        changed = manifest.changed_fields(config.salvage.to_dict(), c.salvage.to_dict())
        assert [x.split(" ")[0] for x in changed] == ["seed"] and c.salvage.seed == seed
    config.rl_seeds = -1
    with pytest.raises(table.UserError, match=r"config.rl_seeds = -1: expected an int >= 0"):
        table.check_config(config, tmp_path)


def test_rmsweb_averaged_over_its_salvage_ds_seeds_per_held_out_pair(tmp_path):
    base = {(t, 0) for t in TASKS} | {("t0", 1)}                       # SFT solves 5 of 20
    runs = [base | {("t1", 1), ("t2", 2)}, base - {("t3", 0)}, PAIRS]  # three Salvage-DS seeds
    policies = [{"key": "sft", "row": table.ROWS["sft"], "id": "sft@x", "store_dir": _write(tmp_path / "sft", base, 2,
                                                                                             "sft")}]
    keys = ["rmsweb", f"{table.RL_SEED_PREFIX}1", f"{table.RL_SEED_PREFIX}2"]
    for key, solved in zip(keys, runs):
        policies.append({"key": key, "row": key, "id": f"{key}@x", "store_dir": _write(tmp_path / key, solved, 2, key)})
    seeds = dict(zip(keys, (0, 1, 2)))
    assert table.rl_mean(policies[:2], seeds, PAIRS, bootstrap_samples=100, seed=0) is None  # one Salvage-DS run
    got = table.rl_mean(policies, seeds, PAIRS, bootstrap_samples=2000, seed=3)
    order = sorted(PAIRS)
    shares = [sum(k in r for r in runs) / 3 for k in order]
    sft = [float(k in base) for k in order]
    own = [(len(r) - len(base)) / 20 for r in runs]  # each run solves a superset or a subset of SFT's pairs
    assert (got["keys"], got["seeds"], got["n"], got["runs"]) == (keys, [0, 1, 2], 20, 3)
    assert got["difference"] == pytest.approx(np.mean(shares) - np.mean(sft)) == pytest.approx(np.mean(own))
    assert got["per_run"] == pytest.approx(own) and got["per_run_sd"] == pytest.approx(np.std(own, ddof=1))
    assert got["ci95"] == list(paired_bootstrap_interval(shares, sft, [t for t, _ in order], samples=2000, seed=3))
    text = table.markdown({**_empty_table(), "rl_mean": got,
                           "ablations_not_run": [{"row": "Salvage-DS, KL off (kl_beta 0)",
                                                  "setting": "salvage.loss.kl_beta = 0.0"}]})
    assert f"RMSWeb, mean over 3 Salvage-DS seeds (seeds 0, 1, 2; per held-out pair, the share of the runs that " \
           f"solved it): {100 * np.mean(shares):.1f}% against 25.0%, **{100 * got['difference']:+.1f} pts**" in text
    assert "Not run: Salvage-DS, KL off (kl_beta 0) (the main run already has salvage.loss.kl_beta = 0.0)." in text


def _config():
    # the micro pipeline with the table, and K = 2 so that plain and reflection retries differ
    c = micro_pipeline_config()
    c.stages = ("collect", "sft", "mine", "salvage", "eval", "table")
    c.collect.attempts = 2
    c.data.held_out_fraction = 0.25  # one of the 4 task groups, for the transfer variant's held-out steps
    return c


def _ran(workdir: pathlib.Path) -> dict[str, bool]:
    return {r["stage"]: r["ran"] for r in json.loads((workdir / "stages.json").read_text())}


def _collection(store: pathlib.Path) -> dict:
    with TrajectoryStore(store) as reader:
        groups, mode = reader.groups(), reader.retry_mode
    wins = [next(t for t in g if t.success) for g in groups.values() if any(t.success for t in g)]
    return {"retry_mode": mode, "groups": len(groups), "success_at_1": sum(g[0].success for g in groups.values())
            / len(groups), "success_at_le_K": len(wins) / len(groups),
            "mean_steps_solved": sum(t.num_steps for t in wins) / len(wins) if wins else None}


def _episodes(store: str) -> dict:
    with TrajectoryStore(store) as reader:
        return {k: g[0] for k, g in reader.groups().items() if g[0].attempt == 1}


@pytest.mark.slow
@pytest.mark.browser
def test_the_micro_pipeline_prints_the_table_every_figure_from_the_stores_and_a_rerun_skips(tmp_path, capsys):
    config = _config()
    run_stages(config, tmp_path)
    out = capsys.readouterr().out
    assert _ran(tmp_path) == dict.fromkeys(config.stages, True)
    got = json.loads((tmp_path / "demo_table.json").read_text())
    md = (tmp_path / "demo_table.md").read_text()
    assert md in out  # printed as written

    # The variants: their own sub-workdirs, manifests and links to the main stages they read.
    variants = tmp_path / "variants"
    assert sorted(p.name for p in variants.iterdir()) == ["plain_collect", "sft_first", "transfer"]
    assert _ran(variants / "plain_collect") == {"collect": True}
    assert _ran(variants / "sft_first") == {"sft": True, "eval": True}
    plain = manifest.read_manifest(variants / "plain_collect", "collect")
    assert plain["complete"] and plain["config"]["collect"]["retry_mode"] == "plain"
    assert plain["config"]["collect"]["num_seeds"] == 2 and plain["config"]["collect"]["attempts"] == 2
    first = manifest.read_manifest(variants / "sft_first", "sft")
    assert first["complete"] and first["config"]["data"]["attempts"] == "first"
    assert first["inputs"] == {"collect": manifest.manifest_digest(tmp_path, "collect")}  # the main collect
    assert links.read_links(variants / "sft_first") == {"store": str(tmp_path / "store")}  # not a copy, not a symlink
    assert not (variants / "sft_first" / "store").exists() and links.read_links(variants / "plain_collect") == {}
    assert manifest.read_manifest(variants / "sft_first", "eval")["inputs"] == {
        "sft": manifest.manifest_digest(variants / "sft_first", "sft")}
    assert json.loads((variants / "sft_first" / "sft" / "split.json").read_text())["attempts"] == "first"
    assert {r["stage"]: r["ran"] for r in got["variants"]["sft_first"]} == {"sft": True, "eval": True}

    # Collection: both stores, recomputed.
    col = got["collection"]
    assert col["collector"] == "scripted collector with injected mistakes" and col["attempts_k"] == 2
    for key, store, mode in (("plain", variants / "plain_collect" / "store", "plain"),
                             ("reflection", tmp_path / "store", "reflection")):
        mine = _collection(store)
        assert mine["retry_mode"] == mode and col[key]["groups"] == mine["groups"] == 4
        for fig in ("success_at_1", "success_at_le_K", "mean_steps_solved"):
            assert col[key][fig] == pytest.approx(mine[fig], abs=1e-4), (key, fig)

    # Policies: the three rows' stores, the held-out pairs, every figure recomputed.
    pol = got["policies"]
    pairs = sorted((f"miniwob.{t}", 100) for t in ("click-test", "click-button"))
    assert pol["pairs"] == 2 and pol["baseline"] == "sft"
    rows = {r["key"]: r for r in pol["rows"]}
    assert [r["row"] for r in pol["rows"]] == ["SFT (first-attempt data)", "SFT (reflection-collected data)",
                                               "RMSWeb (SFT + mining + Salvage-DS)"]
    assert pathlib.Path(rows["sft_first"]["store_dir"]).is_relative_to(variants / "sft_first" / "eval")
    assert pathlib.Path(rows["sft"]["store_dir"]).parent.name.startswith("sft@")
    assert pathlib.Path(rows["rmsweb"]["store_dir"]).parent.name.startswith("salvage@")
    episodes = {k: _episodes(r["store_dir"]) for k, r in rows.items()}
    assert all(sorted(e) == pairs for e in episodes.values()), {k: sorted(e) for k, e in episodes.items()}
    everyone = [p for p in pairs if all(e[p].success for e in episodes.values())]
    assert pol["all_solved_pairs"] == len(everyone)
    base = [float(episodes["sft"][p].success) for p in pairs]
    for key, r in rows.items():
        solved = sum(episodes[key][p].success for p in pairs)
        assert (r["solved"], r["episodes"], r["ci95"]) == (solved, 2, list(wilson_interval(solved, 2)))
        steps = [episodes[key][p].num_steps for p in everyone]
        assert r["mean_steps_all_solved"] == (sum(steps) / len(steps) if steps else None)
        if key == "sft":
            assert r["vs_baseline"] is None
            continue
        mine = [float(episodes[key][p].success) for p in pairs]
        v = r["vs_baseline"]
        assert v["difference"] == pytest.approx((sum(mine) - sum(base)) / 2)
        assert v["ci95"] == list(paired_bootstrap_interval(mine, base, [t for t, _ in pairs], samples=200,
                                                           seed=config.eval.bootstrap_seed))
        b, c = sum(x > y for x, y in zip(mine, base)), sum(y > x for x, y in zip(mine, base))
        assert v["mcnemar_p"] == mcnemar_exact(b, c)
        shown = v["ci95"][0] > 0 or v["ci95"][1] < 0
        assert (f"- {r['row']}: " in md) and (("not shown at this scale" in md) or shown)

    # Mining: mine/report.json.
    report = json.loads((tmp_path / "mine" / "report.json").read_text())
    mining = got["mining"]
    assert (mining["states"], mining["critical"], mining["routine"]) == (report["states"], report["critical"],
                                                                        report["routine"])
    assert {m["mode"]: m["states"] for m in mining["failure_modes"]} == {m: n for m, n in
                                                                         report["failure_modes"].items() if n}
    assert all(m["share"] == pytest.approx(m["states"] / report["critical"]) for m in mining["failure_modes"])
    for header in ("| retries | success@1 | success@≤2 | mean steps (solved) |",
                   "| policy | solved / episodes | success | 95% CI | mean steps (all solved) | difference vs SFT "
                   "(reflection) | 95% CI (paired) | McNemar p |", "| failure mode | critical states | share |"):
        assert header in md

    # Salvage-DS: salvage/metrics.jsonl, logged every update in the micro config.
    logged = read_metrics(tmp_path / "salvage" / "metrics.jsonl")
    sal = got["salvage"]
    assert sal["updates"] == config.train.optimizer.total_steps == len(logged)
    for name in table.SALVAGE_FIGURES:
        assert sal["per_update"][name] == pytest.approx(sum(m[name] for m in logged.values()) / len(logged)), name
    drawn = sum(m["states_drawn"] for m in logged.values())
    assert sal["accepted_share"] == pytest.approx(sum(m["groups_accepted"] for m in logged.values()) / drawn)
    assert sal["anchored_share"] == pytest.approx(sum(m["groups_anchored"] for m in logged.values()) / drawn)
    assert f"## Salvage-DS\n\n{len(logged)} updates. Per update: " in md

    # Transfer: both main exports on the main state set and on sft's held-out steps, every figure from the
    # per-state and per-step records of its report.
    assert _ran(variants / "transfer") == {"transfer": True}
    assert links.read_links(variants / "transfer") == {k: str(tmp_path / k) for k in ("sft", "mine", "salvage")}
    report = json.loads((variants / "transfer" / "transfer" / "report.json").read_text())
    assert report["policies"] == {"sft": f"hf:{tmp_path / 'sft' / 'hf'}", "rmsweb": f"hf:{tmp_path / 'salvage' / 'hf'}"}
    states = StateSet(tmp_path / "mine" / "states.arrayrecord")
    try:
        assert [s["state_id"] for s in report["states"]] == [states[i].state_id for i in range(len(states))]
    finally:
        states.close()
    tr = got["transfer"]
    assert tr["samples"] == config.mine.samples and tr["training_states"]["states"] == len(report["states"]) > 0
    for key in ("sft", "rmsweb"):
        acc = [s[key] for s in report["states"]]
        assert tr["training_states"][key] == {"accuracy": pytest.approx(sum(acc) / len(acc)),
                                              "critical": sum(a < config.mine.tau for a in acc)}
    split = json.loads((tmp_path / "sft" / "split.json").read_text())
    held = tr["held_out_steps"]
    sft_right = [r["correct"] for r in report["held_out_records"]["sft"]]
    rl_right = [r["correct"] for r in report["held_out_records"]["rmsweb"]]
    assert held["task_groups"] == len(split["held_out_task_groups"]) == 1
    assert held["steps"] == len(sft_right) == len(rl_right) > 0
    assert [r["example"] for r in report["held_out_records"]["sft"]] == [
        r["example"] for r in report["held_out_records"]["rmsweb"]]
    b, c = sum(x and not y for x, y in zip(rl_right, sft_right)), sum(y and not x for x, y in zip(rl_right, sft_right))
    assert (held["only_rmsweb_right"], held["only_sft_right"], held["mcnemar_p"]) == (b, c, mcnemar_exact(b, c))
    assert held["sft"]["accuracy"] == sum(sft_right) / len(sft_right)
    assert "## Transfer: what Salvage-DS learned, on its states and on held-out steps" in md
    assert f"greedy step accuracy on {held['steps']} held-out steps (1 task groups" in md

    # A rerun redoes nothing; the table forced to rerun finds every variant stage up to date.
    capsys.readouterr()
    run_stages(config, tmp_path)
    assert _ran(tmp_path) == dict.fromkeys(config.stages, False)
    assert "[table] skipped: up to date" in capsys.readouterr().out
    config.rerun = "table"
    run_stages(config, tmp_path)
    out = capsys.readouterr().out
    assert _ran(tmp_path) == {**dict.fromkeys(config.stages, False), "table": True}
    assert "[plain_collect/collect] skipped: up to date" in out and "[sft_first/eval] skipped: up to date" in out
    assert _ran(variants / "sft_first") == {"sft": False, "eval": False} and _ran(variants / "transfer") == {
        "transfer": False}
    again = json.loads((tmp_path / "demo_table.json").read_text())
    assert {k: v for k, v in again.items() if k != "variants"} == {k: v for k, v in got.items() if k != "variants"}

    # A main stage that reruns reruns the variant stages that read it (through the copied manifest), and only those.
    config.rerun = "collect"
    run_stages(config, tmp_path)
    assert _ran(tmp_path) == dict.fromkeys(config.stages, True)
    assert _ran(variants / "plain_collect") == {"collect": False} and _ran(variants / "sft_first") == {
        "sft": True, "eval": True}
    assert json.loads((variants / "sft_first" / "stages.json").read_text())[0]["reason"].startswith(
        "input stage collect reran")

    # One more Salvage-DS seed and one ablation: each its own salvage + eval from the main SFT export and states, a
    # row of the table; RMSWeb - SFT averaged over the two Salvage-DS runs, per held-out pair.
    config.rerun, config.rl_seeds, config.ablations = "", 1, "salvage_anchor_off"
    run_stages(config, tmp_path)
    assert _ran(tmp_path) == {**dict.fromkeys(config.stages, False), "table": True}
    seed_run = f"{table.RL_SEED_PREFIX}{config.salvage.seed + 1}"
    for name in (seed_run, "salvage_anchor_off"):
        assert _ran(variants / name) == {"salvage": True, "eval": True}
        assert links.read_links(variants / name) == {k: str(tmp_path / k) for k in ("sft", "mine")}
    seed_config = manifest.read_manifest(variants / seed_run, "salvage")["config"]
    assert seed_config["salvage"]["seed"] == config.salvage.seed + 1
    got = json.loads((tmp_path / "demo_table.json").read_text())
    rows = {r["key"]: r for r in got["policies"]["rows"]}
    assert list(rows) == ["sft_first", "sft", "rmsweb", seed_run, "salvage_anchor_off"]
    mean = got["rl_mean"]
    assert mean["keys"] == ["rmsweb", seed_run] and mean["n"] == 2
    assert mean["difference"] == pytest.approx((rows["rmsweb"]["vs_baseline"]["difference"]
                                                + rows[seed_run]["vs_baseline"]["difference"]) / 2)
    assert "RMSWeb, mean over 2 Salvage-DS seeds" in (tmp_path / "demo_table.md").read_text()
