"""The one timer of the benchmarks: contenders timed side by side, ratios as medians of per-repeat ratios.

The rule (book: appendix "Benchmarks"; used by ``python -m mha.bench`` and ``python -m mha.kernels.benchmark``):

1. **Warm-up.** ``warmup`` (>= 1) untimed rounds, each calling every contender once. The slowest contender's call in
   the last round sets how many calls every timing makes, the same for all: enough for it to last ``min_time_s``
   (at most ``max_calls``).
2. **Paired repeats.** ``repeats`` rounds; each round times every contender once, in an order that rotates from
   round to round ((a, b), (b, a), ... for two), so that no contender always runs first. A timing is ``clock()``
   around its calls, with ``torch.cuda.synchronize`` before and after on CUDA, divided by the number of calls.
3. **Ratios side by side.** A ratio is taken within each round (both members saw the same load) and the reported
   value is the **median of the per-round ratios**, with its quartiles; never a ratio of medians.

:func:`paired_times` runs steps 1 and 2 for any number of contenders; :func:`compare` is the two-contender form
with the summary the benchmark JSON records; :func:`summary` gives the median and quartiles of a list.
:class:`ScriptedClock` is a fake clock that shows what the timer does with given costs (book and tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from mha._checks import check_float, check_int
from mha.experiments.machine import synchronize

__all__ = ["TimingConfig", "ScriptedClock", "paired_times", "compare", "summary", "ratio_summary"]

MAX_CALLS = 10_000  # calls per timing, at most (a contender so fast that it needs more is timed less precisely)


@dataclass(frozen=True)
class TimingConfig:
    """The timer's settings, shared by every benchmark configuration (each subclass may change the defaults)."""

    repeats: int = 11  # timed rounds per point (the median of the per-round ratios is reported)
    warmup: int = 2  # untimed rounds before the timed ones (the first call compiles, allocates, fills caches)
    min_time_s: float = 0.02  # a timing repeats a call until it lasts this long (0: one call per timing)

    def __post_init__(self):
        check_int("repeats", self.repeats)
        check_int("warmup", self.warmup)
        check_float("min_time_s", self.min_time_s, minimum=0.0)

    def timing_kwargs(self) -> dict:
        """``repeats``, ``warmup`` and ``min_time_s``: keyword arguments of :func:`paired_times` and :func:`compare`."""
        return dict(repeats=self.repeats, warmup=self.warmup, min_time_s=self.min_time_s)


def summary(values) -> dict:
    """median, q1, q3 (linear interpolation, numpy's default) and the IQR q3 - q1 of a list of numbers."""
    q1, median, q3 = np.percentile(np.asarray(values, dtype=float), [25, 50, 75])
    return dict(median=float(median), q1=float(q1), q3=float(q3), iqr=float(q3 - q1))


def ratio_summary(numerators, denominators) -> dict:
    """:func:`summary` of the per-round ratios ``numerators[r] / denominators[r]`` (the median of paired ratios)."""
    return summary([a / b for a, b in zip(numerators, denominators, strict=True)])


class ScriptedClock:
    """A clock that moves only when a contender runs, each call adding the contender's next scripted cost: it
    shows what :func:`compare` does with given timings (book: appendix "Benchmarks"; tests/test_bench.py)."""

    def __init__(self):
        self.now = 0.0
        self.log = []  # the contenders' names, in the order they ran

    def __call__(self) -> float:
        return self.now

    def contender(self, costs, name: str = "") -> callable:
        """A contender whose k-th call costs ``costs[k]`` seconds of this clock."""
        costs = iter(costs)

        def fn():
            self.log.append(name)
            self.now += next(costs)

        return fn


def paired_times(fns: dict, repeats: int, warmup: int = 1, min_time_s: float = 0.0, device=None, clock=None,
                 max_calls: int = MAX_CALLS) -> dict:
    """Time the zero-argument callables ``fns`` (``{name: fn}``) side by side, by the rule of the module docstring.

    Returns ``{"times": {name: [seconds per call, one per round]}, "calls": calls per timing, "repeats", "warmup"}``.
    ``device``: synchronise CUDA around every timing (None or a CPU device: no synchronisation). ``clock``: a
    callable returning seconds; default ``torch.utils.benchmark``'s timer (``time.perf_counter``).
    """
    for name, value in (("repeats", repeats), ("warmup", warmup), ("max_calls", max_calls)):
        check_int(name, value)
    min_time_s = check_float("min_time_s", min_time_s, minimum=0.0)
    if not fns:
        raise ValueError("fns must name at least one contender, got none")
    if clock is None:
        from torch.utils.benchmark.utils.timer import timer as clock  # perf_counter
    device = None if device is None else torch.device(device)

    def timed(fn, calls):
        if device is not None:
            synchronize(device)
        start = clock()
        for _ in range(calls):
            fn()
        if device is not None:
            synchronize(device)
        return (clock() - start) / calls

    names = list(fns)
    for _ in range(warmup):
        slowest = max([timed(fns[name], 1) for name in names])  # every contender runs, in order
    calls = 1 if min_time_s == 0 or slowest >= min_time_s else \
        min(max_calls, math.ceil(min_time_s / max(slowest, 1e-9)))
    times = {name: [] for name in names}
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:  # rotate who goes first
            times[name].append(timed(fns[name], calls))
    return dict(times=times, calls=calls, repeats=repeats, warmup=warmup)


def compare(fn_a, fn_b, repeats: int, warmup: int = 1, min_time_s: float = 0.0, device=None,
            clock=None, max_calls: int = MAX_CALLS) -> dict:
    """Time ``fn_a`` against ``fn_b`` side by side; return the median per-pair ratio time(a) / time(b).

    :func:`paired_times` with two contenders: ``warmup`` (>= 1) untimed calls of each, then ``repeats`` pairs in
    alternating order (a, b), (b, a), (a, b), ..., each timing ``clock()`` around the same number of calls for both
    (enough for the slower to last ``min_time_s``), with ``torch.cuda.synchronize`` before and after on CUDA.

    Returns a dict: ``ratio`` (median of the per-pair ratios a / b), ``ratio_q1``, ``ratio_q3``, ``ratio_iqr``;
    ``a_s`` and ``b_s`` (median seconds per call) with their quartiles (``a_q1_s``, ...); ``calls_a``, ``calls_b``,
    ``repeats``, ``warmup``; and the raw per-pair times ``pairs_a_s``, ``pairs_b_s``.
    """
    timed = paired_times({"a": fn_a, "b": fn_b}, repeats, warmup, min_time_s, device, clock, max_calls)
    times_a, times_b = timed["times"]["a"], timed["times"]["b"]
    ratio, a, b = ratio_summary(times_a, times_b), summary(times_a), summary(times_b)
    return dict(ratio=ratio["median"], ratio_q1=ratio["q1"], ratio_q3=ratio["q3"], ratio_iqr=ratio["iqr"],
                a_s=a["median"], a_q1_s=a["q1"], a_q3_s=a["q3"], b_s=b["median"], b_q1_s=b["q1"], b_q3_s=b["q3"],
                calls_a=timed["calls"], calls_b=timed["calls"], repeats=repeats, warmup=warmup,
                pairs_a_s=times_a, pairs_b_s=times_b)
