"""The evaluation report on two real stores written through StoreWriter: every figure is recomputed
here from the table the stores were written from (Wilson from its quadratic, the bootstrap intervals
from their exact distributions, McNemar with scipy), never through the report's own helpers."""
import collections
import dataclasses
import itertools
import json
import math
import statistics

import pytest
from PIL import Image
from scipy import stats as scipy_stats

from rmsweb_jax.collect.store import StoreError
from rmsweb_jax.collect.store_fixture import retry_group
from rmsweb_jax.evaluate import plots
from rmsweb_jax.evaluate.report import build_report, compare, markdown, policy_figures, write_report
from rmsweb_jax.judges.base import Verdict
from tests.settings import store_writer

SAMPLES, SEED = 10_000, 7
PAIRS = {("t-a", s) for s in range(5)} | {("t-b", s) for s in range(4)} | {("t-c", s) for s in range(3)}

# (task, seed): (outcome, steps, wall_s). outcome: 1 solved, 0 failed, "lost" (browser faults),
# "error" (the judge could not decide), "retried" (attempt 1 failed with `steps`, attempt 2 solved).
TEACHER = {("t-a", 0): (1, 2, 1.0), ("t-a", 1): (1, 3, 1.5), ("t-a", 2): (1, 2, 0.8), ("t-a", 3): (0, 4, 2.0),
           ("t-a", 4): (1, 4, 1.2), ("t-b", 0): (1, 3, 1.1), ("t-b", 1): (0, 5, 2.5), ("t-b", 2): (0, 2, 0.9),
           ("t-b", 3): ("lost", 0, 3.0), ("t-c", 0): (0, 3, 1.0), ("t-c", 1): (1, 2, 0.7), ("t-c", 2): (0, 6, 3.3),
           ("t-a", 99): (1, 2, 0.5)}  # not an evaluation pair
# LLM-judged; ("t-c", 2) was never played; ("t-z", 7) is not an evaluation pair.
MODEL = {("t-a", 0): (0, 5, 4.0), ("t-a", 1): (1, 2, 2.0), ("t-a", 2): (0, 3, 2.2), ("t-a", 3): (1, 3, 2.1),
         ("t-a", 4): (0, 4, 3.0), ("t-b", 0): (1, 4, 2.6), ("t-b", 1): (0, 2, 1.4), ("t-b", 2): (0, 3, 1.9),
         ("t-b", 3): ("error", 3, 2.4), ("t-c", 0): ("retried", 3, 1.8), ("t-c", 1): (1, 5, 3.5),
         ("t-z", 7): (1, 1, 0.4)}
MODEL_KEYS = sorted(MODEL)


def judge_tokens(key) -> tuple[int, int]:
    """The LLM judge's (prompt, completion) tokens on the model's episode `key`."""
    i = MODEL_KEYS.index(key)
    return 1000 + 37 * i, 20 + i


def _group(key, spec, llm: bool, policy: str):
    task, seed = key
    outcome, steps, wall = spec
    solved = outcome == 1
    # retry_group: a solving attempt takes `steps` steps, a failed one `steps + 1`.
    group = retry_group(task, seed, solved_at=2 if outcome == "retried" else (1 if solved else None),
                        attempts=2 if outcome == "retried" else 1, steps=max(steps - (not solved), 0),
                        policy=policy)
    out = []
    for traj, recs in group:
        fields = {"wall_s": wall}
        if llm:
            p, c = judge_tokens(key)
            verdict = "error" if outcome == "error" else ("success" if traj.success else "failure")
            fields.update(verdict=Verdict(outcome=verdict, reason="unreadable reply" if verdict == "error" else "ok",
                                          judge="webvoyager", calls=1, prompt_tokens=p, completion_tokens=c),
                          reward=None, suite_success=None, judge="webvoyager")
        if outcome == "lost":
            recs = []
            fields.update(num_steps=0, status="failed", prompt_tokens=0, completion_tokens=0, reward=None,
                          suite_success=None, faults=("crash 1", "crash 2"),
                          verdict=Verdict(outcome="error", reason="browser faults: crash 1; crash 2", judge="pool"))
        out.append((dataclasses.replace(traj, **fields), recs))
    return out


