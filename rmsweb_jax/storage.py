"""Workdir paths that are local folders or gs:// buckets: the one path layer under the stages' reads and writes.

    path = as_path("gs://bucket/run") / "manifests" / "sft.json"   # etils.epath (gcsfs) for gs://
    write_bytes_atomic(path, data)                                # whole or absent, local or on a bucket

Why these rules:
- A local path stays a `pathlib.Path` and a gs:// path becomes an `etils.epath.Path` (the layer Orbax
  itself uses, backed by gcsfs): local runs keep exactly the code paths they had; a bucket path gets
  the same pathlib-like methods (read_text, write_bytes, exists, iterdir, mkdir, unlink, walk).
- Atomic writes: locally a synced temp file renamed into place (and the folder synced, so the rename
  survives a crash); on GCS one object upload appears whole or not at all, so the final name is
  written directly (a GCS "rename" is a copy plus a delete: slower and not atomic).
- Folders of files a library must read or write through the local file system (ArrayRecord shards:
  array_record opens local files only) live in a local mirror (`mirror_dir`) pulled from the bucket
  before reading and pushed file by file after writing, the commit file last (`push_files`).
- GCS has no flock and no rename: one writer per bucket folder is the caller's duty (on a pod slice
  process 0 writes, rmsweb_jax/stages/pipeline.py), and "moving" a folder copies then deletes.
- gcsfs's listings cache is off: it would keep answering "absent" for what another process (another
  host, a resumed run) or tensorstore (Orbax's arrays) wrote after this process first listed a folder.

The emulator settings (tests/storage_emulator.py starts one): gcsfs reads STORAGE_EMULATOR_HOST,
tensorstore (Orbax's array writer) TENSORSTORE_GCS_HTTP_URL.
"""
from __future__ import annotations

import datetime
import io
import os
import pathlib
import shutil
import tempfile

import fsspec
from etils import epath

from rmsweb_jax.durable import fsync_dir, stream_sha256
from rmsweb_jax.errors import UserError

SCHEME = "gs://"
CACHE_ENV = "RMSWEB_GCS_CACHE"  # where mirrors of bucket folders live (default below)
DEFAULT_CACHE = pathlib.Path.home() / ".cache" / "rmsweb" / "gcs"

# Before etils.epath makes its one gcsfs file system of the process (the module docstring says why).
for _protocol in ("gs", "gcs"):
    fsspec.config.conf.setdefault(_protocol, {})["use_listings_cache"] = False


def is_remote(path) -> bool:
    """Returns whether `path` names a bucket object or folder (gs://...) rather than a local one."""
    return str(path).startswith(SCHEME)


def as_path(path):
    """Returns `path` as a pathlib.Path (local) or an etils.epath.Path (gs://); UserError for another URL scheme."""
    if isinstance(path, epath.Path) and not isinstance(path, pathlib.Path):
        return path
    text = os.fspath(path) if not isinstance(path, str) else path
    if text.startswith(SCHEME):
        if len(text) <= len(SCHEME) or text[len(SCHEME):].startswith("/"):
            raise UserError(f"{text!r}: expected gs://BUCKET/FOLDER")
        return epath.Path(text)
    if "://" in text:
        raise UserError(f"{text!r}: the {text.split('://')[0]}:// scheme is not supported; a path is local or "
                        "gs://BUCKET/FOLDER")
    return pathlib.Path(text)


def user_path(text: str):
    """Returns a path a user typed (a config value, a policy spec): gs:// as etils.epath, a local one with ~ expanded."""
    return as_path(text) if is_remote(text) else pathlib.Path(text).expanduser()


def refuse_remote(path, what: str) -> None:
    """Raises UserError when `path` is gs://: for the writers that go through local files only (`what` says which)."""
    if is_remote(path):
        raise UserError(f"{what} = {path}: this writes local files only and cannot write to a gs:// bucket yet; "
                        "give it a local path (or a gcsfuse mount of the bucket, at the same path on every host)")


def write_bytes_atomic(path, data: bytes) -> None:
    """Writes `data` to `path` whole or not at all (local: synced temp file + rename; gs://: one object)."""
    path = as_path(path)
    if is_remote(path):
        path.write_bytes(data)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        pathlib.Path(tmp).unlink(missing_ok=True)
    fsync_dir(path.parent)


