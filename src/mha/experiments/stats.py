"""Uncertainty for the experiments' claims: intervals on proportions, means and paired differences over seeds.

Book: part III, every chapter (an ordering or a difference is stated only where its interval says so).

* :func:`wilson_interval` — the Wilson score interval of a proportion (k successes in n runs), which stays inside
  [0, 1] and behaves at k = 0 and k = n, where the normal approximation gives an empty or a negative interval.
* :func:`bootstrap_mean_interval` — the mean over seeds and a percentile bootstrap interval for it.
* :func:`paired_difference` — the mean of a paired difference (the same seeds under two settings), its percentile
  bootstrap interval and the exact sign-flip permutation p-value; a difference is called real only when the
  interval excludes 0.
* :func:`unpaired_difference` — the same for two independent groups of runs (different seeds, or different
  programs): the difference of the means, a bootstrap interval resampling each group on its own, and the
  permutation p-value over all ways of splitting the pooled runs into groups of the same sizes.
* :func:`outcomes` — the three plateaus of the two-offset task (solved, half solved, chance) and their frequencies.
* :func:`separated` — whether two intervals are disjoint (the only case where the book states an ordering).
* :func:`outcome_table` and :func:`paired_table` — the same, for a results table grouped by one setting.
"""

from __future__ import annotations

import itertools
import math
from statistics import NormalDist

import numpy as np

from mha._checks import check_float, check_int

__all__ = ["wilson_interval", "bootstrap_mean_interval", "paired_difference", "unpaired_difference", "separated",
           "outcomes",
           "OUTCOMES", "outcome_of", "outcome_table", "paired_table"]

OUTCOMES = ("solved", "partial", "chance")
"""The two-offset task's plateaus: loss 0 (both offsets read), ln 2 (one of the two), ln V (neither), V = vocabulary."""