def write_store(path, table, *, llm: bool, policy: str):
    with store_writer(path, flush_every_tasks=3, policy=policy) as store:
        for key, spec in table.items():
            store.add_group(_group(key, spec, llm, policy))
    return path


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    return (write_store(root / "teacher", TEACHER, llm=False, policy="teacher"),
            write_store(root / "model", MODEL, llm=True, policy="model"))


# --- the figures, recomputed from the tables ---------------------------------------------------
def solved(spec) -> bool:
    return spec[0] == 1  # a retried pair failed its one counted attempt


def wilson(k: int, n: int) -> tuple[float, float]:
    """The roots in p of n (k/n - p)^2 = z^2 p (1 - p)."""
    z = scipy_stats.norm.ppf(0.975)
    a, b, c = n + z * z, -(2 * k + z * z), k * k / n
    root = math.sqrt(b * b - 4 * a * c)
    return (-b - root) / (2 * a), (-b + root) / (2 * a)


def policy_tokens(steps: int) -> tuple[int, int]:
    """store_fixture.click_step's token counts summed over an attempt of `steps` steps."""
    return sum(100 + i for i in range(steps)), sum(10 + i for i in range(steps))


def expected(table, llm: bool, keys) -> dict:
    specs = [table[k] for k in keys]
    n, k = len(specs), sum(solved(s) for s in specs)
    lost = sum(s[0] == "lost" for s in specs)
    errors = sum(s[0] == "error" for s in specs)
    steps = [s[1] for s in specs if solved(s)]
    cost = {"policy_calls": sum(s[1] for s in specs) / n,
            "prompt_tokens": sum(policy_tokens(s[1])[0] for s in specs) / n,
            "completion_tokens": sum(policy_tokens(s[1])[1] for s in specs) / n,
            "wall_s": sum(s[2] for s in specs) / n,
            "judge_calls": (1.0 if llm else 0.0),
            "judge_prompt_tokens": sum(judge_tokens(key)[0] for key in keys) / n if llm else 0.0,
            "judge_completion_tokens": sum(judge_tokens(key)[1] for key in keys) / n if llm else 0.0}
    return {"episodes": n, "solved": k, "success": k / n, "failures": n - k - lost - errors,
            "judge_errors": errors, "browser_lost": lost, "mean_steps_solved": sum(steps) / len(steps),
            "median_steps_solved": statistics.median(steps), "cost": cost, "ci95": wilson(k, n)}


def check_figures(got: dict, want: dict) -> None:
    for key in ("episodes", "solved", "failures", "judge_errors", "browser_lost"):
        assert got[key] == want[key], key
    for key in ("success", "mean_steps_solved", "median_steps_solved"):
        assert got[key] == pytest.approx(want[key]), key
    assert got["ci95"] == pytest.approx(want["ci95"], abs=1e-12)
    assert got["cost"] == pytest.approx(want["cost"])


@pytest.mark.parametrize("which", ["teacher", "model"])
def test_policy_figures_per_task_and_overall(stores, which):
    table, llm, store = (TEACHER, False, stores[0]) if which == "teacher" else (MODEL, True, stores[1])
    figures = policy_figures(store, PAIRS, bootstrap_samples=SAMPLES, seed=SEED)
    keys = sorted(k for k in table if k in PAIRS)
    assert sorted(figures["tasks"]) == sorted({t for t, _ in keys})  # no t-z, no t-a#99
    check_figures(figures["overall"], expected(table, llm, keys))
    for task, row in figures["tasks"].items():
        check_figures(row, expected(table, llm, [k for k in keys if k[0] == task]))
    assert figures["missing"] == ([] if which == "teacher" else [("t-c", 2)])
    # Three tasks: the all-same-task draws (1/27 each > 2.5%) are the extremes of the clustered
    # bootstrap, so its 95% interval runs from the worst task's rate to the best's.
    rates = [sum(solved(table[k]) for k in keys if k[0] == t) / sum(k[0] == t for k in keys)
             for t in figures["tasks"]]
    assert figures["overall"]["ci95_bootstrap"] == pytest.approx([min(rates), max(rates)])
    apart = {(e["task"], e["seed"]): e["kind"] for e in figures["apart"]}
    assert apart == ({("t-b", 3): "browser lost"} if which == "teacher" else {("t-b", 3): "judge error"})