def write_text_atomic(path, text: str) -> None:
    """Writes `text` (UTF-8) to `path` whole or not at all (see write_bytes_atomic)."""
    write_bytes_atomic(path, text.encode())


def write_png(path, image):
    """Returns `path` (local or gs://) after writing the PIL image `image` there as a PNG, whole or not at all."""
    data = io.BytesIO()
    image.save(data, format="PNG")
    path = as_path(path)
    write_bytes_atomic(path, data.getvalue())
    return path


def upload(local: pathlib.Path, dest) -> None:
    """Copies the local file `local` to `dest` (a bucket object appears whole on upload; locally via a rename)."""
    dest = as_path(dest)
    if not is_remote(dest):
        write_bytes_atomic(dest, pathlib.Path(local).read_bytes())
        return
    with open(local, "rb") as src, dest.open("wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 22)
    _stamp(local, dest.stat().mtime)  # the mirror's copy now has the object's version (see pull_tree)


def mirror_dir(remote) -> pathlib.Path:
    """Returns the local folder that mirrors bucket folder `remote` ($RMSWEB_GCS_CACHE/<bucket>/<folder>)."""
    root = pathlib.Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)
    key = str(remote)[len(SCHEME):].strip("/")
    return root / key


def local_side(path) -> tuple[pathlib.Path, "epath.Path | None"]:
    """Returns (where to write `path` through the local file system, the bucket path to upload it to): a local
    path and None; for a gs:// path, its mirror (mirror_dir) and the path itself."""
    if is_remote(path):
        remote = as_path(path)
        return mirror_dir(remote), remote
    return pathlib.Path(path), None


def remote_files(remote) -> dict[str, int]:
    """Returns {path relative to `remote`: size in bytes} of every object under bucket folder `remote`."""
    return {rel: size for rel, (size, _) in remote_versions(remote).items()}


def remote_versions(remote) -> dict[str, tuple[int, int]]:
    """Returns {path relative to `remote`: (bytes, modification time in whole seconds)} of every object under
    bucket folder `remote`, from one listing (sizes and times come with it: no request per object)."""
    remote = as_path(remote)
    prefix = str(remote)[len(SCHEME):].strip("/") + "/"
    listing = epath.backend.fsspec_backend.fs(str(remote)).find(str(remote), detail=True)
    return {name[len(prefix):]: (int(info["size"]), _seconds(info.get("mtime")))
            for name, info in listing.items() if info.get("type") == "file" and name.startswith(prefix)}


def local_files(local: pathlib.Path) -> dict[str, int]:
    """Returns {path relative to `local`: size} of every file under `local` (none when it does not exist)."""
    return {rel: size for rel, (size, _) in local_versions(local).items()}


def local_versions(local: pathlib.Path) -> dict[str, tuple[int, int]]:
    """Returns {path relative to `local`: (bytes, modification time in whole seconds)} of every file under `local`."""
    if not local.is_dir():
        return {}
    return {str(p.relative_to(local)): (p.stat().st_size, int(p.stat().st_mtime)) for p in local.rglob("*")
            if p.is_file()}


def pull_tree(remote, *, keep: tuple[str, ...] = (), rewritten: tuple[str, ...] = ()) -> pathlib.Path:
    """Returns the local mirror of bucket folder `remote`, made equal to it: files missing or of another version
    (size or modification time: a mirror copy carries its object's time) downloaded, and those named in
    `rewritten` (rewritten in place, maybe within a second) always; local files the bucket lacks removed (except
    names in `keep`, e.g. a lock file). A local path is returned as it is."""
    if not is_remote(remote):
        return pathlib.Path(remote)
    remote = as_path(remote)
    local = mirror_dir(remote)
    local.mkdir(parents=True, exist_ok=True)
    theirs, ours = remote_versions(remote), local_versions(local)
    for rel, version in theirs.items():
        if ours.get(rel) != version or pathlib.Path(rel).name in rewritten:
            _download(remote / rel, local / rel)
            _stamp(local / rel, version[1])
    for rel in ours.keys() - theirs.keys():
        if pathlib.Path(rel).name not in keep:
            (local / rel).unlink()
    return local


