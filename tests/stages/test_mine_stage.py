"""The mine stage end to end on a small store: sft trains the demo-sized model two steps and exports it,
mine replays every reference step of the training split (never a held-out group, never a labelled
detour) and writes the state set, whose examples are the SFT view's, and the report."""
import dataclasses
import json

import pytest
from PIL import Image

from rmsweb_jax.collect.sft_view import SFTView
from rmsweb_jax.collect.store_fixture import task_group, write_synthetic_store
from rmsweb_jax.errors import UserError
from rmsweb_jax.main import run_stages
from rmsweb_jax.mining.state_set import StateSet
from rmsweb_jax.mining.taxonomy import TAXONOMY
from rmsweb_jax.stages.mine import merge_rollout_states, replay_indices, select_states, state_indices, uniform_states
from tests.settings import store_writer
from tests.stages import small_mine_config

VIEWPORT = (200, 120)


def _config():
    return small_mine_config.get_config()


def _store(path):
    write_synthetic_store(path, tasks=3, seeds=2, viewport=VIEWPORT)
    with store_writer(path) as writer:  # two more groups whose click step is a labelled teacher detour
        for t in range(2):
            (traj, steps), = task_group(f"synthetic.detour-{t}", 0, fail_first=False, viewport=VIEWPORT, variant=t)
            writer.add_group([(traj, [dataclasses.replace(s, label="detour" if s.step == 1 else None)
                                      for s in steps])])
    return path


def test_mine_without_an_sft_split_or_with_bad_settings_is_a_user_error(tmp_path):
    config = _config()
    config.stages = ("mine",)
    with pytest.raises(UserError, match="split.json: no split; the sft stage writes it"):
        run_stages(config, tmp_path)
    config.mine.tau = 1.5
    with pytest.raises(UserError, match=r"config.mine.tau must be in \(0, 1\]"):
        run_stages(config, tmp_path)


@pytest.mark.slow
def test_mine_on_the_sft_training_split(tmp_path):
    store = _store(tmp_path / "store")
    config = _config()
    config.stages = ("sft", "mine")
    run_stages(config, tmp_path)

    split = json.loads((tmp_path / "sft" / "split.json").read_text())
    train = {tuple(k) for k in split["train_task_groups"]}
    held = {tuple(k) for k in split["held_out_task_groups"]}
    assert train and held
    view = SFTView(store)
    train_steps = [i for i in range(len(view)) if view.task_key(i) in train]
    detours = [i for i in train_steps if view[i].step.label == "detour"]

    report = json.loads((tmp_path / "mine" / "report.json").read_text())
    assert report["states"] == len(train_steps) - len(detours)
    assert report["skipped"] == ({"detour": len(detours)} if detours else {})
    assert report["critical"] + report["routine"] == report["states"]
    assert sum(report["failure_modes"].values()) == report["critical"]
    assert set(report["failure_modes"]) == set(TAXONOMY)
    assert report["throughput"]["states"] == report["states"] and report["throughput"]["states_per_s"] > 0
    assert set(report["by_task"]) == {k[0] for k in train} and report["rollouts"] is None

    with StateSet(tmp_path / "mine" / "states.arrayrecord") as states:
        assert len(states) == report["state_set"]["states"]
        assert sum(s.critical for s in states) == report["critical"]  # every critical state is kept
        assert sum(not s.critical for s in states) == report["state_set"]["routine"]
        by_name = {f"{view[i].request_id}/{view[i].step.step}": i for i in train_steps}
        for i, state in enumerate(states):
            assert state.key in train and state.key not in held
            assert state.source == "replay" and state.teacher_label is None
            assert state.critical == (state.replay_accuracy < config.mine.tau)
            assert state.critical == (state.failure_mode in TAXONOMY)
            assert state.reference_logprob is not None and state.reference_logprob < 0
            example = states.example(i)
            assert example == view[by_name[f"{state.request_id}/{state.step}"]]
            assert state.reference_text == example.target_text and state.reference_action == example.step.action

    summary = json.loads((tmp_path / "mine" / "summary.json").read_text())
    assert summary["critical"] == report["critical"] and summary["state_set"] == report["state_set"]
    markdown = (tmp_path / "mine" / "report.md").read_text()
    assert "## Failure modes of critical states" in markdown and "## By task" in markdown
    assert Image.open(tmp_path / "mine" / "failure_modes.png").size == (720, 360)


def test_a_capped_replay_draws_from_every_task_not_the_first_one(tmp_path):
    view = SFTView(write_synthetic_store(tmp_path / "store", tasks=3, seeds=2, viewport=VIEWPORT))
    train = list(range(len(view)))
    assert len({view.task_key(i)[0] for i in train[:3]}) == 1  # the prefix the stage once replayed: one task
    got = replay_indices(view, train, 3, 0)
    assert len(got) == 3 and len({view.task_key(i)[0] for i in got}) == 3
    assert replay_indices(view, train[::-1], 3, 0) == got and replay_indices(view, train, 0, 0) == train