def test_compare_pairs_mcnemar_and_steps_on_both_solved(stores):
    result = compare(*stores, PAIRS, bootstrap_samples=SAMPLES, seed=SEED)
    common = sorted(set(TEACHER) & set(MODEL) & PAIRS)
    a = [float(solved(TEACHER[k])) for k in common]
    b = [float(solved(MODEL[k])) for k in common]
    n = len(common)
    assert result["n"] == n == 11 and result["tasks"] == 3
    assert result["success_a"] == pytest.approx(sum(a) / n) and result["success_b"] == pytest.approx(sum(b) / n)
    assert result["difference"] == pytest.approx((sum(a) - sum(b)) / n)
    assert result["difference"] == pytest.approx(2 / 11)
    only_a = sum(bool(x and not y) for x, y in zip(a, b))
    only_b = sum(bool(y and not x) for x, y in zip(a, b))
    assert (result["mcnemar"]["b"], result["mcnemar"]["c"]) == (only_a, only_b) == (3, 1)
    assert result["mcnemar"]["p"] == pytest.approx(scipy_stats.binomtest(only_a, only_a + only_b, 0.5).pvalue)
    assert result["mcnemar"]["p"] == pytest.approx(2 * (1 + 4) / 16)
    both = [k for k in common if solved(TEACHER[k]) and solved(MODEL[k])]
    steps = result["steps_both_solved"]
    assert steps["n_both"] == len(both) == 3
    assert steps["mean_a"] == pytest.approx(sum(TEACHER[k][1] for k in both) / 3)
    assert steps["mean_b"] == pytest.approx(sum(MODEL[k][1] for k in both) / 3)
    assert steps["mean_difference"] == pytest.approx(steps["mean_a"] - steps["mean_b"])
    assert steps["mean_difference"] == pytest.approx(-1.0)
    # Only t-a has discordant pairs, so the within-task bootstrap is 5 draws from t-a's differences
    # (over all 11 pairs): its exact distribution gives the interval.
    diffs = [x - y for k, x, y in zip(common, a, b) if k[0] == "t-a"]
    assert all(x == y for k, x, y in zip(common, a, b) if k[0] != "t-a")
    counts = collections.Counter(sum(diffs[i] for i in draw) for draw in itertools.product(range(5), repeat=5))
    cdf, total, acc = [], 5 ** 5, 0
    for value in sorted(counts):
        acc += counts[value]
        cdf.append((value, acc / total))
    # The quantiles sit well inside an atom (no CDF step within 0.005 of 2.5% / 97.5%).
    assert all(abs(p - q) > 0.005 for _, p in cdf for q in (0.025, 0.975))
    low = next(v for v, p in cdf if p >= 0.025) / n
    high = next(v for v, p in cdf if p >= 0.975) / n
    assert result["ci95"] == pytest.approx([low, high])
    assert [low, high] == pytest.approx([-2 / 11, 5 / 11])