def push_files(local: pathlib.Path, remote, names) -> None:
    """Uploads the files `names` (relative to `local`) to bucket folder `remote`, in the order given (put the file
    that commits the others last); nothing for a local `remote`."""
    if not is_remote(remote):
        return
    remote = as_path(remote)
    for name in names:
        upload(local / name, remote / name)


def push_folder(local: pathlib.Path, remote, *, last: str) -> None:
    """Uploads every file under `local` to bucket folder `remote`, the file `last` (what a reader looks for, e.g. an
    HF checkpoint's config.json) after all the others: a folder cut short by a kill lacks it and reads as absent."""
    files = sorted(set(local_files(local)) - {last})
    push_files(local, remote, [*files, last])


def pull_file(remote) -> pathlib.Path:
    """Returns the local mirror of bucket object `remote`, downloaded when the bucket has it (else absent locally,
    a stale mirror copy removed). A local path is returned as it is."""
    if not is_remote(remote):
        return pathlib.Path(remote)
    remote = as_path(remote)
    local = mirror_dir(remote)
    if remote.exists():
        _download(remote, local)
    else:
        local.unlink(missing_ok=True)
    return local


def push_tree(local: pathlib.Path, remote, *, skip: tuple[str, ...] = (), rewritten: tuple[str, ...] = ()) -> None:
    """Makes bucket folder `remote` equal to `local`: files missing there or of another version (and those named
    in `rewritten`) uploaded, objects `local` lacks deleted; names in `skip` are neither. Nothing for a local
    `remote`."""
    if not is_remote(remote):
        return
    remote = as_path(remote)
    theirs, ours = remote_versions(remote), local_versions(local)
    ours = {rel: version for rel, version in ours.items() if pathlib.Path(rel).name not in skip}
    for rel, version in sorted(ours.items()):
        if theirs.get(rel) != version or pathlib.Path(rel).name in rewritten:
            upload(local / rel, remote / rel)
    for rel in sorted(theirs.keys() - ours.keys()):
        if pathlib.Path(rel).name not in skip:
            (remote / rel).unlink()


def move_tree(source, target) -> None:
    """Moves folder `source` to `target` (local: one rename; gs://: every object copied, then deleted — GCS has no
    rename, so a crash in between leaves both, never neither)."""
    source, target = as_path(source), as_path(target)
    if not is_remote(source) and not is_remote(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, target)
        fsync_dir(target.parent)
        fsync_dir(source.parent)
        return
    if source.is_dir():
        for rel in sorted(remote_files(source) if is_remote(source) else local_files(source)):
            _copy_file(source / rel, target / rel)
        source.rmtree()
    else:
        _copy_file(source, target)
        source.unlink()


def _copy_file(source, target) -> None:
    """Copies one file or object: bucket to bucket inside GCS (no bytes through this host: a stale checkpoint
    can be gigabytes), otherwise streamed in 4 MiB blocks."""
    if is_remote(source) and is_remote(target):
        epath.backend.fsspec_backend.fs(str(source)).copy(str(source), str(target))
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    with source.open("rb") as src, target.open("wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 22)


def remove_tree(path) -> None:
    """Removes folder `path` and everything under it, local or on a bucket; nothing when it is absent."""
    path = as_path(path)
    if is_remote(path):
        if remote_files(path):
            path.rmtree()
    elif path.exists():
        shutil.rmtree(path)


def file_digest(path) -> str:
    """Returns the hex sha256 of the file at `path` (local or gs://)."""
    with as_path(path).open("rb") as f:
        return stream_sha256(f)


def _seconds(mtime) -> int:
    """Returns an object's modification time in whole seconds as etils.epath's stat() gives it (mtime field)."""
    if mtime is None:
        return 0
    return int(mtime.timestamp()) if isinstance(mtime, datetime.datetime) else int(mtime)


def _stamp(local: pathlib.Path, mtime: int) -> None:
    """Sets the local file's modification time to its bucket object's: equal versions compare equal."""
    os.utime(local, (mtime, mtime))


def _download(source, dest: pathlib.Path) -> None:
    """Copies bucket object `source` to the local file `dest` through a temp file and a rename (a reader of the
    mirror never sees half a file)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as dst, source.open("rb") as src:
            shutil.copyfileobj(src, dst, 1 << 22)
        os.replace(tmp, dest)
    finally:
        pathlib.Path(tmp).unlink(missing_ok=True)
