"""The mine stage's replay journal on real files: a folder of another replay is emptied, a gap ends what is
trusted, only the writer writes (the end-to-end stop and rerun: tests/stages/test_mine_stage.py)."""
import json

from rmsweb_jax.mining.replay_journal import KEY_FILE, ReplayJournal


def test_batches_are_read_back_in_order_up_to_the_first_gap(tmp_path):
    journal = ReplayJournal(tmp_path / "replay", {"checkpoint": "hf:/a", "steps": "x"}, writer=True)
    assert journal.done() == []
    for position in (0, 1, 3):
        journal.add(position, [{"index": position, "samples": ["s"]}])
    again = ReplayJournal(tmp_path / "replay", {"checkpoint": "hf:/a", "steps": "x"}, writer=True)
    assert again.done() == [[{"index": 0, "samples": ["s"]}], [{"index": 1, "samples": ["s"]}]]
    assert sorted(p.name for p in (tmp_path / "replay").iterdir()) == [
        "batch-000000.json", "batch-000001.json", "batch-000003.json", KEY_FILE]
    assert not list((tmp_path / "replay").glob("*.tmp*"))  # each batch written whole, then renamed


def test_another_replays_folder_is_emptied_and_only_the_writer_writes(tmp_path):
    ReplayJournal(tmp_path / "replay", {"checkpoint": "hf:/a"}, writer=True).add(0, [{"index": 0}])
    reader = ReplayJournal(tmp_path / "replay", {"checkpoint": "hf:/b"}, writer=False)
    assert reader.done() == [] and (tmp_path / "replay" / "batch-000000.json").exists()  # not its to remove
    reader.add(0, [{"index": 9}])
    assert json.loads((tmp_path / "replay" / "batch-000000.json").read_text()) == [{"index": 0}]
    other = ReplayJournal(tmp_path / "replay", {"checkpoint": "hf:/b"}, writer=True)
    assert other.done() == []
    assert [p.name for p in (tmp_path / "replay").iterdir()] == [KEY_FILE]
    assert json.loads((tmp_path / "replay" / KEY_FILE).read_text()) == {"checkpoint": "hf:/b"}


def test_a_key_file_cut_short_is_another_replays(tmp_path):
    (tmp_path / "replay").mkdir()
    (tmp_path / "replay" / KEY_FILE).write_text('{"checkpoint": "hf:')
    (tmp_path / "replay" / "batch-000000.json").write_text("[]")
    assert ReplayJournal(tmp_path / "replay", {"checkpoint": "hf:/a"}, writer=True).done() == []
    assert [p.name for p in (tmp_path / "replay").iterdir()] == [KEY_FILE]
