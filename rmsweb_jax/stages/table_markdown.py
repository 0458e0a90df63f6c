"""RMSWeb's table as markdown (demo_table.md), from the figures the table stage computed (stages/table.py)."""
from __future__ import annotations

from rmsweb_jax.evaluate.report import pct


def _steps(x) -> str:
    return "—" if x is None else f"{x:.2f}"


def markdown(table: dict) -> str:
    """Returns the table as markdown, with a line under the policies saying which differences this
    scale shows (paired interval excluding 0) and which it does not."""
    col, pol, mining = table["collection"], table["policies"], table["mining"]
    baseline = next((r["row"] for r in pol["rows"] if r["key"] == pol.get("baseline")), "the baseline")
    k = col["attempts_k"]
    lines = ["# RMSWeb at this scale", "", f"## Collection ({col['collector']}; {col['plain']['groups']} task groups, "
             f"K = {k}, success rule {col['success_rule']})", "",
             f"| retries | success@1 | success@≤{k} | mean steps (solved) |", "|---|---|---|---|"]
    for key, name in (("plain", "plain (no reflection, randomness re-drawn)"), ("reflection", "reflection-conditioned")):
        r = col[key]
        lines.append(f"| {name} | {pct(r['success_at_1'])} | {pct(r['success_at_le_K'])} | "
                     f"{_steps(r['mean_steps_solved'])} |")
    boot = pol["bootstrap"]
    lines += ["", f"## Policies on held-out seeds ({pol['pairs']} (task, seed) pairs, closed loop, one attempt)", "",
              f"Success with its 95% Wilson interval; mean steps on the {pol['all_solved_pairs']} pairs every row "
              f"solved; difference vs {baseline} paired by pair, 95% paired bootstrap interval "
              f"({boot['samples']:,} samples) and McNemar's exact p.", "",
              "| policy | solved / episodes | success | 95% CI | mean steps (all solved) | difference vs SFT "
              "(reflection) | 95% CI (paired) | McNemar p |", "|---|---|---|---|---|---|---|---|"]
    notes = []
    for r in pol["rows"]:
        v = r["vs_baseline"]
        if v is None or v["difference"] is None:
            diff = ci = p = "—"
        else:
            diff, ci = f"{100 * v['difference']:+.1f} pts", f"{100 * v['ci95'][0]:+.1f} to {100 * v['ci95'][1]:+.1f}"
            p = f"{v['mcnemar_p']:.3g}"
            shown = v["ci95"][0] > 0 or v["ci95"][1] < 0
            side = "above" if v["ci95"][0] > 0 else "below"
            notes.append(f"- {r['row']}: {diff} vs {baseline}; " + (
                f"the paired interval excludes 0: {side} it at this scale." if shown else
                "the paired interval includes 0: a difference is not shown at this scale."))
        lines.append(f"| {r['row']} | {r['solved']} / {r['episodes']} | {pct(r['success'])} | "
                     f"{pct(r['ci95'][0])}–{pct(r['ci95'][1])} | {_steps(r['mean_steps_all_solved'])} | {diff} | "
                     f"{ci} | {p} |")
    lines += ["", *notes, *rl_mean_markdown(table.get("rl_mean"))]
    not_run = table.get("ablations_not_run") or []
    if not_run:
        lines += ["", "Not run: " + "; ".join(f"{r['row']} (the main run already has {r['setting']})"
                                             for r in not_run) + "."]
    lines += ["", "## Mining", "",
              f"{mining['states']} reference steps replayed: {mining['critical']} critical "
              f"({pct(mining['critical_share'])}; replay accuracy < tau = {mining['tau']:g}), {mining['routine']} "
              "routine.", "", "| failure mode | critical states | share |", "|---|---|---|"]
    lines += [f"| {m['mode']} | {m['states']} | {pct(m['share'])} |" for m in mining["failure_modes"]] or [
        "| (none) | 0 | — |"]
    sal = table.get("salvage")
    if sal is not None and sal["updates"]:
        u = sal["per_update"]
        lines += ["", "## Salvage-DS", "",
                  f"{sal['updates']} updates. Per update: {u['states_drawn']:.2f} states drawn, "
                  f"{u['groups_accepted']:.2f} groups accepted by the gates ({pct(sal['accepted_share'])} of those "
                  f"drawn), {u['groups_anchored']:.2f} anchored ({pct(sal['anchored_share'])}; "
                  f"{u['rows_anchor_rows']:.2f} anchor rows trained, {u['rows_anchor_rows_dropped']:.2f} without "
                  f"room in the batch); reward mean {u['reward_mean']:+.3f}; sampled actions right " + (
                      f"{pct(sal['correct_share_first'])} in the first logged window, "
                      f"{pct(sal['correct_share_last'])} in the last." if sal.get("windows", 0) > 1 else
                      f"{pct(u['correct_share'])} (one logged window)." )]
    lines += transfer_markdown(table.get("transfer"))
    return "\n".join(lines) + "\n"


def rl_mean_markdown(m: dict | None) -> list[str]:
    """Returns the lines of RMSWeb - SFT averaged over the Salvage-DS seeds (none without rl_seeds rows)."""
    if m is None:
        return []
    lo, hi = m["ci95"]
    per_run = ", ".join(f"{100 * d:+.1f}" for d in m["per_run"])
    return ["", f"{m['row']} (seeds {', '.join(map(str, m['seeds']))}; per held-out pair, the share of the runs that "
            f"solved it): {pct(m['success_a'])} against {pct(m['success_b'])}, **{100 * m['difference']:+.1f} pts** "
            f"(paired 95% CI {100 * lo:+.1f} to {100 * hi:+.1f}, {m['n']} pairs: episode noise given these runs). "
            f"The runs' own differences: {per_run} (sd {100 * m['per_run_sd']:.1f} pts), the spread one RL run's seed "
            "alone gives."]


def transfer_markdown(tr: dict | None) -> list[str]:
    """Returns the transfer section's lines: SFT vs RMSWeb on the training states and on held-out steps."""
    if tr is None:
        return []
    t, h = tr["training_states"], tr["held_out_steps"]
    lines = ["", "## Transfer: what Salvage-DS learned, on its states and on held-out steps", "",
             "| measure | SFT | RMSWeb | RMSWeb vs SFT |", "|---|---|---|---|",
             f"| sampled accuracy on Salvage-DS's {t['states']} training states (K = {tr['samples']}, temperature "
             f"{tr['temperature']:g}) | {pct(t['sft']['accuracy'])} | {pct(t['rmsweb']['accuracy'])} | "
             + ("—" if t["difference"] is None else
                f"{100 * t['difference']:+.1f} pts (paired 95% CI {100 * t['ci95'][0]:+.1f} to "
                f"{100 * t['ci95'][1]:+.1f}); better on {t['improved']} states, worse on {t['worsened']}") + " |",
             f"| critical training states (accuracy < {t['tau']:g}) | {t['sft']['critical']} | "
             f"{t['rmsweb']['critical']} | |"]
    if h is not None:
        lines.append(f"| greedy step accuracy on {h['steps']} held-out steps ({h['task_groups']} task groups, never "
                     f"trained on) | {pct(h['sft']['accuracy'])} | {pct(h['rmsweb']['accuracy'])} | "
                     f"right only with RMSWeb {h['only_rmsweb_right']}, only with SFT {h['only_sft_right']}; "
                     f"McNemar p {h['mcnemar_p']:.3g} |")
    lines += ["", "A rise on the training states with none on the held-out steps reads as memorised states; no rise "
              "on either, as nothing learned." + ("" if h is not None else f" Held-out steps: {tr['held_out_note']}.")]
    return lines
