"""A sweep file: read it, check it and every run it makes (:func:`load_sweep`), each run named by a stable hash.

Book: part III (experiments); every chapter's sweeps are such files, ``experiments/<chapter>/<sweep>.yaml``.

A sweep file (YAML)::

    name: smoke                         # the results folder: <the sweep file's folder>/<name>/
    study: train                        # a study of mha.experiments.studies: train, heads, dynamics, shakespeare
    base: {task: two_offset, steps: 40} # settings shared by every run (the study configuration's flat names)
    grid: {n_heads: [1, 4], seed: [0, 1]}   # runs: the cartesian product of these lists
    jobs: 2                             # optional: runs in parallel when --jobs is not given (default 1)

Every setting is a flat name of the study's configuration (:mod:`mha.experiments.config`): each run's configuration
is made and checked once, when the file is loaded, so an unknown name, a wrong type or a bad value stops the sweep
before any run starts (and a chapter that loads the same sweep again does not check it again). A key given twice in
one mapping is refused (YAML readers usually keep the last one silently), and ``1e-3`` is a float. The study's
papermill template is ``experiments/notebooks/<study>.ipynb``, under the sweep file's repository, else under the
checkout the package runs from.

A run's ``run_id`` is a hash of its base + grid settings (:func:`run_id`), stable across reruns, key order and
machines; its ``config`` is every setting it uses, defaults included, compared as canonical JSON
(:func:`canonical_config`).

Overrides from the command line (``python -m mha.sweep FILE --set steps=100 --set seed=0``; :func:`parse_overrides`,
``load_sweep(path, overrides)``): each ``KEY=VALUE`` sets one setting of the study's configuration for every run, its
value read as one YAML scalar by the sweep file's own reader (``1e-3`` a float, ``null`` None, ``true`` a bool) and
checked like any setting. A key of the grid keeps that one value (``--set seed=0`` runs seed 0 only); any other
setting replaces or joins ``base``. Such a sweep is another sweep: its name (and so its default results folder) is
the file's name followed by ``--`` and the overrides (``head-count-gpu--steps-100_seed-0``), and its run ids hash
the overrides too, so that its runs never collide with the full sweep's committed runs.

The runner is :mod:`mha.experiments.sweep`; the table of results, :mod:`mha.experiments.results`.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from mha._checks import check_int

if TYPE_CHECKING:
    from mha.experiments.config import RunConfig

__all__ = ["Sweep", "Run", "load_sweep", "run_id", "canonical_config", "config_difference", "command",
           "describe_parameters", "parse_overrides", "format_overrides", "RUNNER_PARAMETERS", "NOTEBOOKS"]

RUNNER_PARAMETERS = ("out_dir", "artifacts_dir")  # set by the runner for every run, never by a sweep
SWEEP_KEYS = {"name", "study", "base", "grid", "jobs"}
NOTEBOOKS = Path("experiments") / "notebooks"  # the studies' templates, relative to the repository root


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


def run_id(parameters: dict, overrides: dict | None = None) -> str:
    """12 hex digits of the sha256 of the parameters as canonical JSON (sorted keys): same parameters, same id.

    With command-line ``overrides`` (``--set``), the hash covers ``{"parameters": ..., "set": overrides}``, so a run
    made with overrides never has the id of a run of the sweep file itself, even where the values coincide."""
    content = parameters if not overrides else {"parameters": parameters, "set": overrides}
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def _scalar_text(value) -> str:
    """A YAML scalar as ``--set`` writes it: null, true/false, numbers as Python writes them, strings as they are,
    quoted where YAML would read them as something else (``'7'``, ``'null'``), so that it reads back the same."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    if isinstance(value, str):
        try:
            same = text.strip() != "" and yaml.load(text, Loader=_Loader) == value
        except yaml.YAMLError:
            same = False
        if not same:
            text = "'" + value.replace("'", "''") + "'"
    return text


def parse_overrides(items) -> dict:
    """``["steps=100", "seed=0"]`` (``--set`` arguments) -> ``{"steps": 100, "seed": 0}``.

    Each item is ``KEY=VALUE``: KEY a setting's name (letters, digits and ``_``), VALUE one YAML scalar read by the
    sweep file's reader (``1e-3`` is a float, ``null`` None, ``true`` a bool, ``'7'`` a string). A list or a mapping,
    an item without ``=``, an empty key, a key given twice or a key the runner sets itself raise ValueError naming
    the item; an item that is not a string raises TypeError. Whether KEY is a setting of the study, and whether its
    value suits it, is checked by :func:`load_sweep`, as for the sweep file's own settings."""
    if isinstance(items, (str, bytes)) or not isinstance(items, (list, tuple)):
        raise TypeError(f"overrides must be a list of 'KEY=VALUE' strings, got {items!r} of type "
                        f"{type(items).__name__}")
    overrides = {}
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"--set takes KEY=VALUE strings, got {item!r} of type {type(item).__name__}")
        key, equals, text = item.partition("=")
        key = key.strip()
        if not equals or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"--set {item!r}: expected KEY=VALUE with KEY a setting's name (e.g. --set steps=100)")
        if key in overrides:
            raise ValueError(f"--set {item!r}: {key} is set twice ({key}={_scalar_text(overrides[key])} first); "
                             f"give each setting once")
        if key in RUNNER_PARAMETERS:
            raise ValueError(f"--set {item!r}: '{key}' is set by the runner for each run; use --out")
        if not text.strip():
            raise ValueError(f"--set {item!r}: no value after '='; write null for None")
        try:
            value = yaml.load(text, Loader=_Loader)
        except yaml.YAMLError as error:
            raise ValueError(f"--set {item!r}: the value is not a YAML scalar ({' '.join(str(error).split())})") \
                from None
        if isinstance(value, (list, dict)):
            raise ValueError(f"--set {item!r}: the value must be one YAML scalar (a number, a string, true/false or "
                             f"null), got a {type(value).__name__}; set structured values in the sweep file")
        overrides[key] = value
    return overrides


