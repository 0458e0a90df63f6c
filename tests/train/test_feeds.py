"""Feeds (train/feeds.py): which processes load the same rows, read from the rows each process's devices hold.

The layouts are those of the pod presets scaled down (a process's devices' row spans, as
`sharding.devices_indices_map` gives them); tests/train/test_multiprocess_images.py and
tests/stages/test_pod_layouts.py run them with real processes."""
import pytest

from rmsweb_jax.train.feeds import feeds_of


def test_one_row_block_per_process_makes_each_process_a_feed():
    # mesh (1, 4, 1) over 2 processes of 2 devices: process 0 holds rows 0-3, process 1 rows 4-7.
    held = {0: {(0, 2), (2, 4)}, 1: {(4, 6), (6, 8)}}
    layout = feeds_of(held, 8, me=1)
    assert layout.groups == ((0,), (1,)) and layout.index == 1 and layout.count == 2


def test_a_tensor_group_over_two_processes_makes_them_one_feed():
    # mesh (1, 2, 2) over 4 processes of 1 device (a pod's tensor 8 over 4-chip hosts, scaled down).
    held = {0: {(0, 4)}, 1: {(0, 4)}, 2: {(4, 8)}, 3: {(4, 8)}}
    layout = feeds_of(held, 8, me=3)
    assert layout.groups == ((0, 1), (2, 3)) and layout.index == 1 and layout.processes == (2, 3)
    assert layout.of_process(1) == 0


def test_feeds_follow_the_rows_not_the_process_ids():
    # Processes 0 and 3 share the last block, 1 and 2 the first: feeds are ordered by the rows they hold.
    held = {0: {(4, 8)}, 1: {(0, 4)}, 2: {(0, 4)}, 3: {(4, 8)}}
    assert feeds_of(held, 8, me=0).groups == ((1, 2), (0, 3))
    assert feeds_of(held, 8, me=0).index == 1


def test_every_process_holding_every_row_is_one_feed():
    assert feeds_of({0: {(0, 8)}, 1: {(0, 8)}}, 8, me=0).groups == ((0, 1),)


def test_processes_sharing_part_of_their_rows_are_refused():
    with pytest.raises(ValueError, match="row 4 of a batch of 8 rows is held by 2 different sets of processes"):
        feeds_of({0: {(0, 4), (4, 6)}, 1: {(4, 6), (6, 8)}}, 8, me=0)


def test_unequal_shares_are_refused():
    with pytest.raises(ValueError, match=r"unequal numbers of rows \[2, 6\]"):
        feeds_of({0: {(0, 2)}, 1: {(2, 8)}}, 8, me=0)


def test_rows_no_process_holds_are_refused():
    with pytest.raises(ValueError, match="row 6 of a batch of 8 rows is held by 0"):
        feeds_of({0: {(0, 3)}, 1: {(3, 6)}}, 8, me=0)
