"""Eval of the scripted teacher on two real JAX processes on 127.0.0.1 with 4 CPU devices each (gloo) against
one process with 8 devices, both through `python -m rmsweb_jax.main` (RMSWEB_DISTRIBUTED=1 for the pair): each
process plays its share of the (task, seed) pairs in its own Chromium, process 0 merges the shares into the
policy's store and writes the report once; the report's figures equal the one-process report's; a rerun on
both hosts plays nothing again. Every model stage at the pod presets' layouts: tests/stages/test_pod_layouts.py.
"""
import json
import pathlib
import re

import pytest

from tests.stages import main_processes

CONFIG = "tests/stages/multiprocess_configs.py"
DEVICES = 8
TIMEOUT_S = 900  # two processes and a reference compile at once on 2 cores


def _start(name: str, workdir: pathlib.Path, processes: int, overrides: list[str]) -> list[tuple]:
    """Starts the `processes` processes of one run of config `name` over DEVICES CPU devices in all."""
    return main_processes.start(workdir, processes, DEVICES // processes, [f"--config={CONFIG}:{name}", *overrides])


def _wait(runs: list[list[tuple]]) -> None:
    main_processes.wait(runs, TIMEOUT_S)


def _report(workdir: pathlib.Path) -> dict:
    """Returns workdir's eval_report.json with the workdir in its paths written as <workdir>, less the episodes'
    wall times (cost.wall_s: measured, never equal between two runs)."""
    def without_wall_time(node):
        if isinstance(node, dict):
            return {k: without_wall_time(v) for k, v in node.items() if k != "wall_s"}
        return [without_wall_time(v) for v in node] if isinstance(node, list) else node
    text = (workdir / "eval" / "eval_report.json").read_text().replace(str(workdir), "<workdir>")
    return without_wall_time(json.loads(text))


@pytest.mark.slow
def test_eval_on_two_processes_reports_what_one_process_reports(tmp_path):
    from rmsweb_jax.collect.store import TrajectoryStore
    one, two = tmp_path / "one", tmp_path / "two"
    _wait([_start("eval_teacher", one, 1, []), _start("eval_teacher", two, 2, [])])
    want, got = _report(one), _report(two)
    (policy,) = got["policies"]
    assert policy["overall"]["episodes"] == 9 and 0 < policy["overall"]["solved"] < 9  # mistakes made some fail
    assert got == want
    store = two / "eval" / policy["id"] / "store"
    with TrajectoryStore(store) as reader:
        trajectories = list(reader.trajectories())
    assert len(trajectories) == 9 and len({t.key for t in trajectories}) == 9  # each pair once, merged once
    assert sorted(p.name for p in store.parent.iterdir()) == ["settings.json", "store"]  # the parts are gone
    logs = [(two.parent / f"two.process{i}.log").read_text() for i in range(2)]
    played = [int(re.search(r"this run played (\d+) task groups", log).group(1)) for log in logs]
    assert played == [5, 4]  # pairs 0, 2, 4, 6, 8 and 1, 3, 5, 7: each host played its share

    # Rerun on both hosts: every pair is in the merged store already, so no host plays one again.
    _wait([_start("eval_teacher", two, 2, ["--config.rerun=eval"])])
    logs = [(two.parent / f"two.process{i}.log").read_text() for i in range(2)]
    assert all("this run played 0 task groups" in log for log in logs), logs[0][-2000:]
    assert _report(two) == want
