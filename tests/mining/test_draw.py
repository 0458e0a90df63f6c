"""mining.draw: the stratified draw of reference steps. Items laid out as a store holds them (task by
task), where a prefix would be one task's."""
import random

import pytest

from rmsweb_jax.mining.draw import allocate, stratified_sample

# 4 tasks of 30, 10, 5 and 1 steps, in commit order: task t's steps are (t, step index)
STEPS = [(t, i) for t, size in enumerate((30, 10, 5, 1)) for i in range(size)]


def task(item):
    return item[0]


def test_a_prefix_is_one_task_but_the_draw_has_every_task():
    assert {task(s) for s in STEPS[:8]} == {0}  # what `split.train[:max_states]` replayed
    for n in (4, 8, 20):
        for seed in range(5):
            got = stratified_sample(STEPS, task, n, seed)
            assert len(got) == n and len(set(got)) == n and {task(s) for s in got} == {0, 1, 2, 3}


def test_round_robin_allocation_passes_a_small_task_share_on():
    assert allocate([30, 10, 5, 1], 20, [0, 1, 2, 3]) == [7, 7, 5, 1]
    assert allocate([30, 10, 5, 1], 6, [3, 2, 1, 0]) == [1, 2, 2, 1]
    assert allocate([2, 2], 9, [0, 1]) == [2, 2]
    counts = {t: sum(task(s) == t for s in stratified_sample(STEPS, task, 20, 0)) for t in range(4)}
    assert counts[3] == 1 and counts[2] == 5 and {counts[0], counts[1]} == {7}


def test_picks_spread_over_a_tasks_steps():
    got = [i for t, i in stratified_sample(STEPS, task, 12, 3) if t == 0]  # 3 of task 0's 30 steps
    assert len(got) == 3 and got[0] < 10 <= got[1] < 20 <= got[2]


def test_deterministic_for_a_seed_and_independent_of_input_order():
    shuffled = STEPS[:]
    random.Random(1).shuffle(shuffled)
    for n in (3, 7, 30):
        assert stratified_sample(STEPS, task, n, 5) == stratified_sample(shuffled, task, n, 5)
    draws = {tuple(stratified_sample(STEPS, task, 10, seed)) for seed in range(8)}
    assert len(draws) > 1  # the seed matters


def test_everything_when_n_covers_it_and_nothing_for_zero():
    assert stratified_sample(STEPS, task, len(STEPS), 0) == sorted(STEPS)
    assert stratified_sample(STEPS, task, 1000, 0) == sorted(STEPS)
    assert stratified_sample(STEPS, task, 0, 0) == []
    with pytest.raises(ValueError, match="expected n >= 0"):
        stratified_sample(STEPS, task, -1, 0)
