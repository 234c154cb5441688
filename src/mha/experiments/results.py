"""The results of the sweeps: the table ``results.csv`` (:class:`Results`) and, as every part III chapter reads
them, the committed results of a sweep (:func:`load`).

Book: part III. Each chapter has one folder, ``experiments/<chapter>/``, holding its sweep files and, beside each,
the folder its results went to (``experiments/<chapter>/<sweep name>/results.csv`` and ``artifacts/<run_id>/``).
:func:`load` finds a sweep by name and gives its table, its per-run files, the sweep file and the command that
regenerates it, so that a figure can say beside itself how to remake it.

``results.csv`` has one row per run: ``run_id`` (a hash of the run's base + grid settings, stable across reruns, key
order and machines), ``sweep``, ``status`` ("ok" or "failed"), ``error``, every setting (its effective value: the
configuration's default where the sweep does not set it), the run's scalar metrics (val_loss, val_acc,
tokens_per_s, wall_s, params, kv_cache_bytes, device, device_name (the GPU, or the CPU model), num_threads,
torch_version, and any extra such as decode_s_per_token; a metric wins over a setting of the same name),
``git_commit`` (HEAD of the repository when the sweep started), ``study`` and ``config`` (the study, and the complete
configuration the run reported it used, defaults included, as JSON) and, last, ``checksum`` (a hash of the row's
other cells, :func:`row_checksum`).

A row is trusted only when it can be vouched for. A row that does not parse (cut short, edited by hand: its
checksum does not match) is a :class:`BadRow`, never carried along; a finished row whose study or configuration is
not what the sweep file and the code give now is not trusted either (:func:`trust`, :func:`plan`). A row is added
under a file lock by writing the whole table to a temporary file that ``os.replace`` puts in place, de-duplicated by
run_id (the latest row wins): a reader never sees half a table.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import functools
import hashlib
import io
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mha._checks import check_type
from mha.experiments.sweep_file import Run, Sweep, canonical_config, command, config_difference, load_sweep

__all__ = ["Results", "BadRow", "row_checksum", "csv_cell", "trust", "plan", "REQUIRED_COLUMNS",
           "RECORD_COLUMNS", "experiments_dir",
           "SweepResults", "load", "sweep_names"]

REQUIRED_COLUMNS = ["run_id", "sweep", "status", "error", "task", "n_layers", "d_model", "n_heads", "n_kv_heads",
                    "head_dim", "seed", "steps", "val_loss", "val_acc", "tokens_per_s", "wall_s", "params",
                    "kv_cache_bytes", "device", "device_name", "threads", "torch_version", "git_commit"]
RECORD_COLUMNS = ["study", "config"]  # what the run used: its study and its complete configuration (JSON)
CHECKSUM = "checksum"  # the last column: a hash of the row's other cells
RUN_ID = re.compile(r"[0-9a-f]{12}")


# ------------------------------------------------------------------------------------------------------- results.csv
def csv_cell(value) -> str:
    """A value as a results.csv cell: "" for None, JSON (sorted keys) for a dict or a list, else ``str``."""
    if value is None:
        return ""
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def row_checksum(row: dict) -> str:
    """16 hex digits of the sha256 of the row's non-empty cells (the checksum column left out) as canonical JSON:
    independent of the column order and of columns that other rows added."""
    cells = {k: v for k, v in row.items() if k != CHECKSUM and v not in ("", None)}
    return hashlib.sha256(json.dumps(cells, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class BadRow:
    line: int  # line of results.csv where the row starts
    run_id: str  # its run_id cell, as read ("" if none)
    reason: str  # why it cannot be trusted


class Results:
    """``results.csv``: read it (refusing rows that do not parse), and add a row atomically (temporary file +
    ``os.replace``, under a file lock)."""

    def __init__(self, path: str | os.PathLike, lock_path: str | os.PathLike):
        self.path = Path(path)
        self.lock_path = Path(lock_path)

    def read(self) -> list[dict]:
        """The rows that parse (all values as strings), one per run_id: the latest row of a run_id wins."""
        return self.read_checked()[0]

    def read_checked(self) -> tuple[list[dict], list[BadRow]]:
        """``(rows, bad)``: the rows that parse, one per run_id (the latest wins), and the rows that do not, with
        the reason: a row cut short or with cells too many, a status other than ok/failed, a run_id that is not 12
        hex digits, a checksum that does not match its cells (edited, or cut at a cell's boundary)."""
        if not self.path.exists():
            return [], []
        rows, bad = {}, []
        with open(self.path, newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                return [], []
            if header[:len(REQUIRED_COLUMNS[:3])] != REQUIRED_COLUMNS[:3] or len(set(header)) != len(header):
                raise ValueError(f"{self.path}: the first line is not a results.csv header (it must start with "
                                 f"{REQUIRED_COLUMNS[:3]} and name each column once), got {header[:5]}...; restore "
                                 f"the file (git checkout) or move it away")
            end = reader.line_num  # the last line read so far
            for cells in reader:
                start, end = end + 1, reader.line_num  # a row may span lines (a quoted newline)
                if not cells:
                    continue
                row = dict(zip(header, cells))
                reason = self._problem(header, cells, row)
                if reason:
                    bad.append(BadRow(start, cells[0], reason))
                else:
                    rows[row["run_id"]] = row
        return list(rows.values()), bad

    @staticmethod
    def _problem(header: list, cells: list, row: dict) -> str | None:
        if len(cells) != len(header):
            return f"it has {len(cells)} cells where the header has {len(header)} (cut short, or edited)"
        if not RUN_ID.fullmatch(row["run_id"]):
            return f"its run_id {row['run_id']!r} is not 12 hex digits"
        if row["status"] not in ("ok", "failed"):
            return f"its status {row['status']!r} is neither 'ok' nor 'failed'"
        if CHECKSUM not in row or not row[CHECKSUM]:
            return "it has no checksum (made by an older runner, or cut short)"
        if row[CHECKSUM] != row_checksum(row):
            return "its checksum does not match its cells (edited by hand, or cut short)"
        return None

    @contextlib.contextmanager
    def _lock(self):
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def add(self, row: dict, order: list[str] = ()) -> None:
        """Replace (or add) the row of ``row["run_id"]``, with its checksum; rows are kept in ``order`` (run_ids),
        others last. Rows that do not parse are dropped (the runner reported them and redoes their runs)."""
        row = {key: csv_cell(value) for key, value in row.items() if key != CHECKSUM}
        row[CHECKSUM] = row_checksum(row)
        with self._lock():
            rows = [r for r in self.read() if r["run_id"] != row["run_id"]] + [row]
            self.write(rows, order)

    def drop_bad_rows(self, order: list[str] = ()) -> None:
        """Write the table again without its rows that do not parse (never carried along), rows in ``order``."""
        with self._lock():
            self.write(self.read(), order)

    def write(self, rows: list[dict], order: list[str] = ()) -> None:
        """Write ``rows`` (each with its checksum) as the whole table, atomically; call under the lock."""
        rank = {rid: i for i, rid in enumerate(order)}
        rows = sorted(rows, key=lambda r: rank.get(r["run_id"], len(rank)))  # stable: unknown run_ids keep order
        columns = list(REQUIRED_COLUMNS)
        for r in rows:
            columns += [key for key in r if key not in columns and key != CHECKSUM]
        columns.append(CHECKSUM)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with open(partial, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns, restval="")
            writer.writeheader()
            writer.writerows(rows)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, self.path)


def trust(sweep: Sweep, run: Run, row: dict) -> str | None:
    """None when ``row`` records exactly the study and configuration ``run`` has now; otherwise what differs."""
    if not row.get("study") or not row.get("config"):
        return "the row records no study and configuration (made before runs recorded them)"
    if row["study"] != sweep.study:
        return f"made by study {row['study']!r}, the sweep now runs {sweep.study!r}"
    if row["config"] != canonical_config(run.config):
        try:
            recorded = json.loads(row["config"])
        except ValueError:
            return "its recorded configuration is not valid JSON"
        return config_difference(recorded, run.config)
    return None


def plan(sweep: Sweep, results: Results, runs: list[Run]) -> dict:
    """What a rerun must do: ``{"finished": set of run_ids, "changed": [(run, what differs)], "bad": [BadRow]}``."""
    rows, bad = results.read_checked()
    by_id = {row["run_id"]: row for row in rows}
    finished, changed = set(), []
    for run in runs:
        row = by_id.get(run.run_id)
        if row is None or row["status"] != "ok":
            continue
        difference = trust(sweep, run, row)
        if difference is None:
            finished.add(run.run_id)
        else:
            changed.append((run, difference))
    return {"finished": finished, "changed": changed, "bad": bad}


# --------------------------------------------------------------------------------------------- what the chapters read
def experiments_dir(start: str | os.PathLike | None = None) -> Path:
    """The repository's ``experiments/`` folder: ``$MHA_EXPERIMENTS_DIR``, else the first ``experiments/`` folder
    holding a ``notebooks/`` folder in ``start`` (default: the current directory) or one of its parents."""
    if os.environ.get("MHA_EXPERIMENTS_DIR"):
        return Path(os.environ["MHA_EXPERIMENTS_DIR"])
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "experiments" / "notebooks").is_dir():
            return folder / "experiments"
    raise FileNotFoundError(f"no experiments/ folder (with notebooks/) in {here} or its parents; run from the "
                            f"repository, or set MHA_EXPERIMENTS_DIR")


