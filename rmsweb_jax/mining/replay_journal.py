"""The mine stage's replay so far, a batch of states at a time, so that a stopped run (SIGTERM, Ctrl-C, a crash)
reruns only the batches it had not finished.

    journal = ReplayJournal(workdir / "mine" / "replay", key={"checkpoint": spec, ...}, writer=True)
    replay(view, indices, chat_model, builder, settings, journal=journal)   # mining/replay.py

<folder>/key.json holds what the states depend on (the checkpoint, the replay settings, the steps replayed); a
batch is one file, <folder>/batch-000012.json, written whole (storage.write_text_atomic: local or gs://). A folder
whose key differs is emptied: its states belong to another replay. Batches are sampled with a seed of their own
position, so a resumed replay equals an uninterrupted one.
"""
from __future__ import annotations

import dataclasses
import json
import re

from rmsweb_jax import storage

KEY_FILE = "key.json"
_BATCH = re.compile(r"batch-(\d{6})\.json")


class ReplayJournal:
    """The batches of replayed states a run has finished (`done`), and those it finishes next (`add`)."""

    def __init__(self, folder, key: dict, *, writer: bool):
        self.folder, self.key, self.writer = storage.as_path(folder), json.loads(json.dumps(key)), writer

    def done(self) -> list[list[dict]]:
        """Returns the finished batches, in order, each a list of states as `add` took them (dicts); [] when none
        or when the folder holds another replay's (then emptied for this one)."""
        key_file = self.folder / KEY_FILE
        try:
            same = key_file.exists() and json.loads(key_file.read_text()) == self.key
        except ValueError:  # a key file cut short: not this replay's
            same = False
        batches = []
        if same:
            names = {int(m[1]): p for p in self.folder.iterdir() if (m := _BATCH.fullmatch(p.name))}
            while len(batches) in names:  # the first gap ends what can be trusted: later batches are replayed again
                batches.append(json.loads(names[len(batches)].read_text()))
        elif self.writer:
            if self.folder.exists():
                storage.remove_tree(self.folder)
            self.folder.mkdir(parents=True, exist_ok=True)
            storage.write_text_atomic(key_file, json.dumps(self.key))
        return batches

    def add(self, position: int, states) -> None:
        """Records batch number `position` (its states: dataclasses or dicts)."""
        if self.writer:
            rows = [dataclasses.asdict(s) if dataclasses.is_dataclass(s) else s for s in states]
            storage.write_text_atomic(self.folder / f"batch-{position:06d}.json", json.dumps(rows))
