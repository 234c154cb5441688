"""The words and numbers part III's chapters paste into their prose: one rule for each way a result is written.

Book: part III, every chapter, and the appendices that check its results. A chapter computes a result with
:mod:`mha.experiments.stats` and writes it with these functions, so that "0.05 [0.01, 0.24]" means the same thing
(a mean and its 95% interval) on every page.

* :func:`interval_text` and :func:`result_text` — a mean with its interval, "0.123 [0.101, 0.145]" (or
  "0.123 (0.101 to 0.145)"); the mean alone where there is no interval (a single run).
* :func:`count_text` — a count of runs with the Wilson interval of the fraction, "3/10 [0.11, 0.60]" (or
  "3/10 (11%–60%)").
* :func:`and_join` — "a, b and c"; :func:`pairs_text` — "1 and 4, 2 and 4"; :func:`number_ranges` —
  "0–2, 5, 1337".
* :func:`error_bars` — a figure's error-bar lengths from intervals (matplotlib's ``yerr``).
* :func:`machine_values` — what ran the sweeps, from the machine records of
  :meth:`mha.experiments.results.SweepResults.machine`.
* :func:`regenerate_command` — the command that remakes a sweep's results, which each figure prints beside itself
  (:attr:`mha.experiments.results.SweepResults.command`), also for a sweep file that has not been run yet.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterable, Mapping

import numpy as np

from mha._checks import check_choice, check_int, check_type

__all__ = ["interval_text", "result_text", "count_text", "and_join", "pairs_text", "number_ranges", "error_bars",
           "machine_values", "regenerate_command"]

FORMS = ("brackets", "to")
"""How :func:`interval_text` writes an interval: "m [low, high]" or "m (low to high)"."""


def _real(name: str, value) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} of type {type(value).__name__}")
    return value


def _format_spec(fmt) -> str:
    check_type("fmt", fmt, str, "a format specification for a float such as '.3f'")
    try:
        format(0.0, fmt)
    except ValueError:
        raise ValueError(f"fmt must be a format specification for a float such as '.3f' or '+.4f', got {fmt!r}") \
            from None
    return fmt


def interval_text(mean, low, high, fmt: str = ".3f", form: str = "brackets") -> str:
    """A mean with its interval, each number written with ``fmt``: ``form="brackets"`` gives
    "0.123 [0.101, 0.145]", ``form="to"`` gives "0.123 (0.101 to 0.145)". Where an end is NaN (a single run has no
    interval) the mean alone: "0.123"; where an end is infinite (a test that cannot reject at this sample size, e.g.
    the sign-flip test at five pairs) the mean and "unbounded": "0.123 [unbounded]" or "0.123 (unbounded)"."""
    mean, low, high = _real("mean", mean), _real("low", low), _real("high", high)
    fmt = _format_spec(fmt)
    check_choice("form", form, FORMS)
    if math.isnan(low) or math.isnan(high):
        return f"{mean:{fmt}}"
    if not (math.isfinite(low) and math.isfinite(high)):
        return f"{mean:{fmt}} (unbounded)" if form == "to" else f"{mean:{fmt}} [unbounded]"
    if form == "to":
        return f"{mean:{fmt}} ({low:{fmt}} to {high:{fmt}})"
    return f"{mean:{fmt}} [{low:{fmt}}, {high:{fmt}}]"


def result_text(result, fmt: str = ".3f", form: str = "brackets") -> str:
    """:func:`interval_text` of a result of :mod:`mha.experiments.stats` (a dict, or a table row, with ``mean``,
    ``low`` and ``high``), e.g. ``result_text(stats.mean_interval(losses), ".2f")``."""
    try:
        mean, low, high = result["mean"], result["low"], result["high"]
    except (KeyError, TypeError, IndexError):
        raise TypeError(f"result must hold 'mean', 'low' and 'high' (a dict from mha.experiments.stats), got "
                        f"{type(result).__name__}") from None
    return interval_text(mean, low, high, fmt, form)


def difference_text(difference) -> str:
    """The largest difference between a result and an independent computation of it, for the prose: "0 (exact)" when
    it is exactly zero, else one significant digit ("3e-16"). NaN is refused: a check that compared nothing."""
    difference = float(_real("difference", difference))
    if math.isnan(difference) or difference < 0:
        raise ValueError(f"difference must be a largest absolute difference (>= 0), got {difference!r}")
    return "0 (exact)" if difference == 0 else f"{difference:.0e}"


def count_text(k, n, form: str = "brackets") -> str:
    """``k`` of ``n`` runs with the 95% Wilson interval of the fraction k/n (:func:`mha.experiments.stats.
    wilson_interval`): ``form="brackets"`` gives "3/10 [0.11, 0.60]", ``form="percent"`` gives "3/10 (11%–60%)"."""
    from mha.experiments.stats import wilson_interval

    n = check_int("n", n)
    k = check_int("k", k, minimum=0, maximum=n)
    check_choice("form", form, ("brackets", "percent"))
    low, high = wilson_interval(k, n)
    if form == "percent":
        return f"{k}/{n} ({low:.0%}–{high:.0%})"
    return f"{k}/{n} [{low:.2f}, {high:.2f}]"


def _items(name: str, items) -> list:
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
        raise TypeError(f"{name} must be an iterable of items (a list, a tuple, ...), got {type(items).__name__}")
    return list(items)


def and_join(items) -> str:
    """"a, b and c" (each item written with ``str``; one item alone, none: "")."""
    words = [str(item) for item in _items("items", items)]
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else "".join(words)


def pairs_text(pairs, none: str = "no pair") -> str:
    """``[(1, 4), (2, 4)]`` -> "1 and 4, 2 and 4"; ``none`` when there is no pair."""
    pairs = _items("pairs", pairs)
    check_type("none", none, str, "a string")
    for pair in pairs:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise ValueError(f"pairs must hold pairs (a, b), got {pair!r}")
    return ", ".join(f"{a} and {b}" for a, b in pairs) if pairs else none


def number_ranges(values) -> str:
    """Integers (seeds, say) as runs of consecutive values: ``[0, 1, 2, 5, 1337]`` -> "0–2, 5, 1337" (sorted
    first)."""
    values = sorted(check_int("values", value, minimum=None) for value in _items("values", values))
    parts, start = [], None
    for i, value in enumerate(values):
        start = value if start is None else start
        if i + 1 == len(values) or values[i + 1] != value + 1:
            parts.append(f"{start}–{value}" if value > start else f"{value}")
            start = None
    return ", ".join(parts)


def error_bars(mid, low, high) -> np.ndarray:
    """Error-bar lengths ``[[below, ...], [above, ...]]`` (matplotlib's ``yerr``) of points at ``mid`` with
    intervals ``low`` to ``high``: ``mid - low`` and ``high - mid``, clipped at 0 (an interval of zero width, such
    as a Wilson bound at k = 0, can sit a rounding error on the wrong side of its point)."""
    arrays = []
    for name, values in (("mid", mid), ("low", low), ("high", high)):
        try:
            arrays.append(np.asarray(values, dtype=float))
        except (TypeError, ValueError):
            raise TypeError(f"{name} must be real numbers, got {type(values).__name__}") from None
    mid, low, high = arrays
    if not (mid.shape == low.shape == high.shape):
        raise ValueError(f"mid, low and high must have one shape, got {mid.shape}, {low.shape} and {high.shape}")
    return np.clip([mid - low, high - mid], 0, None)


def machine_values(machines, key: str) -> list[str]:
    """Every value of ``key`` (e.g. "cpu_id", "torch_version") recorded by any of ``machines`` (each a dict from
    :meth:`mha.experiments.results.SweepResults.machine`), sorted, each once; [] when none records it."""
    machines = _items("machines", machines)
    check_type("key", key, str, "a column name such as 'cpu_id'")
    for machine in machines:
        check_type("machines", machine, Mapping, "an iterable of machine records (dicts from SweepResults.machine)")
    return sorted({value for machine in machines for value in machine.get(key, [])})


def regenerate_command(name: str, root: str | os.PathLike | None = None) -> str:
    """The command that regenerates sweep ``name``'s results, from the repository root (the one builder,
    :func:`mha.experiments.sweep_file.command`): "python -m mha.sweep experiments/<chapter>/<file>.yaml [--jobs N]", also
    for a sweep file that has not been run yet (the GPU and cluster files)."""
    from mha.experiments.results import sweep_names
    from mha.experiments.sweep_file import load_sweep

    check_type("name", name, str, "a sweep name such as 'head-count'")
    names = sweep_names(root)
    if name not in names:
        raise ValueError(f"no sweep named {name!r}; the sweeps are {sorted(names)}")
    return load_sweep(names[name]).command()