def test_the_uniform_state_set_is_drawn_from_all_training_steps_not_the_capped_replay(tmp_path):
    """The rl_all_states ablation's states: the mined set's budget drawn from every reference step of the training
    split. Drawn from the capped replay (as before), it was the mined set less the few states mining drops."""
    store = _store(tmp_path / "store")
    view = SFTView(store)
    train = list(range(len(view)))
    labelled = {i for i in train if view[i].step.label is not None}
    assert labelled  # the two detour steps
    capped = replay_indices(view, train, 3, 0)
    for seed in range(4):
        drawn = state_indices(view, train, 3, 5, seed, skip_labels=("*",))
        assert len(drawn) == 5 > len(capped) and not set(drawn) & labelled
        assert len({view.task_key(i)[0] for i in drawn}) == 5  # stratified over tasks, as the capped replay
        assert drawn == state_indices(view, train[::-1], 3, 5, seed, skip_labels=("*",))  # seeded
    draws = {tuple(state_indices(view, train, 3, 3, seed, skip_labels=("*",))) for seed in range(6)}
    assert tuple(replay_indices(view, train, 3, 0)) != tuple(state_indices(view, train, 3, 3, 0, ("*",)))
    assert len(draws) > 1  # a seeded draw, not one fixed set
    assert state_indices(view, train, 3, 0, 0) == capped  # uniform = 0: the stage's replay
    references = len(train) - len(labelled)
    with pytest.raises(UserError, match=f"uniform_states = {references + 1}, but the training split holds "
                                        f"{references} reference steps"):
        state_indices(view, train, 3, references + 1, 0, skip_labels=("*",))


def test_uniform_states_is_a_seeded_draw_critical_or_not(tmp_path):
    from tests.mining.test_state_set import _state
    view = SFTView(write_synthetic_store(tmp_path / "store", tasks=5, seeds=1))
    states = [_state(view[i], store_dir=view.store_dir, failure_mode="wrong_text" if i % 2 else "routine")
              for i in range(10)]
    got = uniform_states(states, 4, 0)
    assert len(got) == 4 and got == uniform_states(states, 4, 0) and got == [s for s in states if s in got]
    assert len({s.state_id for s in uniform_states(states, 10, 1)}) == 10
    with pytest.raises(ValueError, match="a uniform draw of 11 states from 10"):
        uniform_states(states, 11, 0)


def test_select_states_keeps_every_critical_state_and_the_routine_share(tmp_path):
    from tests.mining.test_state_set import _state
    view = SFTView(write_synthetic_store(tmp_path / "store", tasks=4, seeds=2))
    states = [_state(view[i], store_dir=view.store_dir, failure_mode="wrong_text" if i < 6 else "routine")
              for i in range(len(view))]
    chosen = select_states(states, 0.25, seed=0)
    assert [s for s in chosen if s.critical] == states[:6]
    assert sum(not s.critical for s in chosen) == 2  # 6 critical are 75% of the set
    assert chosen == select_states(states, 0.25, seed=0) != select_states(states, 0.25, seed=1)
    assert select_states(states, 0.0, seed=0) == states[:6]
    assert len(select_states(states, 0.9, seed=0)) == len(states)  # not enough routine states: all of them


def test_a_rollout_divergence_replaces_the_replay_state_of_its_step(tmp_path):
    from tests.mining.test_state_set import _state
    view = SFTView(write_synthetic_store(tmp_path / "store", tasks=2, seeds=1))
    replayed = [dataclasses.replace(_state(view[i], store_dir=view.store_dir, failure_mode="routine"),
                                    replay_accuracy=1.0, reference_logprob=-0.5) for i in range(3)]
    def diverged(i):
        return dataclasses.replace(_state(view[i], store_dir=view.store_dir, failure_mode="wrong_element"),
                                   state_id=f"rollout:{i}", source="rollout", prefix_matched=True,
                                   replay_accuracy=None, reference_logprob=None)
    rollout = [diverged(1), diverged(3)]
    merged = merge_rollout_states(replayed, rollout)
    assert [s.state_id for s in merged] == [replayed[0].state_id, "rollout:1", replayed[2].state_id, "rollout:3"]
    assert merged[1].critical and merged[1].source == "rollout" and merged[1].failure_mode == "wrong_element"
    assert (merged[1].replay_accuracy, merged[1].reference_logprob) == (1.0, -0.5)
    assert merged[3].replay_accuracy is None  # a step replay did not visit keeps what the rollout knew


