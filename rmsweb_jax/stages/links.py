"""Where a workdir's stage folders are: its own, or those of the workdir it links to (the table's variants).

    links.folder(workdir, "sft")   # <workdir>/sft, or the folder <workdir>/links.json names for "sft"

A variant of the table stage (<workdir>/variants/<name>/, rmsweb_jax/stages/table.py) reads some of the
main run's outputs (the store, sft/, mine/) instead of producing them: its links.json maps those
folder names to the main run's folders, and every stage that reads another stage's folder by its
default path asks `folder` for it. A file rather than symbolic links, because a bucket (gs://) has none;
the same file on local disk, so both run one code path.
"""
from __future__ import annotations

import json

from rmsweb_jax import storage
from rmsweb_jax.errors import UserError

LINKS_FILE = "links.json"


def read_links(workdir) -> dict[str, str]:
    """Returns {folder name: the folder it stands for} of `workdir` ({} without a links file)."""
    path = storage.as_path(workdir) / LINKS_FILE
    try:
        links = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not JSON ({e}); it maps folder names to folders, e.g. "
                        '{"sft": "/runs/main/sft"}: delete it to read this workdir\'s own folders') from e
    if not isinstance(links, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in links.items()):
        raise UserError(f"{path}: expected an object of folder name -> folder path, got {links!r}")
    return links


def folder(workdir, name: str):
    """Returns the folder `name` (e.g. "sft", "mine", "store") of `workdir`: the one its links file names,
    else <workdir>/<name>; a pathlib.Path, or an etils.epath.Path on a bucket."""
    target = read_links(workdir).get(name)
    return storage.as_path(target) if target else storage.as_path(workdir) / name


def write_links(workdir, links: dict[str, object]) -> None:
    """Writes `workdir`'s links file ({folder name: folder}) unless it already says exactly that (no file = {})."""
    want = {name: str(path) for name, path in sorted(links.items())}
    if read_links(workdir) != want:
        storage.write_text_atomic(storage.as_path(workdir) / LINKS_FILE, json.dumps(want, indent=2))
