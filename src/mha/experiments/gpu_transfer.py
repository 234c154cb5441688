"""Before and after a GPU slot, on the machine with the checkout: :func:`prepare` puts Tiny Shakespeare where the GPU
machine will find it (it has no network), :func:`collect` puts the results it brought back into place.

Both are run as ``python -m mha.experiments.gpu_run --prepare`` and ``--collect OUT`` (:mod:`.gpu_run`).
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from mha.experiments import gpu_queue
from mha.experiments.gpu_queue import REPO

__all__ = ["DATA_DIR", "prepare", "collect", "write_atomic"]

DATA_DIR = REPO / ".data"  # where prepare puts Tiny Shakespeare (git-ignored; travels with the checkout)


def write_atomic(path: Path, content: bytes) -> None:
    """Write ``content`` to ``path`` through a partial file and a rename, so a reader never sees half a file."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(content)
    os.replace(partial, path)


def prepare(data_dir: Path = DATA_DIR) -> Path:
    """Put Tiny Shakespeare into ``data_dir`` (default ``.data/`` in the checkout), checked by its sha256: copied
    from ``$MHA_DATA_DIR`` or the user cache when it is there, else downloaded (pooch). Returns the file."""
    from mha.experiments import data

    target = data.tinyshakespeare_path(data_dir)
    if target.is_file() and data.file_sha256(target) == data.TINYSHAKESPEARE_SHA256:
        return target
    source = data.tinyshakespeare_path()  # MHA_DATA_DIR, else the user cache
    if not source.is_file():
        data.load_tinyshakespeare()  # downloads it there (and checks it)
    if data.file_sha256(source) != data.TINYSHAKESPEARE_SHA256:
        raise ValueError(f"{source} has the wrong sha256; delete it and run --prepare again to download it")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    return target


def _safe_members(archive: tarfile.TarFile) -> list[tarfile.TarInfo]:
    members = []
    for member in archive.getmembers():
        path = Path(member.name)
        if path.is_absolute() or ".." in path.parts or not (member.isfile() or member.isdir()):
            raise ValueError(f"results.tgz: {member.name!r} is not a plain file or folder inside the checkout; "
                             f"nothing was written")
        members.append(member)
    return members


def collect(out, root: Path = REPO) -> list[str]:
    """Unpack ``out/results.tgz`` into the checkout ``root``; return what was written, one line per file.

    A ``results.csv`` that is already there gets the incoming rows by run id (:meth:`Results.add
    <mha.experiments.results.Results.add>`: checked, the incoming row wins), ``experiments/gpu/record.csv`` the
    incoming rows it does not hold yet; any other file is replaced. A member outside the checkout (an absolute
    path, ``..``, a link) stops it before anything is written."""
    from mha.experiments.results import Results

    archive_path = Path(out) / "results.tgz"
    if not archive_path.is_file():
        raise FileNotFoundError(f"{archive_path} does not exist: --collect takes the folder gpu_run wrote (--out)")
    root = Path(root)
    written = []
    with tarfile.open(archive_path) as archive:
        members = _safe_members(archive)
        for member in members:
            if not member.isfile():
                continue
            content = archive.extractfile(member).read()
            target = root / member.name
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.name == "results.csv" and target.is_file():
                with tempfile.TemporaryDirectory() as folder:
                    incoming = Results(Path(folder) / "results.csv", Path(folder) / ".lock")
                    incoming.path.write_bytes(content)
                    rows, bad = incoming.read_checked()
                    if bad:
                        raise ValueError(f"results.tgz: {member.name}: {len(bad)} rows do not parse (line "
                                         f"{bad[0].line}: {bad[0].reason}); nothing more was written")
                    local = Results(target, target.parent / "runs" / ".lock")
                    order = [row["run_id"] for row in local.read()] + [row["run_id"] for row in rows]
                    for row in rows:
                        local.add(row, list(dict.fromkeys(order)))
                written.append(f"{member.name}: {len(rows)} rows merged by run id")
            elif target.resolve() == (root / "experiments" / "gpu" / "record.csv").resolve() and target.is_file():
                with tempfile.TemporaryDirectory() as folder:
                    incoming_path = Path(folder) / "record.csv"
                    incoming_path.write_bytes(content)
                    incoming = gpu_queue.read_record(incoming_path)
                local = gpu_queue.read_record(target)
                new = [row for row in incoming if row not in local]
                gpu_queue.write_record(local + new, target)
                written.append(f"{member.name}: {len(new)} new rows")
            else:
                write_atomic(target, content)
                written.append(member.name)
    return written