def benchmark_runs(root: str | os.PathLike | None = None) -> list[dict]:
    """The committed benchmark runs (``experiments/benchmarks/*.json``, written by ``python -m mha.bench``), in file
    name order, each with its file name under ``"file"``; runs made with ``--quick`` are smoke tests, not
    measurements, and are left out."""
    folder = experiments_dir(root) / "benchmarks"
    runs = [dict(json.loads(path.read_text()), file=path.name) for path in sorted(folder.glob("*.json"))]
    return [run for run in runs if not run.get("quick")]


def gpu_kernel_runs(runs: list[dict]) -> list[dict]:
    """Of :func:`benchmark_runs`, those whose kernel section timed the Triton kernel compiled on a CUDA GPU (not in
    the interpreter), each with that section also under ``"kernels"``."""
    found = []
    for run in runs:
        kernels = run.get("sections", {}).get("kernels") or {}
        if run["device"]["type"] == "cuda" and "rows" in kernels and not kernels["device"].get("interpreted"):
            found.append(dict(run, kernels=kernels))
    return found


def sweep_names(root: str | os.PathLike | None = None) -> dict[str, Path]:
    """Every sweep file under ``experiments/<chapter>/``: sweep name -> the YAML file (``experiments/gpu/``, the GPU
    program's queue, holds none)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's when PyYAML has it: 7 times faster (a
    # chapter looks up its sweeps several times); only the names are read here, load_sweep checks the files
    root = experiments_dir(root)
    names = {}
    for path in sorted(root.glob("*/*.yaml")):
        if path.parent.name == "gpu":  # experiments/gpu/queue.yaml: the GPU program's pieces, not a sweep file
            continue
        name = (yaml.load(path.read_text(), Loader=loader) or {}).get("name")
        if name in names:
            raise ValueError(f"two sweep files are named {name!r}: {names[name]} and {path}")
        names[name] = path
    return names


@dataclass
class SweepResults:
    """One sweep's committed results."""

    name: str  # the sweep's name
    sweep_file: Path  # the YAML file
    folder: Path  # its results folder (results.csv, artifacts/)
    root: Path  # the repository root (for relative paths in commands)

    @functools.cached_property
    def sweep(self):
        """The sweep file, loaded and checked once (:func:`mha.experiments.sweep_file.load_sweep`)."""
        return load_sweep(self.sweep_file)

    @property
    def command(self) -> str:
        """The command that regenerates this sweep's results, from the repository root
        (:func:`mha.experiments.sweep_file.command`, with the sweep file's ``jobs``)."""
        return command(self.sweep_file, self.sweep.jobs, root=self.root)

    @property
    def rerun_command(self) -> str:
        """The command that runs this sweep again into a fresh folder, ``/tmp/<name>-rerun``, to compare with the
        committed results: the plain :attr:`command` finds every committed run done and runs nothing."""
        return f"{self.command} --out /tmp/{self.name}-rerun"

    @property
    def csv_path(self) -> Path:
        return self.folder / "results.csv"

    @property
    def run_ids(self) -> list[str]:
        """The run_ids the sweep file defines, in the grid's order."""
        return [run.run_id for run in self.sweep.runs()]

    def table(self, ok_only: bool = True, complete: bool = True):
        """results.csv as a pandas DataFrame: only the runs that finished (``ok_only``), only the runs the sweep file
        defines now, in its order, and only rows the runner can vouch for. A row that does not parse (cut short,
        edited: its checksum fails) or a finished row made with another study or configuration than the sweep file
        and the code give now raises ValueError naming the runs and the command that remakes them. With
        ``complete`` (the default) every run must be there and finished, else FileNotFoundError saying how many are
        missing and the command that makes them; setting the environment variable ``MHA_ALLOW_PARTIAL=1`` relaxes
        this (not the trust) while a sweep is still running."""
        import pandas as pd

        results = Results(self.csv_path, self.folder / "runs" / ".lock")
        state = plan(self.sweep, results, self.sweep.runs())
        expected = self.run_ids
        bad = [row for row in state["bad"] if row.run_id in expected]
        if bad or state["changed"]:
            lines = [f"line {row.line} (run {row.run_id}): {row.reason}" for row in bad]
            lines += [f"run {run.run_id}: {difference}" for run, difference in state["changed"]]
            raise ValueError(f"sweep {self.name!r}: {len(lines)} row(s) of {self.csv_path} cannot be trusted:\n  "
                             + "\n  ".join(lines[:10]) + f"\nrun {self.command} --rerun-changed")
        rows = results.read()
        buffer = io.StringIO()
        columns = list(dict.fromkeys(key for row in rows for key in row))
        writer = csv.DictWriter(buffer, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(rows)
        buffer.seek(0)
        table = pd.read_csv(buffer)  # the same types as reading the file itself
        table = table[table["run_id"].isin(expected)]
        if ok_only:
            table = table[table["status"] == "ok"]
        missing = len(set(expected) - set(table["run_id"]))
        if complete and missing and os.environ.get("MHA_ALLOW_PARTIAL") != "1":
            raise FileNotFoundError(f"sweep {self.name!r}: {missing} of {len(expected)} runs are missing or failed in "
                                    f"{self.csv_path}; run {self.command}")
        order = {rid: i for i, rid in enumerate(expected)}
        return table.sort_values("run_id", key=lambda ids: ids.map(order)).reset_index(drop=True)

    def machine(self) -> dict:
        """What ran the sweep, from its rows: each distinct value of device_name, cpu_id, cpu_capability, threads,
        num_threads and torch_version (a list, usually of one)."""
        table = self.table(complete=False)
        return {column: sorted({str(v) for v in table[column].dropna()}) for column in
                ("device_name", "cpu_id", "cpu_capability", "threads", "num_threads", "torch_version")
                if column in table}

    def artifact(self, run_id: str, filename: str):
        """A run's file from ``artifacts/<run_id>/``: JSON as Python objects, ``.npz`` as a dict of arrays."""
        path = self.folder / "artifacts" / str(run_id) / filename
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist (sweep {self.name!r}, run {run_id!r})")
        if path.suffix == ".json":
            return json.loads(path.read_text())
        if path.suffix == ".npz":
            with np.load(path) as archive:
                return dict(archive)
        return path.read_text()

    def artifacts(self, filename: str, run_ids=None) -> dict:
        """``{run_id: artifact(run_id, filename)}`` for the given runs (default: every finished run)."""
        run_ids = list(self.table(complete=False).run_id) if run_ids is None else list(run_ids)
        return {run_id: self.artifact(run_id, filename) for run_id in run_ids}


def load(name: str, root: str | os.PathLike | None = None) -> SweepResults:
    """The committed results of sweep ``name`` (e.g. "head-count"), found among ``experiments/*/*.yaml``."""
    check_type("name", name, str, "a sweep name such as 'head-count'")
    names = sweep_names(root)
    if name not in names:
        raise ValueError(f"no sweep named {name!r}; the sweeps are {sorted(names)}")
    sweep_file = names[name]
    found = SweepResults(name, sweep_file, sweep_file.parent / name, experiments_dir(root).parent)
    if not found.csv_path.is_file():
        raise FileNotFoundError(f"sweep {name!r} has no results yet ({found.csv_path}); run {found.command}")
    return found
