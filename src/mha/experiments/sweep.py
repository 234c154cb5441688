"""Run a study (or any papermill notebook) over a grid of parameters, one row per run in ``results.csv``.

Book: part III (experiments); every chapter's numbers come from a ``results.csv`` written here.

Usage::

    python -m mha.sweep experiments/head_count/head-count.yaml [--out DIR] [--jobs N] [--only RUN_ID ...]
                        [--executor notebook|function] [--launcher local|submitit] [--cluster slurm|local|debug]
                        [--dry-run]

A sweep file (YAML)::

    name: smoke                         # the results folder: <the sweep file's folder>/<name>/
    study: train                        # a study of mha.experiments.studies: train, heads, dynamics, shakespeare
    base: {task: two_offset, steps: 40} # settings shared by every run (the study configuration's flat names)
    grid: {n_heads: [1, 4], seed: [0, 1]}   # runs: the cartesian product of these lists
    jobs: 2                             # optional: runs in parallel when --jobs is not given (default 1)

Every setting is a flat name of the study's configuration (:mod:`mha.experiments.config`): each run's configuration
is made and checked once, when the file is loaded, so an unknown name, a wrong type or a bad value stops the sweep
before any run starts (and a chapter that loads the same sweep again does not check it again).
Instead of ``study``, a sweep may name any papermill ``notebook`` (relative to the sweep file or the repository
root) whose parameters cell defines ``out_dir``; its parameters are then the notebook's.

Each run executes, by default (``--executor notebook``), the study's template ``experiments/notebooks/<study>.ipynb``
through papermill with ``overrides`` (the run's settings), ``out_dir`` (where ``metrics.json`` goes) and
``artifacts_dir``; the executed notebook goes to ``DIR/runs/<run_id>.ipynb``. ``--executor function`` calls the
study's function in a fresh process instead, on the configuration made when the file was loaded (no Jupyter needed,
e.g. on a GPU machine without it); both go through :func:`mha.experiments.studies.run_config` and compute the same
numbers. Each run uses ``threads`` CPU threads (default 1: one run per core). Metrics go to
``DIR/runs/<run_id>/metrics.json``, the files the book plots to ``DIR/artifacts/<run_id>/``.

``DIR/results.csv`` has one row per run: ``run_id`` (a hash of the run's base + grid settings, stable across
reruns, key order and machines), ``sweep``, ``status`` ("ok" or "failed"), ``error``, every setting (its effective
value: the configuration's default where the sweep does not set it), the run's scalar metrics (val_loss, val_acc,
tokens_per_s, wall_s, params, kv_cache_bytes, device, device_name (the GPU, or the CPU model), num_threads,
torch_version, and any extra such as decode_s_per_token; a metric wins over a setting of the same name),
``git_commit`` (HEAD of the repository when the sweep started), ``study`` and ``config`` (the study, and the complete
configuration the run reported it used, defaults included, as JSON) and, last, ``checksum`` (a hash of the row's
other cells).

The runner trusts a row only when it can vouch for it. A row that does not parse (cut short, edited by hand: its
checksum does not match) is reported and its run redone, never carried along. A finished row whose study or
configuration is not what the sweep file and the code give now (another ``study:`` writing to the same folder, a
default changed in the code) stops the sweep before any run starts, with a message that says what changed;
``--rerun-changed`` reruns those runs instead. A rerun skips the runs whose row is trusted and says "ok"; a run that
raises is recorded as "failed" with its error and the sweep goes on. Each row is written as its run finishes: the
whole table goes to a temporary file that ``os.replace`` puts in place, under a file lock, de-duplicated by run_id
(the latest row wins). Killing the runner at any moment therefore loses no recorded run and never duplicates one
(the run in progress is redone), and the processes it started end with it. One runner works on a sweep's folder at
a time: a second one stops at once, naming the first one's pid.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import csv
import ctypes
import fcntl
import hashlib
import itertools
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from tqdm import tqdm  # plain tqdm: tqdm.auto warns inside Jupyter when ipywidgets is missing

from mha._checks import check_bool, check_choice, check_int

if TYPE_CHECKING:
    from mha.experiments.config import RunConfig

__all__ = ["Sweep", "Run", "load_sweep", "run_id", "command", "execute_run", "Results", "run_sweep", "output_dir",
           "main", "REQUIRED_COLUMNS", "EXECUTORS", "ChangedRunsError", "SweepBusyError", "canonical_config", "plan",
           "trust", "device_problems", "row_checksum"]

REQUIRED_COLUMNS = ["run_id", "sweep", "status", "error", "task", "n_layers", "d_model", "n_heads", "n_kv_heads",
                    "head_dim", "seed", "steps", "val_loss", "val_acc", "tokens_per_s", "wall_s", "params",
                    "kv_cache_bytes", "device", "device_name", "threads", "torch_version", "git_commit"]
RECORD_COLUMNS = ["study", "config"]  # what the run used: its study and its complete configuration (JSON)
CHECKSUM = "checksum"  # the last column: a hash of the row's other cells
RUNNER_PARAMETERS = ("out_dir", "artifacts_dir")  # set by the runner for every run, never by a sweep
SWEEP_KEYS = {"name", "study", "notebook", "base", "grid", "jobs"}
EXECUTORS = ("notebook", "function")
NOTEBOOKS = Path("experiments") / "notebooks"  # the studies' templates, relative to the repository root
RUN_ID = re.compile(r"[0-9a-f]{12}")


class ChangedRunsError(ValueError):
    """Finished rows of results.csv were made with another study or configuration than the sweep gives now."""


class SweepBusyError(RuntimeError):
    """Another runner is working on the same sweep folder."""


class _Loader(yaml.SafeLoader):
    """YAML SafeLoader that reads ``1e-3`` as a float (PyYAML's YAML 1.1 needs ``1.0e-3``) and refuses a key given
    twice in one mapping (PyYAML keeps the last one silently)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                  |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                  |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                  |[-+]?\.(?:inf|Inf|INF)
                  |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def _mapping_without_duplicates(loader, node):
    seen = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping", node.start_mark,
                f"found key {key!r} a second time (first on line {seen[key].line + 1}); each key may appear once",
                key_node.start_mark)
        seen[key] = key_node.start_mark
    return loader.construct_mapping(node, deep=True)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def run_id(parameters: dict) -> str:
    """12 hex digits of the sha256 of the parameters as canonical JSON (sorted keys): same parameters, same id."""
    canonical = json.dumps(parameters, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def canonical_config(config: dict) -> str:
    """A configuration as canonical JSON (sorted keys, no spaces): the ``config`` column, compared as text."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)


@dataclass(frozen=True)
class Run:
    run_id: str  # stable hash of ``parameters``
    parameters: dict  # base + this grid point (what the sweep sets)
    config: dict  # every setting the run uses, defaults included, flat (the row's columns; its ``config`` column)
    study_config: RunConfig | None = None  # a study's run: its configuration, made and checked once, when the sweep
    # was loaded, and handed as it is to the study's function (``--executor function``); None for a notebook sweep


@dataclass
class Sweep:
    name: str  # the sweep's name (its results folder's name)
    study: str | None  # the study (mha.experiments.studies), or None for a plain notebook sweep
    notebook: Path | None  # the papermill template (a study's default, or the sweep's notebook)
    base: dict  # parameters shared by every run
    grid: dict  # parameter -> list of values; the runs are the cartesian product
    defaults: dict  # a plain notebook's parameters and their default values ({} for a study)
    path: Path  # the YAML file
    jobs: int = 1  # runs in parallel unless the command line says otherwise
    _runs: list = field(default_factory=list, repr=False)  # the runs, made and checked by load_sweep

    def runs(self) -> list[Run]:
        """Every grid point, in the grid's order (the last parameter varies fastest), with its configuration."""
        return self._runs

    @property
    def label(self) -> str:
        """What the ``study`` column records: the study's name, or ``notebook:<file name>`` for a notebook sweep."""
        return self.study if self.study is not None else f"notebook:{self.notebook.name}"

    def threads(self, run: Run) -> int:
        """CPU threads of one run (the setting ``threads``; default 1)."""
        return run.config.get("threads", 1)

    def command(self) -> str:
        """The command that (re)makes this sweep's results (:func:`command`)."""
        return command(self.path, self.jobs)


def command(sweep_file: str | os.PathLike, jobs: int = 1, root: str | os.PathLike | None = None) -> str:
    """The command that (re)makes a sweep's results: ``python -m mha.sweep <sweep file> [--jobs N]``, the file
    relative to ``root`` (default: the repository holding it, when there is one), from where the command runs.
    ``jobs``: the sweep file's (runs in parallel; the wall-time sweeps leave it at 1, one run at a time)."""
    path = Path(sweep_file).resolve()
    root = _repo_root(path.parent) if root is None else Path(root).resolve()
    shown = path.relative_to(root) if root is not None and path.is_relative_to(root) else path
    return f"python -m mha.sweep {shown}" + (f" --jobs {jobs}" if jobs > 1 else "")


def _repo_root(start: Path) -> Path | None:
    """The nearest ancestor of ``start`` (itself included) holding ``.git``, or None."""
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return None


def _git_commit(folder: Path) -> str:
    """HEAD of the git repository holding ``folder`` ("" outside one)."""
    try:
        out = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def _notebook_defaults(notebook: Path) -> dict:
    """The notebook's papermill parameters and their default values (literal values parsed, others as text)."""
    import papermill  # imported here: ``python -m mha.sweep --help`` stays fast

    defaults = {}
    for name, info in papermill.inspect_notebook(str(notebook)).items():
        try:
            defaults[name] = ast.literal_eval(info["default"])
        except (ValueError, SyntaxError):
            defaults[name] = info["default"]
    return defaults


def _find(path: Path, relative: str) -> Path | None:
    """``relative`` beside the sweep file, or under the repository root."""
    candidates = [path.parent / relative]
    root = _repo_root(path.parent)
    if root is not None:
        candidates.append(root / relative)
    return next((c.resolve() for c in candidates if c.is_file()), None)


def _study_notebook(path: Path, study: str) -> Path | None:
    """The study's template: under the sweep file's repository, else under the checkout the package runs from."""
    package_checkout = Path(__file__).resolve().parents[3]  # src/mha/experiments/sweep.py -> the checkout
    for root in (_repo_root(path.parent), package_checkout):
        if root is not None and (root / NOTEBOOKS / f"{study}.ipynb").is_file():
            return (root / NOTEBOOKS / f"{study}.ipynb").resolve()
    return None


def _read_yaml(path: Path):
    """The sweep file's content; a YAML error names the file, the line and the column (as a ValueError)."""
    with open(path) as stream:  # a named stream: PyYAML's messages then say 'in "<path>", line L, column C'
        try:
            return yaml.load(stream, Loader=_Loader)
        except yaml.YAMLError as error:
            raise ValueError(f"{path} is not a valid sweep file:\n{error}") from None


def load_sweep(config_path: str | os.PathLike) -> Sweep:
    """Read and check a sweep file and every run it makes; an error names the file, the key and the run."""
    path = Path(config_path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"sweep file {path} does not exist")
    spec = _read_yaml(path)
    if not isinstance(spec, dict):
        raise ValueError(f"{path}: a sweep file is a mapping with keys {sorted(SWEEP_KEYS)}, got {type(spec).__name__}")
    unknown = sorted(set(spec) - SWEEP_KEYS)
    if unknown:
        raise ValueError(f"{path}: unknown keys {unknown}; expected {sorted(SWEEP_KEYS)}")
    name = spec.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise ValueError(f"{path}: 'name' names the results folder: a string of letters, digits, '_', '.' and '-' "
                         f"that starts with a letter or a digit, got {name!r}")
    base, grid = spec.get("base") or {}, spec.get("grid") or {}
    if not isinstance(base, dict):
        raise ValueError(f"{path}: 'base' must be a mapping parameter -> value, got {type(base).__name__}")
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise ValueError(f"{path}: 'grid' must be a mapping parameter -> non-empty list of values, got {grid!r}")
    both = sorted(set(base) & set(grid))
    if both:
        raise ValueError(f"{path}: parameters {both} are in both 'base' and 'grid'; keep each in one place")
    for key in RUNNER_PARAMETERS:
        if key in base or key in grid:
            raise ValueError(f"{path}: '{key}' is set by the runner for each run; remove it from the sweep file")

    jobs = check_int(f"{path}: jobs", spec.get("jobs", 1))
    study, notebook = spec.get("study"), spec.get("notebook")
    if (study is None) == (notebook is None):
        raise ValueError(f"{path}: give either 'study' (one of the package's studies) or 'notebook' (a papermill "
                         f"notebook), not {'both' if study else 'neither'}")
    if study is not None:
        from mha.experiments.studies import STUDIES

        if study not in STUDIES:
            raise ValueError(f"{path}: study must be one of {sorted(STUDIES)}, got {study!r}")
        sweep = Sweep(name, study, _study_notebook(path, study), base, grid, {}, path, jobs)
    else:
        if not isinstance(notebook, str):
            raise ValueError(f"{path}: 'notebook' must be a path (relative to the sweep file or the repository root)")
        found = _find(path, notebook)
        if found is None:
            raise ValueError(f"{path}: notebook {notebook!r} not found beside the sweep file or under the repository "
                             f"root")
        defaults = _notebook_defaults(found)
        if "out_dir" not in defaults:
            raise ValueError(f"{found}: its parameters cell (tagged 'parameters') must define out_dir")
        unknown = sorted((set(base) | set(grid)) - set(defaults))
        if unknown:
            raise ValueError(f"{path}: parameters {unknown} are not parameters of {found.name}; its parameters are "
                             f"{sorted(defaults)}")
        sweep = Sweep(name, None, found, base, grid, defaults, path, jobs)
    _check_runs(sweep)
    return sweep


def _check_runs(sweep: Sweep) -> None:
    """Make every run and check its settings now, not when the run starts; two grid points that make the same run
    (a value listed twice, or 1 and 1.0) are refused."""
    keys, points = list(sweep.grid), itertools.product(*sweep.grid.values())
    seen = {}
    runs = []
    for values in points:
        parameters = {**sweep.base, **dict(zip(keys, values))}
        try:
            study_config, config = _resolve(sweep, parameters)
        except (TypeError, ValueError) as error:
            raise type(error)(f"{sweep.path}: run {run_id(parameters)} ({_describe_parameters(parameters, keys)}): "
                              f"{error}") from None
        text = canonical_config(config)
        if text in seen:
            raise ValueError(f"{sweep.path}: the grid points ({_describe_parameters(seen[text], keys)}) and "
                             f"({_describe_parameters(parameters, keys)}) make the same run; list each value once")
        seen[text] = parameters
        runs.append(Run(run_id(parameters), parameters, config, study_config))
    sweep._runs = runs


def _resolve(sweep: Sweep, parameters: dict) -> tuple:
    """``(study_config, config)``: a study's run's configuration (None for a notebook sweep) and every setting of the
    run with its value, flat (the default where the sweep sets none)."""
    if sweep.study is None:
        effective = {**sweep.defaults, **parameters}
        for name in RUNNER_PARAMETERS:
            effective.pop(name, None)
        return None, effective
    from mha.experiments.studies import STUDIES

    study_config = _study_config(STUDIES[sweep.study].config, parameters)
    return study_config, study_config.to_dict()


_STUDY_CONFIGS = {}  # (configuration class, parameters as JSON) -> the configuration: see _study_config


def _study_config(cls: type, parameters: dict):
    """``cls.from_dict(parameters)``, made and checked once per process for the same class and parameters: a
    chapter that loads a sweep (or its results) several times checks its runs once. A configuration is frozen, and
    depends on nothing but the class and the parameters; parameters that JSON cannot write are not cached."""
    try:
        key = (cls, json.dumps(parameters, sort_keys=True))
    except (TypeError, ValueError):
        return cls.from_dict(parameters)
    if key not in _STUDY_CONFIGS:
        _STUDY_CONFIGS[key] = cls.from_dict(parameters)
    return _STUDY_CONFIGS[key]


def _describe_parameters(parameters: dict, keys) -> str:
    return ", ".join(f"{k}={parameters[k]!r}" for k in keys) or "base"


# ------------------------------------------------------------------------------------------------------- one run
def _describe(error: BaseException) -> str:
    """One line for the error column: the notebook's exception (name: value) or this process's."""
    ename, evalue = getattr(error, "ename", None), getattr(error, "evalue", None)
    text = f"{ename}: {evalue}" if ename else f"{type(error).__name__}: {error}"
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # ANSI colours of tracebacks
    return " ".join(text.split())[:1000]


@contextlib.contextmanager
def _thread_environment(threads: int):
    """OMP/MKL thread counts for the processes started inside (they inherit this environment); restored after."""
    names = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update({name: str(threads) for name in names})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _die_with_parent(parent_pid: int) -> None:
    """In a worker process: end (SIGKILL) when the process that started it ends, even killed with SIGKILL.

    Linux's ``prctl(PR_SET_PDEATHSIG)``; elsewhere nothing. If the parent is already gone, exit now. A kernel that a
    worker starts (papermill) notices its parent's end itself (ipykernel watches its parent's pid).
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


def _worker_pool(max_workers: int) -> ProcessPoolExecutor:
    """A pool of fresh (spawned) processes that end with this one."""
    return ProcessPoolExecutor(max_workers=max_workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_die_with_parent, initargs=(os.getpid(),))


def _call_study(study_config, out_dir: str, artifacts_dir: str) -> None:
    """In a fresh process: the study's function, on the configuration the sweep made and checked (torch is imported
    here, after the thread variables are set)."""
    from mha.experiments.studies import run_config

    run_config(study_config, out_dir=out_dir, artifacts_dir=artifacts_dir)


@contextlib.contextmanager
def _private_kernel_sockets():
    """Kernel configuration that talks over Unix sockets in a fresh private folder (removed afterwards).

    With the default TCP transport each kernel manager picks free ports by asking the OS and letting them go;
    two runs started at once in separate processes can pick the same port, and one kernel then fails to start
    ("Address already in use"). Sockets in a folder of its own cannot collide with anyone's.
    """
    from traitlets.config import Config

    with tempfile.TemporaryDirectory(prefix="mha-kernel-") as folder:
        yield Config({"KernelManager": {"transport": "ipc", "ip": os.path.join(folder, "kernel")}})


def execute_run(sweep: Sweep, run: Run, runs_dir: str, executor: str = "notebook", kernel: str = "python3") -> dict:
    """Execute one run; return ``{"status": "ok" | "failed", "error": ..., **scalar metrics}``.

    Never raises for a failure inside the run (or a missing metrics.json): that is a "failed" result. A study's run
    reports the configuration it used (``metrics.json``'s ``config``); a run that used another one than the runner
    asked for (a stale template, say) is "failed" too.
    """
    runs_dir = Path(runs_dir)
    out_dir = runs_dir / run.run_id
    out_dir.mkdir(parents=True, exist_ok=True)
    artifacts = runs_dir.parent / "artifacts" / run.run_id
    metrics_path = out_dir / "metrics.json"
    metrics_path.unlink(missing_ok=True)  # a file left by an interrupted earlier attempt must not count
    try:
        threads = sweep.threads(run)
        with _thread_environment(threads):
            if executor == "function":
                if sweep.study is None:
                    raise ValueError("--executor function needs a sweep with a 'study'")
                with _worker_pool(1) as pool:  # a fresh process: torch starts with these threads
                    pool.submit(_call_study, run.study_config, str(out_dir), str(artifacts)).result()
            else:
                import papermill

                if sweep.notebook is None:
                    raise FileNotFoundError(f"no notebook for study {sweep.study!r} (looked for "
                                            f"{NOTEBOOKS / f'{sweep.study}.ipynb'} under the repository root); "
                                            f"run with --executor function")
                if sweep.study is not None:
                    parameters = dict(overrides=run.parameters, out_dir=str(out_dir), artifacts_dir=str(artifacts))
                else:
                    parameters = {**run.parameters, "out_dir": str(out_dir)}
                    if "artifacts_dir" in sweep.defaults:
                        parameters["artifacts_dir"] = str(artifacts)
                with _private_kernel_sockets() as config:
                    papermill.execute_notebook(
                        str(sweep.notebook), str(runs_dir / f"{run.run_id}.ipynb"), parameters=parameters,
                        kernel_name=kernel, progress_bar=False, cwd=str(sweep.notebook.parent), config=config)
        if not metrics_path.is_file():
            raise FileNotFoundError(f"the run finished but wrote no {metrics_path}")
        metrics = json.loads(metrics_path.read_text())
        if sweep.study is not None:
            used = (metrics.get("study"), metrics.get("config"))
            if used[0] != sweep.study or used[1] is None or canonical_config(used[1]) != canonical_config(run.config):
                raise RuntimeError(f"the run reports study {used[0]!r} with another configuration than the one it "
                                   f"was asked to run ({_config_difference(used[1], run.config)}); is its "
                                   f"template {sweep.notebook} out of date?")
    except Exception as error:  # noqa: BLE001 - any failure of the run is recorded, and the sweep goes on
        return {"status": "failed", "error": _describe(error)}
    scalars = {k: v for k, v in metrics.items()
               if k not in RECORD_COLUMNS and (v is None or isinstance(v, (bool, int, float, str)))}
    return {"status": "ok", "error": "", **scalars}


def _config_difference(recorded, now: dict) -> str:
    """The settings whose values differ between a recorded configuration and the current one, in words."""
    if not isinstance(recorded, dict):
        return "no configuration recorded"
    changes = []
    for key in sorted(set(recorded) | set(now)):
        if key not in now:
            changes.append(f"{key} = {recorded[key]!r} is no longer a setting")
        elif key not in recorded:
            changes.append(f"{key} is a new setting (now {now[key]!r})")
        elif canonical_config(recorded[key]) != canonical_config(now[key]):
            changes.append(f"{key}: {recorded[key]!r} then, {now[key]!r} now")
    return "; ".join(changes) or "the same settings"


# ------------------------------------------------------------------------------------------------ results.csv
def _cell(value) -> str:
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
        row = {key: _cell(value) for key, value in row.items() if key != CHECKSUM}
        row[CHECKSUM] = row_checksum(row)
        with self._lock():
            rows = [r for r in self.read() if r["run_id"] != row["run_id"]] + [row]
            self.write(rows, order)

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
    if row["study"] != sweep.label:
        return f"made by study {row['study']!r}, the sweep now runs {sweep.label!r}"
    if row["config"] != canonical_config(run.config):
        try:
            recorded = json.loads(row["config"])
        except ValueError:
            return "its recorded configuration is not valid JSON"
        return _config_difference(recorded, run.config)
    return None


# ------------------------------------------------------------------------------------------------------ runner
def _submitit_results(runs, call, out, jobs, cluster, timeout_min):
    """Yield (run, result) as submitit jobs finish, at most ``jobs`` in flight."""
    import submitit

    executor = submitit.AutoExecutor(folder=str(out / "submitit"), cluster=cluster)
    executor.update_parameters(timeout_min=timeout_min, cpus_per_task=1, name=f"mha-sweep-{out.name}")
    pending, running = list(runs), {}
    while pending or running:
        while pending and len(running) < jobs:
            run = pending.pop(0)
            running[executor.submit(execute_run, *call(run))] = run
        done = [job for job in running if job.done()]
        for job in done:
            run = running.pop(job)
            try:
                yield run, job.result()
            except Exception as error:  # noqa: BLE001 - the job itself failed (killed, timed out, ...)
                yield run, {"status": "failed", "error": _describe(error)}
        if not done:
            time.sleep(0.5)


def output_dir(sweep: Sweep, out: str | os.PathLike | None = None) -> Path:
    """``out``, or ``<the sweep file's folder>/<name>/``: a chapter's folder holds its sweep files and, beside each,
    the folder of its results."""
    if out is not None:
        return Path(out).resolve()
    return (sweep.path.parent / sweep.name).resolve()


@contextlib.contextmanager
def _one_runner(out: Path):
    """Hold ``out/runs/.runner`` locked while this runner works (the lock ends with the process, however it ends);
    a second runner on the same folder gets SweepBusyError naming the first one's pid."""
    path = out / "runs" / ".runner"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            pid = handle.read().strip() or "unknown"
            raise SweepBusyError(f"another runner is working on this sweep (pid {pid}, results in {out}); wait for it "
                                 f"to finish, or stop it (kill {pid}) and run again") from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def device_problems(sweep: Sweep, runs: list[Run]) -> list[str]:
    """Each device the runs ask for that this machine does not have, and why (a study sweep's ``device``)."""
    from mha.experiments.machine import device_problem

    devices = sorted({run.config["device"] for run in runs if sweep.study is not None and "device" in run.config})
    problems = [(device, device_problem(device)) for device in devices]
    return [f"runs ask for device {device!r}, but {problem}" for device, problem in problems if problem]


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


def _changed_message(sweep: Sweep, csv_path: Path, changed: list, total: int) -> str:
    keys = list(sweep.grid)
    shown = "\n".join(f"  run {run.run_id} ({_describe_parameters(run.parameters, keys)}): {difference}"
                      for run, difference in changed[:10])
    more = f"\n  ... and {len(changed) - 10} more" if len(changed) > 10 else ""
    return (f"{sweep.path}: {len(changed)} of {total} finished runs in {csv_path} were made with another study or "
            f"configuration than the one the sweep file and the code give now, so their results do not describe "
            f"these runs:\n{shown}{more}\nRerun them with --rerun-changed (their rows are replaced), or restore the "
            f"sweep file or the code that made them.")


def run_sweep(config_path: str | os.PathLike, out: str | os.PathLike | None = None, jobs: int | None = None,
              launcher: str = "local", cluster: str = "slurm", dry_run: bool = False, kernel: str = "python3",
              timeout_min: int = 60, progress: bool = True, executor: str = "notebook",
              only: list[str] | None = None, rerun_changed: bool = False) -> list[dict]:
    """Run (or, with ``dry_run``, list) the sweep's unfinished runs; return the sweep's rows of results.csv.

    ``out`` defaults to :func:`output_dir`. ``jobs`` defaults to the sweep file's ``jobs`` (else 1).
    ``launcher="local"`` runs in this process (jobs=1) or in a pool of ``jobs`` processes; ``"submitit"`` submits
    each run as a job through ``submitit.AutoExecutor(folder, cluster=cluster)`` (``cluster``: "slurm", or
    "local"/"debug" to try it on one machine), ``jobs`` at a time, each limited to ``timeout_min`` minutes.
    ``executor``: "notebook" (papermill) or "function" (the study's function in a fresh process). ``only``: run_ids
    to run (others are left as they are). Finished rows whose study or configuration differ from the sweep's now
    raise :class:`ChangedRunsError` before anything runs, unless ``rerun_changed``. Another runner on the same
    folder raises :class:`SweepBusyError`. With ``dry_run`` nothing runs: the rows returned are the planned runs,
    with status "ok" (finished and trusted), "changed" (finished with another configuration; ``reason`` says
    which) or "todo".
    """
    sweep = load_sweep(config_path)
    jobs = sweep.jobs if jobs is None else check_int("jobs", jobs)
    check_choice("launcher", launcher, ("local", "submitit"))
    check_choice("executor", executor, EXECUTORS)
    check_bool("rerun_changed", rerun_changed)
    out = output_dir(sweep, out)
    results = Results(out / "results.csv", out / "runs" / ".lock")
    runs = sweep.runs()
    if only is not None:
        unknown = sorted(set(only) - {run.run_id for run in runs})
        if unknown:
            raise ValueError(f"only: run_ids {unknown} are not runs of {sweep.path.name} (see --dry-run)")
        runs = [run for run in runs if run.run_id in set(only)]
    order = [run.run_id for run in sweep.runs()]

    if dry_run:
        state = plan(sweep, results, runs)
        changed = dict((run.run_id, difference) for run, difference in state["changed"])
        return [{"run_id": run.run_id, "sweep": sweep.name,
                 "status": "ok" if run.run_id in state["finished"] else "changed" if run.run_id in changed else "todo",
                 "reason": changed.get(run.run_id, ""), **{k: _cell(v) for k, v in run.parameters.items()}}
                for run in runs]

    with _one_runner(out):
        state = plan(sweep, results, runs)
        for bad in state["bad"]:
            print(f"{results.path}, line {bad.line} (run {bad.run_id or '?'}): not trusted, {bad.reason}; the row "
                  f"is dropped and its run redone", file=sys.stderr)
        if state["changed"] and not rerun_changed:
            raise ChangedRunsError(_changed_message(sweep, results.path, state["changed"],
                                                    len(state["finished"]) + len(state["changed"])))
        todo = [run for run in runs if run.run_id not in state["finished"]]
        problems = device_problems(sweep, todo)
        if problems:  # before any run starts
            raise ValueError(f"{sweep.path}: {'; '.join(problems)}; run this sweep on a machine that has it, or "
                             f"change 'device' in the sweep file")
        if state["bad"]:  # never carried along: the table is written again without them now
            with results._lock():
                results.write(results.read(), order)
        _execute(sweep, todo, results, order, out, jobs, launcher, cluster, kernel, timeout_min, progress, executor)
    wanted = {run.run_id for run in runs}
    return [row for row in results.read() if row["run_id"] in wanted]


def _execute(sweep, todo, results, order, out, jobs, launcher, cluster, kernel, timeout_min, progress, executor):
    """Execute ``todo`` and record each run's row as it finishes."""
    commit = _git_commit((sweep.notebook or Path(__file__)).parent)  # the code that runs: the notebook's checkout
    runs_dir = out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)

    def call(run):
        return sweep, run, str(runs_dir), executor, kernel

    bar = tqdm(total=len(todo), desc=f"sweep {sweep.name}", unit="run", disable=not progress)
    counts = {"ok": 0, "failed": 0}

    def record(run, result):
        results.add({"run_id": run.run_id, "sweep": sweep.name, **run.config, **result, "git_commit": commit,
                     "study": sweep.label, "config": canonical_config(run.config)}, order)
        counts[result["status"]] += 1
        bar.set_postfix(counts)
        bar.update()

    try:
        if launcher == "submitit":
            for run, result in _submitit_results(todo, call, out, jobs, cluster, timeout_min):
                record(run, result)
        elif jobs == 1:
            for run in todo:
                record(run, execute_run(*call(run)))
        else:
            pool = _worker_pool(jobs)
            try:
                futures = {pool.submit(execute_run, *call(run)): run for run in todo}
                for future in as_completed(futures):
                    record(futures[future], future.result())
            finally:  # on an interruption, do not start the queued runs
                pool.shutdown(wait=True, cancel_futures=True)
    finally:
        bar.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mha.sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="sweep file (YAML)")
    parser.add_argument("--out", help="output directory (default: <the sweep file's folder>/<name>/)")
    parser.add_argument("--jobs", type=int, default=None, help="runs in parallel (default: the sweep file's jobs, else 1)")
    parser.add_argument("--only", nargs="+", metavar="RUN_ID", help="run only these runs (see --dry-run)")
    parser.add_argument("--executor", choices=EXECUTORS, default="notebook",
                        help="notebook: papermill (default); function: the study's function, no Jupyter needed")
    parser.add_argument("--launcher", choices=("local", "submitit"), default="local")
    parser.add_argument("--cluster", default="slurm", help="submitit cluster: slurm (default), local or debug")
    parser.add_argument("--timeout-min", type=int, default=60, help="submitit: time limit of one run (minutes)")
    parser.add_argument("--dry-run", action="store_true", help="list the runs and whether they are done; run none")
    parser.add_argument("--rerun-changed", action="store_true",
                        help="rerun the finished runs whose recorded study or configuration differ from the sweep's "
                             "now (otherwise the sweep stops and lists them)")
    args = parser.parse_args(argv)
    try:
        rows = run_sweep(args.config, out=args.out, jobs=args.jobs, launcher=args.launcher, cluster=args.cluster,
                         dry_run=args.dry_run, timeout_min=args.timeout_min, executor=args.executor, only=args.only,
                         rerun_changed=args.rerun_changed)
    except (ChangedRunsError, SweepBusyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.dry_run:
        for row in rows:
            params = ", ".join(f"{k}={v}" for k, v in row.items() if k not in ("run_id", "sweep", "status", "reason"))
            reason = f"  [{row['reason']}]" if row["reason"] else ""
            print(f"{row['run_id']}  {row['status']:7}  {params}{reason}")
        planned = load_sweep(args.config)
        for problem in device_problems(planned, planned.runs()):
            print(f"note: {problem}: a run here would stop before starting")
        todo = sum(r["status"] == "todo" for r in rows)
        changed = sum(r["status"] == "changed" for r in rows)
        print(f"{todo} of {len(rows)} runs to do" + (f"; {changed} finished with another configuration "
                                                     f"(--rerun-changed reruns them)" if changed else ""))
        return 0
    failed = [row for row in rows if row["status"] != "ok"]
    for row in failed:
        print(f"failed {row['run_id']}: {row['error']}", file=sys.stderr)
    out = output_dir(load_sweep(args.config), args.out)
    print(f"{len(rows) - len(failed)} of {len(rows)} runs ok; results in {out / 'results.csv'}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