def format_overrides(overrides: dict) -> list[str]:
    """The ``--set`` arguments that make ``overrides`` (:func:`parse_overrides`' inverse), in the given order."""
    return [f"{key}={_scalar_text(value)}" for key, value in overrides.items()]


def _override_tag(overrides: dict) -> str:
    """``{"steps": 100, "seed": 0}`` -> ``"steps-100_seed-0"``: the suffix of an overridden sweep's name."""
    text = "_".join(f"{key}-{_scalar_text(value)}" for key, value in overrides.items())
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)


def canonical_config(config: dict) -> str:
    """A configuration as canonical JSON (sorted keys, no spaces): the ``config`` column, compared as text."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)


@dataclass(frozen=True)
class Run:
    run_id: str  # stable hash of ``parameters``
    parameters: dict  # base + this grid point (what the sweep sets)
    config: dict  # every setting the run uses, defaults included, flat (the row's columns; its ``config`` column)
    study_config: RunConfig  # its configuration, made and checked once, when the sweep was loaded, and handed as it
    # is to the study's function (``--executor function``)


@dataclass
class Sweep:
    name: str  # the sweep's name (its results folder's name)
    study: str  # the study (mha.experiments.studies)
    notebook: Path | None  # the study's papermill template (None when no checkout has it: --executor function)
    base: dict  # parameters shared by every run
    grid: dict  # parameter -> list of values; the runs are the cartesian product
    path: Path  # the YAML file
    jobs: int = 1  # runs in parallel unless the command line says otherwise
    overrides: dict = field(default_factory=dict)  # the command line's --set (already in base and grid); {} if none
    adjusted: list = field(default_factory=list)  # what --set steps=N changed besides (warmup_steps cut to N), in words
    _runs: list = field(default_factory=list, repr=False)  # the runs, made and checked by load_sweep

    def runs(self) -> list[Run]:
        """Every grid point, in the grid's order (the last parameter varies fastest), with its configuration."""
        return self._runs

    def threads(self, run: Run) -> int:
        """CPU threads of one run (its setting ``threads``, 1 unless the sweep sets it)."""
        return run.config["threads"]

    def command(self) -> str:
        """The command that (re)makes this sweep's results (:func:`command`), with its ``--set`` overrides."""
        return command(self.path, self.jobs, overrides=self.overrides)


def command(sweep_file: str | os.PathLike, jobs: int = 1, root: str | os.PathLike | None = None,
            overrides: dict | None = None) -> str:
    """The command that (re)makes a sweep's results: ``python -m mha.sweep <sweep file> [--set K=V ...] [--jobs
    N]``, the file relative to ``root`` (default: the repository holding it, when there is one), from where the
    command runs. ``jobs``: the sweep file's (runs in parallel; the wall-time sweeps leave it at 1, one run at a
    time); ``overrides``: the command line's ``--set`` settings, if any."""
    import shlex

    path = Path(sweep_file).resolve()
    root = _repo_root(path.parent) if root is None else Path(root).resolve()
    shown = path.relative_to(root) if root is not None and path.is_relative_to(root) else path
    sets = "".join(f" --set {shlex.quote(item)}" for item in format_overrides(overrides or {}))
    return f"python -m mha.sweep {shown}{sets}" + (f" --jobs {jobs}" if jobs > 1 else "")


def _repo_root(start: Path) -> Path | None:
    """The nearest ancestor of ``start`` (itself included) holding ``.git``, or None."""
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return None


def _study_notebook(path: Path, study: str) -> Path | None:
    """The study's template: under the sweep file's repository, else under the checkout the package runs from."""
    package_checkout = Path(__file__).resolve().parents[3]  # src/mha/experiments/sweep_file.py -> the checkout
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


