"""The committed results, as every part III chapter reads them.

Book: part III. Each chapter has one folder, ``experiments/<chapter>/``, holding its sweep files and, beside each,
the folder its results went to (``experiments/<chapter>/<sweep name>/results.csv`` and ``artifacts/<run_id>/``).
:func:`load` finds a sweep by name and gives its table, its per-run files, the sweep file and the command that
regenerates it, so that a figure can say beside itself how to remake it.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mha._checks import check_type

__all__ = ["experiments_dir", "SweepResults", "load", "sweep_names"]


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


def sweep_names(root: str | os.PathLike | None = None) -> dict[str, Path]:
    """Every sweep file under ``experiments/<chapter>/``: sweep name -> the YAML file."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's when PyYAML has it: 7 times faster (a
    # chapter looks up its sweeps several times); only the names are read here, load_sweep checks the files
    root = experiments_dir(root)
    names = {}
    for path in sorted(root.glob("*/*.yaml")):
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
        """The sweep file, loaded and checked once (:func:`mha.experiments.sweep.load_sweep`)."""
        from mha.experiments.sweep import load_sweep

        return load_sweep(self.sweep_file)

    @property
    def command(self) -> str:
        """The command that regenerates this sweep's results, from the repository root
        (:func:`mha.experiments.sweep.command`, with the sweep file's ``jobs``)."""
        from mha.experiments.sweep import command

        return command(self.sweep_file, self.sweep.jobs, root=self.root)

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

        from mha.experiments.sweep import Results, plan

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