def test_build_markdown_and_files(stores, tmp_path):
    policies = [{"id": "teacher@abc", "label": "teacher", "store_dir": stores[0]},
                {"id": "model@def", "label": "model", "store_dir": stores[1]}]
    report = build_report(policies, PAIRS, [("teacher", "model")], bootstrap_samples=SAMPLES, seed=SEED)
    assert [p["label"] for p in report["policies"]] == ["teacher", "model"]
    assert report["policies"][0] | {"id": 0, "label": 0, "store_dir": 0} == policy_figures(
        stores[0], PAIRS, bootstrap_samples=SAMPLES, seed=SEED) | {"id": 0, "label": 0, "store_dir": 0}
    [comparison] = report["comparisons"]
    assert comparison == {"a": "teacher", "b": "model", **compare(*stores, PAIRS, bootstrap_samples=SAMPLES,
                                                                     seed=SEED)}
    md = markdown(report)
    assert "judge errors and episodes lost to browser faults count as unsolved" in md.lower()
    lo, hi = wilson(6, 12)
    assert (f"| teacher | 6 / 12 | 50.0% | {100 * lo:.1f}–{100 * hi:.1f}% | 25.0–80.0% | 2.7 / 2.5 | 5 | 0 | 1 |"
            in md)
    lo, hi = wilson(4, 5)
    assert f"| t-a | 4 / 5 | 80.0% | {100 * lo:.1f}–{100 * hi:.1f}% | — | 2.8 / 2.5 | 1 | 0 | 0 |" in md
    assert "| teacher vs model | 11 | 54.5% | 36.4% | +18.2 points | -18.2 to +45.5 | 3 / 1 | 0.625 | 3 | " \
           "2.67 / 3.67 | -1.00 |" in md
    assert "store `" + str(stores[0]) + "`; judge: programmatic." in md  # the fault verdicts' "pool" is no judge
    assert "- teacher: t-b#3 — browser lost: browser faults: crash 1; crash 2" in md
    assert "- model: t-b#3 — judge error: unreadable reply" in md
    assert "1 planned pair has no episode in the store** (e.g. t-c#2)" in md
    # Cost: the model's judge tokens per episode, from the table.
    keys = sorted(k for k in MODEL if k in PAIRS)
    mean_steps = sum(MODEL[k][1] for k in keys) / len(keys)
    mean_judge_prompt = sum(judge_tokens(k)[0] for k in keys) / len(keys)
    assert f"| model | **all** | {mean_steps:.1f} | " in md and f"| 1.0 | {mean_judge_prompt:,.0f} |" in md

    paths = write_report(report, tmp_path / "out")
    assert json.loads(paths["json"].read_text()) == json.loads(json.dumps(report))
    assert paths["md"].read_text() == md
    image = Image.open(paths["png"]).convert("RGB")
    colors = set(image.getdata())
    assert plots.policy_color(0) in colors and plots.policy_color(1) in colors


def test_refusals(stores, tmp_path):
    policies = [{"id": "x", "label": "same", "store_dir": stores[0]}, {"id": "y", "label": "same",
                                                                       "store_dir": stores[1]}]
    with pytest.raises(ValueError, match="distinct labels"):
        build_report(policies, PAIRS, [], bootstrap_samples=10, seed=0)
    policies[1]["label"] = "other"
    with pytest.raises(ValueError, match=r"comparison \('same', 'nope'\).*unknown \['nope'\]"):
        build_report(policies, PAIRS, [("same", "nope")], bootstrap_samples=10, seed=0)
    with pytest.raises(StoreError, match="holds no first attempt of the 1 evaluation pairs"):
        policy_figures(stores[0], {("t-q", 0)}, bootstrap_samples=10, seed=0)
    # A programmatic verdict the "solved" rule would not give (a partial reward counted a success).
    group = retry_group("p", 0, solved_at=1, attempts=1)
    traj, recs = group[0]
    with store_writer(tmp_path / "partial") as store:
        store.add_group([(dataclasses.replace(traj, reward=0.6), recs)])
    with pytest.raises(StoreError, match="raw reward 0.6 was judged a success"):
        policy_figures(tmp_path / "partial", {("p", 0)}, bootstrap_samples=10, seed=0)


def test_no_shared_pair_is_reported_not_guessed(stores):
    # The teacher never played t-z#7: nothing to compare, and the table says so.
    result = compare(*stores, {("t-z", 7)}, bootstrap_samples=10, seed=0)
    assert result["n"] == 0 and result["difference"] is None and result["ci95"] is None
    assert result["mcnemar"] == {"b": 0, "c": 0, "p": 1.0} and result["steps_both_solved"]["n_both"] == 0
    report = build_report([{"id": "m", "label": "model", "store_dir": stores[1]},
                           {"id": "t", "label": "teacher", "store_dir": stores[0]}], None, [("model", "teacher")],
                          bootstrap_samples=10, seed=0)
    assert report["comparisons"][0]["n"] == 11  # pairs=None: every stored pair; t-a#99 and t-z#7 are not shared
    report["comparisons"][0].update(result)
    assert "| model vs teacher | 0 | — | — | — | — | 0 / 0 | 1 | 0 | — / — | — |" in markdown(report)