def load_sweep(config_path: str | os.PathLike, overrides: dict | None = None) -> Sweep:
    """Read and check a sweep file and every run it makes; an error names the file, the key and the run.

    ``overrides``: settings from the command line (``--set``, :func:`parse_overrides`), applied to every run: a grid
    key keeps that one value, any other setting goes into ``base``. The sweep is then named ``<name>--<overrides>``
    and its run ids hash the overrides (see the module's docstring). An override that is not a setting of the study
    raises ValueError naming it; a bad value fails like a bad value in the file, naming the run."""
    path = Path(config_path).resolve()
    if overrides is None:
        overrides = {}
    if not isinstance(overrides, dict):
        raise TypeError(f"overrides must be a dict of setting names to values (see parse_overrides), got "
                        f"{overrides!r} of type {type(overrides).__name__}")
    if not path.is_file():
        raise FileNotFoundError(f"sweep file {path} does not exist")
    spec = _read_yaml(path)
    from mha.experiments.studies import STUDIES  # imported here: ``python -m mha.sweep --help`` stays fast

    if not isinstance(spec, dict):
        raise ValueError(f"{path}: a sweep file is a mapping with keys {sorted(SWEEP_KEYS)}, got {type(spec).__name__}")
    if "notebook" in spec:
        raise ValueError(f"{path}: sweep files name a study (study: one of {sorted(STUDIES)}), whose template is "
                         f"{NOTEBOOKS / '<study>.ipynb'}; plain notebook sweeps were removed, so 'notebook' is not a "
                         f"key of a sweep file")
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
    study = spec.get("study")
    if study not in STUDIES:
        raise ValueError(f"{path}: study must be one of {sorted(STUDIES)}, got {study!r}")
    if overrides:
        settings = STUDIES[study].config.settings()
        for key in overrides:
            if key in RUNNER_PARAMETERS:
                raise ValueError(f"--set {key}: '{key}' is set by the runner for each run; use --out")
            if key not in settings:
                close = difflib.get_close_matches(str(key), list(settings), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"--set {key}={_scalar_text(overrides[key])}: {key!r} is not a setting of study "
                                 f"{study!r}{hint}; its settings are {list(settings)}")
        base, grid = dict(base), dict(grid)
        for key, value in overrides.items():
            if key in grid:
                grid[key] = [value]
            else:
                base[key] = value
        adjusted = _shorten_warmup(study, base, grid, overrides)
        name = f"{name}--{_override_tag(overrides)}"
    else:
        adjusted = []
    sweep = Sweep(name, study, _study_notebook(path, study), base, grid, path, jobs, dict(overrides), adjusted)
    _check_runs(sweep)
    return sweep


def _shorten_warmup(study: str, base: dict, grid: dict, overrides: dict) -> list[str]:
    """``--set steps=N`` shortens the runs: a warmup longer than N (the file's or the default, when ``--set`` does not
    name ``warmup_steps`` itself) becomes N, in ``base``, so that the shortened runs are valid (warmup_steps <= steps
    is a rule of the configuration). Returns what was changed, in words (the runner prints it)."""
    from mha.experiments.studies import STUDIES

    steps = overrides.get("steps")
    if "warmup_steps" in overrides or "warmup_steps" in grid or isinstance(steps, bool) or not isinstance(steps, int):
        return []
    warmup = base.get("warmup_steps", STUDIES[study].config.from_dict({}).to_dict().get("warmup_steps"))
    if isinstance(warmup, int) and not isinstance(warmup, bool) and 0 < steps < warmup:
        base["warmup_steps"] = steps
        return [f"warmup_steps {warmup} -> {steps} (a warmup must not be longer than the run; --set warmup_steps=... "
                f"to choose another)"]
    return []


def _check_runs(sweep: Sweep) -> None:
    """Make every run and check its settings now, not when the run starts; two grid points that make the same run
    (a value listed twice, or 1 and 1.0) are refused."""
    from mha.experiments.studies import STUDIES

    keys, points = list(sweep.grid), itertools.product(*sweep.grid.values())
    seen = {}
    runs = []
    given = f" (with --set {' '.join(format_overrides(sweep.overrides))})" if sweep.overrides else ""
    for values in points:
        parameters = {**sweep.base, **dict(zip(keys, values))}
        try:
            study_config = _study_config(STUDIES[sweep.study].config, parameters)
        except (TypeError, ValueError) as error:
            raise type(error)(f"{sweep.path}{given}: run {run_id(parameters, sweep.overrides)} "
                              f"({describe_parameters(parameters, keys)}): {error}") from None
        config = study_config.to_dict()  # every setting of the run, flat, defaults included
        text = canonical_config(config)
        if text in seen:
            raise ValueError(f"{sweep.path}: the grid points ({describe_parameters(seen[text], keys)}) and "
                             f"({describe_parameters(parameters, keys)}) make the same run; list each value once")
        seen[text] = parameters
        runs.append(Run(run_id(parameters, sweep.overrides), parameters, config, study_config))
    sweep._runs = runs


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


def describe_parameters(parameters: dict, keys) -> str:
    """A run's grid values, ``key=value, ...`` (``keys``: the grid's names), for messages that name a run."""
    return ", ".join(f"{k}={parameters[k]!r}" for k in keys) or "base"


def config_difference(recorded, now: dict) -> str:
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