@pytest.mark.slow
def test_mine_with_rollouts_in_the_browser(tmp_path):
    """collect (the teacher, no mistakes) -> sft (2 steps of the demo model) -> mine with on-policy rollouts
    on real MiniWoB++ pages: every training group played once into the policy's own store, each failed
    rollout's divergence a critical state replacing the replay state of its step."""
    config = _config()
    config.stages = ("collect", "sft", "mine")
    config.collect.tasks, config.collect.num_seeds, config.collect.attempts = "click-button,focus-text", 2, 1
    config.collect.workers, config.collect.max_steps, config.collect.max_new_tokens = 1, 3, 16
    config.collect.teacher.wrong_element_p = config.collect.teacher.detour_p = 0.0
    config.collect.teacher.early_stop_p = 0.0
    config.mine.rollouts = True
    run_stages(config, tmp_path)

    split = json.loads((tmp_path / "sft" / "split.json").read_text())
    report = json.loads((tmp_path / "mine" / "report.json").read_text())
    counts = report["rollouts"]
    assert counts["rollouts"] == len(split["train_task_groups"]) == 3
    assert counts["rollouts"] == counts["solved"] + counts["failed"] + counts["undecided"]
    assert counts["failed"] == counts["diverged"] + counts["matched_throughout"] + counts["no_reference"]
    # The invariants below speak of rollout states: the two-step policy must have left the teacher's path.
    assert counts["diverged"] >= 1, counts
    assert (tmp_path / "mine" / "rollouts").is_dir() and counts["store"].startswith(str(tmp_path / "mine" / "rollouts"))
    states = StateSet(tmp_path / "mine" / "states.arrayrecord")
    rollout = [s for s in states if s.source == "rollout"]
    assert len(rollout) == counts["diverged"]
    train = {tuple(k) for k in split["train_task_groups"]}
    for state in rollout:
        assert state.critical and (state.task_id, state.seed) in train and state.prefix_matched is not None
        assert state.replay_accuracy is not None  # taken over from the replay state of the same step
    steps = [(s.request_id, s.step) for s in states]
    assert len(steps) == len(set(steps))  # one state per reference step



@pytest.mark.slow
def test_sigterm_in_mine_keeps_the_replayed_batches_and_the_rerun_replays_only_the_rest(tmp_path):
    """A real process gets SIGTERM once its replay journal holds a batch: status 143 and the stage's line; the
    rerun takes the journal's batches and replays the rest, and its state set and report equal those of a run never
    stopped (a batch's samples are drawn with the seed of its position)."""
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import time
    from tests.stages.test_stop_signals import ENV, REPO, _line
    _store(tmp_path / "store")
    config = _config()
    config.stages, config.data.store_dir = ("sft",), str(tmp_path / "store")
    run_stages(config, tmp_path / "stopped")
    shutil.copytree(tmp_path / "stopped", tmp_path / "whole")
    env = dict(ENV, PYTHONPATH=REPO)

    def command(workdir):
        return [sys.executable, "-m", "rmsweb_jax.main", "--config=tests/stages/small_mine_config.py:stop",
                f"--workdir={workdir}", f"--config.data.store_dir={tmp_path / 'store'}"]
    whole = subprocess.run(command(tmp_path / "whole"), cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=600)
    assert whole.returncode == 0, whole.stderr[-3000:]

    journal = tmp_path / "stopped" / "mine" / "replay"
    proc = subprocess.Popen(command(tmp_path / "stopped"), cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (journal / "batch-000000.json").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and "Traceback" not in err, (proc.returncode, err[-3000:])
    assert [line for line in err.splitlines() if line.startswith("rmsweb:")] == [_line(signal.SIGTERM, "mine")]
    assert not (tmp_path / "stopped" / "mine" / "summary.json").exists()
    kept = len([p for p in os.listdir(journal) if p.startswith("batch-")])

    rerun = subprocess.run(command(tmp_path / "stopped"), cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"[mine] resumed: {kept} states from {journal}" in rerun.stdout, rerun.stdout
    assert not journal.exists()  # the state set holds what the run kept
    reports = [json.loads((tmp_path / run / "mine" / "report.json").read_text()) for run in ("whole", "stopped")]
    assert reports[0]["throughput"]["resumed_states"] == 0 and reports[1]["throughput"]["resumed_states"] == kept
    for report in reports:
        del report["throughput"], report["checkpoint"], report["split"], report["state_set"]["path"]  # its workdir
    assert reports[0] == reports[1]
    sets = []
    for run in ("whole", "stopped"):
        with StateSet(tmp_path / run / "mine" / "states.arrayrecord") as states:
            sets.append([dataclasses.replace(s, reference_logprob=round(s.reference_logprob, 5)) for s in states])
    assert sets[0] == sets[1] and len(sets[0]) > kept