def _z(confidence: float) -> float:
    confidence = check_float("confidence", confidence, minimum=0.0, maximum=1.0, min_inclusive=False,
                             max_inclusive=False)
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def wilson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval for a proportion of ``k`` successes in ``n`` trials::

        (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n),   p = k/n, z the normal quantile.
    """
    n = check_int("n", n)
    k = check_int("k", k, minimum=0, maximum=n)
    z = _z(confidence)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _values(values, name: str = "values") -> np.ndarray:
    array = np.asarray(values, dtype=float).ravel()
    if array.size < 2 or not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must hold at least two finite numbers, got {array.size} ({array[:5]}...)")
    return array


def bootstrap_mean_interval(values, confidence: float = 0.95, n_boot: int = 10_000, seed: int = 0) -> dict:
    """The mean of ``values`` (one per seed) and a percentile bootstrap interval: resample the seeds with
    replacement ``n_boot`` times and take the (1 - confidence)/2 and (1 + confidence)/2 quantiles of the means."""
    x = _values(values)
    n_boot = check_int("n_boot", n_boot)
    alpha = (1 - check_float("confidence", confidence, minimum=0.0, maximum=1.0, min_inclusive=False,
                             max_inclusive=False)) / 2
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)  # (n_boot,)
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return dict(mean=float(x.mean()), low=float(low), high=float(high), n=int(x.size))


def _sign_flip_p(d: np.ndarray) -> float:
    """Two-sided exact permutation p-value of mean(d) under "each difference's sign is a coin flip" (all 2^n sign
    patterns; n <= 20), else 100,000 random patterns."""
    observed = abs(d.mean())
    if d.size <= 20:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=d.size)))  # (2^n, n)
    else:
        signs = np.random.default_rng(0).choice((1.0, -1.0), size=(100_000, d.size))
    return float(np.mean(np.abs(signs @ d / d.size) >= observed - 1e-15))


def paired_difference(a, b, confidence: float = 0.95, n_boot: int = 10_000, seed: int = 0) -> dict:
    """``a - b`` paired by seed (``a[i]`` and ``b[i]`` share seed i): the mean difference, a percentile bootstrap
    interval over seeds, the exact sign-flip permutation p-value, and ``real`` = the interval excludes 0."""
    a, b = _values(a, "a"), _values(b, "b")
    if a.shape != b.shape:
        raise ValueError(f"a and b must pair one to one (the same seeds), got {a.size} and {b.size} values")
    d = a - b
    interval = bootstrap_mean_interval(d, confidence, n_boot, seed)
    return dict(mean=interval["mean"], low=interval["low"], high=interval["high"], n=interval["n"],
                p_value=_sign_flip_p(d), real=bool(interval["low"] > 0 or interval["high"] < 0))


def _split_p(a: np.ndarray, b: np.ndarray, max_splits: int = 500_000) -> float:
    """Two-sided permutation p-value of mean(a) - mean(b) under "the pooled values were split into the two groups
    at random": every split of the pooled values into groups of a.size and b.size when there are at most
    ``max_splits`` of them, else 100,000 random splits."""
    pooled = np.concatenate([a, b])
    n, n_a = pooled.size, a.size
    observed = abs(a.mean() - b.mean())
    if math.comb(n, n_a) <= max_splits:
        flat = np.fromiter(itertools.chain.from_iterable(itertools.combinations(range(n), n_a)), dtype=np.int32)
        groups = flat.reshape(-1, n_a)  # (splits, n_a): the indices that form group a
    else:
        rng = np.random.default_rng(0)
        groups = np.argsort(rng.random((100_000, n)), axis=1)[:, :n_a]
    sum_a = pooled[groups].sum(axis=1)  # (splits,)
    differences = sum_a / n_a - (pooled.sum() - sum_a) / (n - n_a)
    return float(np.mean(np.abs(differences) >= observed - 1e-12))


def unpaired_difference(a, b, confidence: float = 0.95, n_boot: int = 10_000, seed: int = 0) -> dict:
    """``mean(a) - mean(b)`` for two independent groups of runs (nothing pairs ``a[i]`` with ``b[i]``; the groups
    may differ in size): the difference, a percentile bootstrap interval (each group resampled with replacement on
    its own, ``n_boot`` times), the permutation p-value of :func:`_split_p`, and ``real`` = the interval excludes 0.
    """
    a, b = _values(a, "a"), _values(b, "b")
    n_boot = check_int("n_boot", n_boot)
    alpha = (1 - check_float("confidence", confidence, minimum=0.0, maximum=1.0, min_inclusive=False,
                             max_inclusive=False)) / 2
    rng = np.random.default_rng(seed)
    means_a = a[rng.integers(0, a.size, size=(n_boot, a.size))].mean(axis=1)  # (n_boot,)
    means_b = b[rng.integers(0, b.size, size=(n_boot, b.size))].mean(axis=1)  # (n_boot,)
    low, high = np.quantile(means_a - means_b, [alpha, 1 - alpha])
    return dict(mean=float(a.mean() - b.mean()), low=float(low), high=float(high), n_a=int(a.size),
                n_b=int(b.size), p_value=_split_p(a, b), real=bool(low > 0 or high < 0))


def separated(first: tuple[float, float], second: tuple[float, float]) -> bool:
    """True when the intervals (low, high) do not overlap."""
    return first[1] < second[0] or second[1] < first[0]


def outcome_of(loss: float, vocab_size: int) -> str:
    """'solved', 'partial' or 'chance' for a final two-offset loss: the nearest plateau of 0, ln 2 and
    ln(vocab_size), on a log scale of the loss (cut points: ln 2 / 2 and sqrt(ln 2 ln V))."""
    loss = check_float("loss", loss, minimum=0.0)
    vocab_size = check_int("vocab_size", vocab_size, minimum=3)
    if loss < math.log(2) / 2:
        return "solved"
    return "partial" if loss < math.sqrt(math.log(2) * math.log(vocab_size)) else "chance"


def outcomes(losses, vocab_size: int, confidence: float = 0.95) -> dict:
    """For each of :data:`OUTCOMES`: the count, the fraction and its Wilson interval over the runs."""
    labels = [outcome_of(float(loss), vocab_size) for loss in losses]
    n = len(labels)
    check_int("number of runs", n)
    result = {}
    for name in OUTCOMES:
        k = labels.count(name)
        low, high = wilson_interval(k, n, confidence)
        result[name] = dict(count=k, fraction=k / n, low=low, high=high)
    return result


# ---------------------------------------------------------------------------------------------- on results tables
def outcome_table(table, by: str = "n_heads", loss: str = "val_loss", vocab_size: int = 4,
                  confidence: float = 0.95):
    """Per value of ``by`` in a results table (one row per run): the number of runs, the fraction of each outcome
    with its Wilson interval, and the mean loss with its bootstrap interval. A pandas DataFrame indexed by ``by``,
    with columns ``runs``, ``<outcome>`` / ``<outcome>_low`` / ``<outcome>_high`` for each of :data:`OUTCOMES`, and
    ``loss_mean`` / ``loss_low`` / ``loss_high``."""
    import pandas as pd

    rows = {}
    for level, group in table.groupby(by):
        losses = group[loss].to_numpy(dtype=float)
        row = {"runs": len(losses)}
        for name, values in outcomes(losses, vocab_size, confidence).items():
            row.update({name: values["fraction"], f"{name}_low": values["low"], f"{name}_high": values["high"]})
        interval = bootstrap_mean_interval(losses, confidence) if len(losses) > 1 else dict(
            mean=float(losses[0]), low=float("nan"), high=float("nan"))
        row.update(loss_mean=interval["mean"], loss_low=interval["low"], loss_high=interval["high"])
        rows[level] = row
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis(by)


def paired_table(table, by: str, reference, metric: str = "val_loss", pair_on: str = "seed",
                 confidence: float = 0.95):
    """Each value of ``by`` against ``reference`` (chosen before looking at the data), paired on ``pair_on``: the
    mean of ``metric(level) - metric(reference)`` over the pairs, its bootstrap interval, the sign-flip p-value and
    whether the difference is real (the interval excludes 0). A DataFrame indexed by the levels other than
    ``reference``; only pairs present at both levels count (``pairs`` says how many)."""
    import pandas as pd

    wide = table.pivot(index=pair_on, columns=by, values=metric)
    if reference not in wide.columns:
        raise ValueError(f"reference {reference!r} is not a value of {by!r}; the values are {list(wide.columns)}")
    rows = {}
    for level in wide.columns:
        if level == reference:
            continue
        both = wide[[level, reference]].dropna()
        result = paired_difference(both[level], both[reference], confidence)
        rows[level] = dict(pairs=result["n"], diff=result["mean"], low=result["low"], high=result["high"],
                           p_value=result["p_value"], real=result["real"])
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis(by)
