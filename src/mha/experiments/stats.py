"""Uncertainty for the experiments' claims: intervals on proportions, means and paired differences over seeds.

Book: part III, every chapter (an ordering or a difference is stated only where its interval says so).

* :func:`wilson_interval` — the Wilson score interval of a proportion (k successes in n runs), which stays inside
  [0, 1] and behaves at k = 0 and k = n, where the normal approximation gives an empty or a negative interval.
* :func:`paired_difference` — the mean of a paired difference (the same seeds under two settings), the exact
  sign-flip permutation test with the interval that inverts it (up to 14 pairs; the paired t test above), so the
  interval and the test never disagree; a difference is called real only when the test rejects.
* :func:`unpaired_difference` — the same for two independent groups of runs (different seeds, or different
  programs): the difference of the means, Welch's t interval, and the permutation p-value over all ways of
  splitting the pooled runs into groups of the same sizes; real only when both tests reject.
* :func:`outcomes` — the three plateaus of the two-offset task (solved, half solved, chance) and their frequencies.
* :func:`separated` — whether two intervals are disjoint (the only case where the book states an ordering).
* :func:`outcome_table` and :func:`paired_table` — the same, for a results table grouped by one setting.

What the chapters read off those results, each rule stated once:

* :func:`mean_interval` — the mean over seeds with Student's t interval; :func:`paired_interval` —
  :func:`paired_difference`; both also accept a single run (the mean, with no interval: NaN bounds), as a partial
  sweep may leave.
* :func:`verdict` — the word a difference earns: one word when its interval lies above 0, another below 0, a third
  when it contains 0; :func:`holm_verdict` — the same from a :func:`paired_table` row's Holm-adjusted test.
  :func:`flip_distance` — how far a rerun would have to move the difference to change that word.
* :func:`separated_pairs` — which pairs of levels have disjoint intervals (an ordering is stated) and which overlap.
* :func:`outcome_orderings` — for pairs of head counts in an :func:`outcome_table`, which of the fraction solved, the
  fraction at chance and the mean loss separate, and which head count each favours.
* :func:`left_chance` — how many two-offset runs left the chance plateau and how many solved the task, with Wilson
  intervals.
* :func:`rank_correlation` — Spearman's rank correlation (the correlation of the ranks, ties given their mean rank).
* :func:`against_range` — where an interval lies against a range quoted from a paper: above, below, inside or
  overlapping it.
* :func:`newcombe_interval` — an interval for the difference of two proportions from their Wilson intervals.
* :func:`best_rate_comparison` — each setting at its own best learning rate: the rate chosen on one block of seeds,
  the fraction solved at it on another, Wilson intervals and Fisher's exact test for every pair, Holm-corrected.

Families of tests on the same seeds (book part IV): :func:`max_t_adjusted`, Westfall-Young max-T adjusted p-values
(single-step or step-down), and :func:`holm_adjusted`, Holm's adjustment of raw p-values.

Intervals and tests come from ``scipy.stats`` where it has them (t, Welch, Fisher); the sign-flip and split
permutation tests are enumerated here because scipy's ``permutation_test`` gives no interval.
"""

from __future__ import annotations

import itertools
import math
import numbers
import warnings
from collections.abc import Mapping
from statistics import NormalDist

import numpy as np

from mha._checks import check_float, check_int, check_type

__all__ = ["wilson_interval", "paired_difference", "EXACT_MAX_PAIRS", "unpaired_difference", "separated",
           "outcomes",
           "OUTCOMES", "outcome_of", "outcome_table", "paired_table",
           "mean_interval", "paired_interval", "verdict", "flip_distance", "separated_pairs", "ORDER_MEASURES",
           "outcome_orderings", "left_chance", "rank_correlation", "against_range", "best_rate_comparison",
           "best_rate_paired", "median_interval",
           "newcombe_interval", "sign_flip_p_range", "max_t_adjusted", "holm_adjusted", "holm_verdict"]

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


def _t_test(x: np.ndarray, alpha: float) -> tuple[float, float, float]:
    """Student's t test of "mean 0" for ``x`` (n >= 2) and its interval, mean -+ t_{1 - alpha/2, n-1} s / sqrt(n),
    from one ``scipy.stats.ttest_1samp``: ``(low, high, p)``. All values equal: the interval is that value (zero
    width) and p is 1 if it is 0, else 0."""
    from scipy import stats as scipy_stats

    if np.all(x == x[0]):
        return float(x[0]), float(x[0]), 1.0 if x[0] == 0 else 0.0
    test = scipy_stats.ttest_1samp(x, 0.0)
    ci = test.confidence_interval(1 - alpha)
    return float(ci.low), float(ci.high), float(test.pvalue)


def _alpha(confidence) -> float:
    return 1 - check_float("confidence", confidence, minimum=0.0, maximum=1.0, min_inclusive=False,
                           max_inclusive=False)


EXACT_MAX_PAIRS = 14
"""Up to this many pairs :func:`paired_difference` enumerates every sign pattern (2^14 = 16,384); above it, the
paired t test and its interval, which the central limit theorem makes adequate at that size."""


def paired_difference(a, b, confidence: float = 0.95) -> dict:
    """``a - b`` paired by seed (``a[i]`` and ``b[i]`` share seed i): the mean difference, a test of "no
    difference" and the interval that inverts it, so that the two never disagree; ``real`` = the test rejects at
    ``1 - confidence`` (equivalently, the interval excludes 0).

    With 2 to :data:`EXACT_MAX_PAIRS` pairs: the exact sign-flip permutation test (all 2^n sign patterns) and the
    interval of every shift it does not reject, which covers the true mean difference at least ``confidence`` of
    the time whenever the differences are symmetric about it, at any n. The smallest p-value is 2 / 2^n, so with 5
    pairs or fewer nothing is resolved at 95% and the interval is the whole line (infinite ends): run more seeds.
    With more pairs: the paired t test (``scipy.stats.ttest_1samp``) and its t interval.

    Returns ``dict(mean, low, high, n, p_value, real, method)``, ``method`` naming the test ("exact sign-flip" or
    "t"). A percentile bootstrap over five or six seeds, which this function replaced, covers noticeably less
    than it says (about 83% for a nominal 95% at n = 5).
    """
    x, y = _values(a, "a"), _values(b, "b")
    if x.shape != y.shape:
        raise ValueError(f"a and b must pair one to one (the same seeds), got {x.size} and {y.size} values")
    d = x - y
    alpha = _alpha(confidence)
    if d.size <= EXACT_MAX_PAIRS:
        return _sign_flip_exact(d, alpha)
    low, high, p = _t_test(d, alpha)
    return dict(mean=float(d.mean()), low=low, high=high, n=int(d.size), p_value=p, real=bool(p <= alpha),
                method="t")


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


def unpaired_difference(a, b, confidence: float = 0.95) -> dict:
    """``mean(a) - mean(b)`` for two independent groups of runs (nothing pairs ``a[i]`` with ``b[i]``; the groups
    may differ in size, at least two runs each): the difference, Welch's t interval (unequal variances;
    ``scipy.stats.ttest_ind(..., equal_var=False)``) and its p-value, and the exact permutation p-value over the
    splits of the pooled runs (:func:`_split_p`). ``real`` only when both tests reject at ``1 - confidence``: a
    difference the interval resolves but the distribution-free test does not (or the reverse) is not called.

    Returns ``dict(mean, low, high, n_a, n_b, p_value, p_welch, real, method)``; ``p_value`` is the permutation
    test's."""
    from scipy import stats as scipy_stats

    x, y = _values(a, "a"), _values(b, "b")
    alpha = _alpha(confidence)
    diff = float(x.mean() - y.mean())
    constant_x, constant_y = np.all(x == x[0]), np.all(y == y[0])
    if constant_x and constant_y:  # no spread in either group: the difference is what it is
        low = high = diff
        p_welch = 1.0 if diff == 0 else 0.0
    else:
        with warnings.catch_warnings():
            if constant_x or constant_y:  # one group exactly constant: its variance 0 is exact, and
                # scipy's "precision loss ... nearly identical" warning about that group does not apply
                warnings.filterwarnings("ignore", message="Precision loss occurred in moment calculation",
                                        category=RuntimeWarning)
            test = scipy_stats.ttest_ind(x, y, equal_var=False)
            ci = test.confidence_interval(1 - alpha)
        low, high, p_welch = float(ci.low), float(ci.high), float(test.pvalue)
    p_perm = _split_p(x, y)
    return dict(mean=diff, low=low, high=high, n_a=int(x.size), n_b=int(y.size), p_value=p_perm, p_welch=p_welch,
                real=bool(p_perm <= alpha and p_welch <= alpha), method="Welch t and permutation")


def separated(first: tuple[float, float], second: tuple[float, float]) -> bool:
    """True when the intervals (low, high) do not overlap."""
    return first[1] < second[0] or second[1] < first[0]


def outcome_of(loss: float, vocab_size: int) -> str:
    """'solved', 'partial' or 'chance' for a final two-offset loss, by the plateaus 0, ln 2 and ln(vocab_size): solved
    below ln 2 / 2 (halfway between 0 and ln 2), chance from sqrt(ln 2 ln V) (halfway between ln 2 and ln V on a log
    scale), partial between."""
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
    with its Wilson interval, and the mean loss with its t interval. A pandas DataFrame indexed by ``by``,
    with columns ``runs``, ``<outcome>`` / ``<outcome>_low`` / ``<outcome>_high`` for each of :data:`OUTCOMES`, and
    ``loss_mean`` / ``loss_low`` / ``loss_high``."""
    import pandas as pd

    rows = {}
    for level, group in table.groupby(by):
        losses = group[loss].to_numpy(dtype=float)
        row = {"runs": len(losses)}
        for name, values in outcomes(losses, vocab_size, confidence).items():
            row.update({name: values["fraction"], f"{name}_low": values["low"], f"{name}_high": values["high"]})
        interval = mean_interval(losses, confidence)
        row.update(loss_mean=interval["mean"], loss_low=interval["low"], loss_high=interval["high"])
        rows[level] = row
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis(by)


def paired_table(table, by: str, reference, metric: str = "val_loss", pair_on: str = "seed",
                 confidence: float = 0.95):
    """Each value of ``by`` against ``reference`` (chosen before looking at the data), paired on ``pair_on``: the
    mean of ``metric(level) - metric(reference)`` over the pairs, its interval and p-value from
    :func:`paired_difference`, and whether the difference is real (the test rejects; the interval excludes 0);
    ``p_holm`` and ``real_holm``: the p-values Holm-adjusted over the table's rows (:func:`holm_adjusted`; the rows
    are a family of tests against one reference), and whether the adjusted test rejects (:func:`holm_verdict` reads
    them). A DataFrame indexed by the levels other than ``reference``; only pairs present at both levels count
    (``pairs`` says how many)."""
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
    out = pd.DataFrame.from_dict(rows, orient="index").rename_axis(by)
    if len(out):  # the table is a family of tests against one reference: Holm over its rows
        out["p_holm"] = holm_adjusted(out["p_value"].to_numpy(dtype=float))
        out["real_holm"] = out["p_holm"] <= 1 - confidence
    return out


# ------------------------------------------------------------------------------------- what the chapters read off
def _numbers(values, name: str) -> np.ndarray:
    """``values`` (a list, an array, a pandas Series) as a flat float array; TypeError for anything else."""
    if isinstance(values, (str, bytes, Mapping)) or np.ndim(values) == 0:
        raise TypeError(f"{name} must be a sequence of real numbers, got {type(values).__name__}")
    try:
        return np.asarray(values, dtype=float).ravel()
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a sequence of real numbers, got {type(values).__name__} that does not "
                        f"convert to floats") from None


def mean_interval(values, confidence: float = 0.95) -> dict:
    """The mean of ``values`` (one per run or seed) with Student's t interval (``scipy.stats.ttest_1samp``), exact
    for normal values at any n, where there are two values or more. One value has no interval: its mean and NaN
    bounds (no values: NaN throughout). ``dict(mean, low, high, n)`` either way, so that a chapter prints what a
    partial sweep has so far."""
    x = _numbers(values, "values")
    alpha = _alpha(confidence)
    if x.size < 2:
        if not np.all(np.isfinite(x)):
            raise ValueError(f"values must be finite numbers, got {x}")
        return dict(mean=float(x[0]) if x.size else math.nan, low=math.nan, high=math.nan, n=int(x.size))
    x = _values(x)
    low, high, _ = _t_test(x, alpha)
    return dict(mean=float(x.mean()), low=low, high=high, n=int(x.size))


def paired_interval(a, b, confidence: float = 0.95) -> dict:
    """``a - b`` paired one to one (the same run, or the same seed), as :func:`paired_difference` gives it, where
    there are two pairs or more. One pair has no interval: its difference, NaN bounds and p-value, and
    ``real=False`` (no pairs: NaN throughout). ``dict(mean, low, high, n, p_value, real, method)`` either way."""
    x, y = _numbers(a, "a"), _numbers(b, "b")
    if x.shape != y.shape:
        raise ValueError(f"a and b must pair one to one (the same runs or seeds), got {x.size} and {y.size} values")
    _alpha(confidence)
    if x.size < 2:
        d = x - y
        if not np.all(np.isfinite(d)):
            raise ValueError(f"a and b must be finite numbers, got {x} and {y}")
        return dict(mean=float(d[0]) if d.size else math.nan, low=math.nan, high=math.nan, n=int(d.size),
                    p_value=math.nan, real=False, method="none")
    return paired_difference(x, y, confidence)


def _ends(result, name: str = "result"):
    """``(result["low"], result["high"])``: the ends of an interval from this module (a dict, or a row of
    :func:`paired_table` or :func:`outcome_table`)."""
    try:
        low, high = result["low"], result["high"]
    except (KeyError, TypeError, IndexError):
        raise TypeError(f"{name} must hold an interval under 'low' and 'high' (a dict from this module or a row of "
                        f"one of its tables), got {type(result).__name__}") from None
    return low, high


def _check_real(name: str, value):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} of type {type(value).__name__}")
    return value


def verdict(result, above: str, below: str, neither: str = "not distinguishable from") -> str:
    """The word a difference earns from its interval: ``above`` when the whole interval is above 0, ``below`` when
    it is below 0, and ``neither`` when it contains 0 (or is NaN: no interval). A difference is called real only when
    its interval excludes 0, so ``above`` and ``below`` are the words of a real difference; ``result`` is a dict from
    :func:`paired_difference` / :func:`paired_interval` or a row of :func:`paired_table`."""
    low, high = _ends(result)
    _check_real("result['low']", low)
    _check_real("result['high']", high)
    for name, word in (("above", above), ("below", below), ("neither", neither)):
        check_type(name, word, str, "a string (the word to print)")
    return above if low > 0 else below if high < 0 else neither


def holm_verdict(row, above: str, below: str, neither: str = "not resolved") -> str:
    """The word a row of :func:`paired_table` earns from its Holm-adjusted test: ``above`` when ``real_holm`` and the
    difference is positive, ``below`` when ``real_holm`` and it is negative, ``neither`` otherwise. ValueError if the
    row claims an adjusted rejection its raw test does not make (an adjusted p is never below the raw one)."""
    try:
        diff, real, real_holm = row["diff"], row["real"], row["real_holm"]
    except (KeyError, TypeError, IndexError):
        raise TypeError(f"row must be a row of paired_table (with 'diff', 'real' and 'real_holm'), got "
                        f"{type(row).__name__}") from None
    _check_real("row['diff']", diff)
    for name, word in (("above", above), ("below", below), ("neither", neither)):
        check_type(name, word, str, "a string (the word to print)")
    if real_holm and not real:
        raise ValueError(f"row has real_holm=True but real=False: an adjusted p cannot be below the raw p ({row!r})")
    return (above if diff > 0 else below) if real_holm else neither


def flip_distance(result):
    """How far a difference would have to move for its :func:`verdict` to change: the distance from 0 of the
    interval's end nearest to it, ``min(|low|, |high|)``. For a table with ``low`` and ``high`` columns (from
    :func:`paired_table`), one distance per row, as a pandas Series."""
    low, high = _ends(result)
    if np.ndim(low) == 0 and np.ndim(high) == 0:
        return float(min(abs(_check_real("result['low']", low)), abs(_check_real("result['high']", high))))
    return np.minimum(np.abs(low), np.abs(high))


def separated_pairs(intervals) -> tuple[list, list]:
    """The pairs ``(a, b)``, ``a < b``, of the levels of ``{level: (low, high)}`` (levels with a NaN or infinite
    end left out): first those whose intervals are disjoint (:func:`separated`; the book states an ordering only
    for them), then the others. Both lists in the order of the sorted levels."""
    check_type("intervals", intervals, Mapping, "a mapping {level: (low, high)}")
    for level, interval in intervals.items():
        if np.shape(interval) != (2,):
            raise ValueError(f"intervals[{level!r}] must be a pair (low, high), got {interval!r}")
    levels = sorted(level for level, interval in intervals.items() if np.all(np.isfinite(interval)))
    pairs = [(a, b) for i, a in enumerate(levels) for b in levels[i + 1:]]
    apart = [pair for pair in pairs if separated(intervals[pair[0]], intervals[pair[1]])]
    return apart, [pair for pair in pairs if pair not in apart]


ORDER_MEASURES = {"solved": ("solved", True), "chance": ("chance", False), "loss": ("loss_mean", False)}
"""The measures of an :func:`outcome_table` that can order two head counts: measure -> (the column holding its
value, True when higher is better). The interval of each is ``<measure>_low`` to ``<measure>_high``."""


def outcome_orderings(table, levels=None) -> dict:
    """What the intervals of an :func:`outcome_table` say about each pair ``(a, b)``, ``a < b``, of ``levels``
    (default: every level of the table): ``{(a, b): [(measure, better, worse), ...]}``, one entry per measure of
    :data:`ORDER_MEASURES` (in that order) whose intervals for ``a`` and ``b`` are disjoint, naming the level the
    measure favours (more solved, fewer at chance, a lower mean loss). An empty list: no measure separates the pair,
    and its order is unresolved."""
    if not (hasattr(table, "loc") and hasattr(table, "columns") and hasattr(table, "index")):
        raise TypeError(f"table must be a pandas DataFrame from outcome_table, got {type(table).__name__}")
    needed = [column for measure, (value, _) in ORDER_MEASURES.items()
              for column in (value, f"{measure}_low", f"{measure}_high")]
    missing = [column for column in needed if column not in table.columns]
    if missing:
        raise ValueError(f"table must have the columns of outcome_table; missing {missing}")
    levels = sorted(table.index) if levels is None else list(levels)
    absent = [level for level in levels if level not in table.index]
    if absent or len(levels) < 2:
        raise ValueError(f"levels must name at least two rows of table, got {levels} (not in the table: {absent}); "
                         f"its rows are {list(table.index)}")
    orderings = {}
    for a, b in itertools.combinations(levels, 2):
        said = []
        for measure, (value, higher_is_better) in ORDER_MEASURES.items():
            low, high = f"{measure}_low", f"{measure}_high"
            if separated((table.loc[a, low], table.loc[a, high]), (table.loc[b, low], table.loc[b, high])):
                a_better = (table.loc[a, value] > table.loc[b, value]) == higher_is_better
                said.append((measure, a, b) if a_better else (measure, b, a))
        orderings[(a, b)] = said
    return orderings


def left_chance(losses, vocab_size: int, confidence: float = 0.95) -> dict:
    """Of some two-offset runs (their final losses): how many left the chance plateau (ended solved or half solved,
    :func:`outcome_of`) and how many solved the task, with the Wilson interval of each fraction.
    ``dict(n, left, solved, left_iv, solved_iv)``, the intervals as ``(low, high)``."""
    x = _numbers(losses, "losses")
    result = outcomes(x, vocab_size, confidence)
    n = sum(value["count"] for value in result.values())
    left, solved = n - result["chance"]["count"], result["solved"]["count"]
    return dict(n=n, left=left, solved=solved, left_iv=wilson_interval(left, n, confidence),
                solved_iv=wilson_interval(solved, n, confidence))


def rank_correlation(a, b) -> float:
    """Spearman's rank correlation of ``a`` and ``b`` (paired one to one): the Pearson correlation of their ranks,
    tied values sharing their mean rank. NaN (with NumPy's warning) when one side is constant."""
    import pandas as pd

    x, y = _numbers(a, "a"), _numbers(b, "b")
    if x.shape != y.shape or x.size < 2:
        raise ValueError(f"a and b must pair one to one and hold at least two values each, got {x.size} and {y.size}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("a and b must be finite numbers (a NaN has no rank)")
    return float(np.corrcoef(pd.Series(x).rank(), pd.Series(y).rank())[0, 1])


def against_range(result, lower: float, upper: float) -> str:
    """Where an interval (``result["low"]`` to ``result["high"]``) lies against the range ``[lower, upper]``, e.g.
    a range quoted from a paper: 'above' or 'below' it (disjoint), 'inside' it, or 'overlapping' it."""
    low, high = _ends(result)
    low, high = _check_real("result['low']", low), _check_real("result['high']", high)
    lower, upper = check_float("lower", lower), check_float("upper", upper)
    if lower > upper:
        raise ValueError(f"lower must not exceed upper, got lower={lower} and upper={upper}")
    if low > upper:
        return "above"
    if high < lower:
        return "below"
    if low >= lower and high <= upper:
        return "inside"
    return "overlapping"


def _seed_blocks(runs, columns: set, select_seeds, compare_seeds):
    """The arguments of the best-rate plans, checked: ``runs`` has ``columns``, and the two blocks of seeds are
    non-empty and disjoint. Returns (the runs of the choosing seeds, the runs of the compared seeds, the choosing
    seeds as a set)."""
    missing = sorted(columns - set(getattr(runs, "columns", ())))
    if missing:
        raise ValueError(f"runs must be a results table with columns {sorted(columns)}, missing {missing}")
    select, compare = set(select_seeds), set(compare_seeds)
    if not select or not compare or select & compare:
        raise ValueError(f"select_seeds and compare_seeds must be two non-empty, disjoint sets of seeds, got "
                         f"{sorted(select)} and {sorted(compare)}")
    return runs[runs["seed"].isin(select)], runs[runs["seed"].isin(compare)], select


def best_rate_comparison(runs, select_seeds, compare_seeds, by: str = "n_heads", rate: str = "lr",
                         solved: str = "solved", loss: str = "val_loss", confidence: float = 0.95) -> dict:
    """Each level of ``by`` at its own best ``rate``, chosen on one block of seeds and compared on another.

    ``runs``: a results table with columns ``by``, ``rate``, ``seed``, ``solved`` (bool) and ``loss``. For each level
    of ``by``, its best rate is the one with the most runs solved among the seeds in ``select_seeds``, ties broken by
    the lower median ``loss``, then by the lower rate. At that rate, the runs with seeds in ``compare_seeds`` (which
    chose nothing) give the fraction solved and its Wilson interval; every pair of levels is tested with Fisher's
    exact test (``scipy.stats.fisher_exact``, two-sided) and the p-values are Holm-adjusted over the pairs
    (:func:`holm_adjusted`). The plan of ``experiments/head_count/head-count-lr.yaml``.

    Returns ``dict(best_rate={level: rate}, fraction={level: dict(k, n, fraction, low, high)},
    pairs={(a, b): dict(p, p_holm)})``. Book: part III, "Head count".
    """
    from scipy import stats as scipy_stats

    chosen, held_out, _ = _seed_blocks(runs, {by, rate, "seed", solved, loss}, select_seeds, compare_seeds)
    best, fraction = {}, {}
    for level, group in chosen.groupby(by):
        by_rate = group.groupby(rate).agg(k=(solved, "sum"), median=(loss, "median")).reset_index()
        by_rate = by_rate.sort_values(["k", "median", rate], ascending=[False, True, True])
        best[level] = float(by_rate[rate].iloc[0])
        at = held_out[(held_out[by] == level) & (held_out[rate] == best[level])]
        k, n = int(at[solved].sum()), len(at)
        low, high = wilson_interval(k, check_int(f"runs of {by} = {level} at its best rate", n), confidence)
        fraction[level] = dict(k=k, n=n, fraction=k / n, low=low, high=high)
    levels = sorted(fraction)
    raw = {(a, b): float(scipy_stats.fisher_exact([[fraction[a]["k"], fraction[a]["n"] - fraction[a]["k"]],
                                                    [fraction[b]["k"], fraction[b]["n"] - fraction[b]["k"]]]).pvalue)
           for a, b in itertools.combinations(levels, 2)}
    adjusted = holm_adjusted(list(raw.values())) if raw else []
    pairs = {pair: dict(p=p, p_holm=float(q)) for (pair, p), q in zip(raw.items(), adjusted)}
    return dict(best_rate=best, fraction=fraction, pairs=pairs)


def best_rate_paired(runs, select_seeds, compare_seeds, by: str = "n_heads", rate: str = "lr",
                     loss: str = "val_loss", confidence: float = 0.95) -> dict:
    """:func:`best_rate_comparison` for a task without plateaus: each level of ``by`` at its own best ``rate``, the
    one with the lowest mean ``loss`` over the seeds in ``select_seeds`` (ties: the lower rate), and every pair of
    levels compared at their best rates on ``compare_seeds``, which chose nothing, paired by seed
    (:func:`paired_difference`: the exact sign-flip test up to :data:`EXACT_MAX_PAIRS` pairs), Holm-adjusted over the
    pairs. The plan of ``experiments/head_count/head-count-shakespeare-lr.yaml``.

    Returns ``dict(best_rate={level: rate}, choose=DataFrame (levels x rates: the mean loss on select_seeds),
    wide=DataFrame (compare_seeds x levels: the loss at the level's best rate), pairs={(a, b): paired_difference of
    a minus b, with p_holm and real_holm})``. Every (level, rate) needs a run for every choosing seed, and every level
    a run at its best rate for every compared seed (ValueError naming the missing ones otherwise).
    Book: part III, "Head count".
    """
    chosen, held_out, select = _seed_blocks(runs, {by, rate, "seed", loss}, select_seeds, compare_seeds)
    counts = chosen.groupby([by, rate])["seed"].nunique()
    if (counts != len(select)).any():
        short = [cell for cell, n in counts.items() if n != len(select)]
        raise ValueError(f"runs must hold every choosing seed at every ({by}, {rate}) it has, got fewer at "
                         f"{short[:5]}{' ...' if len(short) > 5 else ''} (of {len(select)} seeds)")
    choose = chosen.groupby([by, rate])[loss].mean().unstack()  # (levels, rates)
    if choose.isna().any().any():
        raise ValueError(f"runs must hold every {rate} for every {by} on the choosing seeds, got gaps in\n{choose}")
    best = {level: float(row.sort_index().idxmin()) for level, row in choose.iterrows()}  # ties: the lower rate
    held_out = held_out[held_out[rate] == held_out[by].map(best)]
    wide = held_out.pivot(index="seed", columns=by, values=loss).reindex(index=sorted(set(compare_seeds)),
                                                                         columns=sorted(best))
    if wide.isna().any().any():
        gaps = [(level, seed) for level in wide.columns for seed in wide.index[wide[level].isna()]]
        raise ValueError(f"runs lacks the run at the best rate of ({by}, seed) = {gaps[:5]}"
                         f"{' ...' if len(gaps) > 5 else ''}")
    pairs = {(a, b): paired_difference(wide[a], wide[b], confidence)
             for a, b in itertools.combinations(wide.columns, 2)}
    for pair, q in zip(pairs, holm_adjusted([r["p_value"] for r in pairs.values()])):
        pairs[pair].update(p_holm=float(q), real_holm=bool(q <= 1 - confidence))
    return dict(best_rate=best, choose=choose, wide=wide, pairs=pairs)


def newcombe_interval(k1: int, n1: int, k2: int, n2: int, confidence: float = 0.95) -> tuple[float, float, float]:
    """The difference k1/n1 - k2/n2 of two independent proportions with Newcombe's hybrid score interval (his method
    10, Statistics in Medicine 1998): from the Wilson intervals (l1, u1) and (l2, u2) of the two proportions,
    ``d - sqrt((p1 - l1)^2 + (u2 - p2)^2)`` to ``d + sqrt((u1 - p1)^2 + (p2 - l2)^2)``. Unlike the Wald interval it
    stays inside [-1, 1] and behaves at 0 and n. Returns (difference, low, high). Book: part III, "Head count"."""
    p1, p2 = k1 / check_int("n1", n1), k2 / check_int("n2", n2)
    l1, u1 = wilson_interval(k1, n1, confidence)
    l2, u2 = wilson_interval(k2, n2, confidence)
    d = p1 - p2
    return d, d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)


# ---------------------------------------------------------------------------------------- the exact sign-flip test
def _sign_flip_exact(d: np.ndarray, alpha: float) -> dict:
    """The exact sign-flip test of the paired differences ``d`` and the interval that inverts it (2 <= n <= 14).

    The test: under "each pair's difference is as likely to have either sign", all 2^n sign patterns of the n
    differences are equally likely; the p-value is the fraction of patterns whose mean is at least as far from 0 as
    the observed one. The interval: the shifts delta for which the same test of the differences d_i - delta gives
    p > alpha, computed exactly (the p-value changes only where some pattern's |mean| crosses the observed one: at
    finitely many delta, all tried). These shifts form an interval around the mean: as delta moves away from
    mean(d), the observed |mean| grows with slope 1 and no pattern's grows faster, so p(delta) only falls. Its
    coverage is at least 1 - alpha whenever the differences are symmetric about their mean, at any n, and it
    excludes 0 exactly when p <= alpha, so the interval and the test never disagree. The smallest p-value is
    2 / 2^n: with n <= 5 pairs nothing is ever resolved at 95% and the interval is the whole line (infinite ends).
    """
    n = d.size
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))  # (2^n, n)
    flipped, counts = signs @ d, signs.sum(axis=1)  # (2^n,): s . d and sum(s) for each pattern s
    total = d.sum()

    tolerance = 1e-12 * (1 + np.abs(d).sum())

    def p_value(delta):  # delta: (K,) shifts -> (K,) p-values of the test of d - delta
        out = np.empty(delta.size)
        for start in range(0, delta.size, 256):  # blocks of shifts: at most 256 x 2^n numbers at a time
            part = delta[start:start + 256]
            observed = np.abs(total - n * part)  # (k,)
            pattern = np.abs(flipped[None, :] - part[:, None] * counts[None, :])  # (k, 2^n)
            out[start:start + 256] = np.mean(pattern >= observed[:, None] - tolerance, axis=1)
        return out

    p_observed = float(p_value(np.zeros(1))[0])
    # s . (d - delta) = +-(sum(d) - n delta) where |pattern| crosses |observed|: delta = (total -+ s.d) / (n -+ sum s)
    with np.errstate(divide="ignore", invalid="ignore"):
        cuts = np.concatenate([(total - flipped) / (n - counts), (total + flipped) / (n + counts)])
    cuts = np.unique(cuts[np.isfinite(cuts)])  # (K,) sorted
    inside = np.concatenate([[cuts[0] - 1.0], (cuts[:-1] + cuts[1:]) / 2, [cuts[-1] + 1.0]])  # one delta per piece
    accepted_piece = p_value(inside) > alpha  # (K + 1,)
    accepted_cut = p_value(cuts) > alpha  # (K,)
    if accepted_piece[0] or accepted_piece[-1]:  # the test never rejects far out (2 / 2^n > alpha): unbounded
        low, high = -math.inf, math.inf
    else:
        ends = np.concatenate([cuts[accepted_cut], cuts[np.flatnonzero(accepted_piece) - 1],
                               cuts[np.flatnonzero(accepted_piece)]])
        low, high = float(ends.min()), float(ends.max())
    return dict(mean=float(d.mean()), low=low, high=high, n=n, p_value=p_observed,
                real=bool(p_observed <= alpha), method="exact sign-flip")


def sign_flip_p_range(d, move: float) -> tuple[float, float]:
    """How low and how high the exact sign-flip p-value of the paired differences ``d`` could go if each run moved by
    up to ``move`` (in the units of ``d``); at ``move = 0`` both ends are the test's p-value (``paired_difference``).

    Each difference then moves by up to ``2 move``, so each sign pattern's ``|s . d|`` and the observed ``|sum d|``
    move by up to ``2 n move`` each: a pattern surely counts (``|s . d| >= |sum d|``) beyond a margin of twice that,
    and surely does not below it. The observed pattern and its negation always count. A bound, not the exact range:
    the true p-values of the moved differences lie inside it. 2 <= n <= :data:`EXACT_MAX_PAIRS`.
    """
    d = _values(d, "d")
    if not 2 <= d.size <= EXACT_MAX_PAIRS:
        raise ValueError(f"d: the exact test takes 2 to {EXACT_MAX_PAIRS} differences, got {d.size}")
    move = float(_check_real("move", move))
    if not move >= 0:
        raise ValueError(f"move must be >= 0, got {move}")
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=d.size)))  # (2^n, n)
    pattern, observed = np.abs(signs @ d), abs(d.sum())
    slack, tolerance = 4 * d.size * move, 1e-12 * (1 + np.abs(d).sum())
    always = np.all(signs == signs[0], axis=1) | np.all(signs == -signs[0], axis=1)  # the observed pattern, negated
    low = float(np.mean((pattern >= observed + slack - tolerance) | always))
    high = float(np.mean(pattern >= observed - slack - tolerance))
    return low, high


# ------------------------------------------------------------------------------- families of tests on the same seeds
def max_t_adjusted(diffs: dict, step_down: bool = False) -> dict:
    """Westfall-Young max-T adjusted p-values for a family of paired tests on the same seeds: single-step (the
    default) or step-down.

    ``diffs``: {name: the n paired differences, in the same seed order}. Every seed's sign is flipped jointly across
    the family (all 2^n patterns, exactly), so the correlation between the tests is kept; this needs the seeds'
    vectors of differences to be symmetric jointly (each seed's whole vector as likely as its negation), more than
    each test's own validity. Each test's statistic is |s . d| / ||d||, which orders the patterns as its own
    sign-flip test does (||d|| does not change with the signs) and puts the tests on one scale. A test's raw p is its
    own exact sign-flip p (:func:`paired_difference`'s).

    Single-step: a test's adjusted p is the fraction of patterns whose largest statistic over the whole family
    reaches the test's observed one. Step-down (``step_down=True``, Westfall and Young 1993, algorithm 2.8): order
    the tests by observed statistic, largest first; the j-th test's p is the fraction of patterns whose largest
    statistic over the tests from the j-th on (those with observed statistics no larger) reaches its observed one,
    and the adjusted p-values are then made non-decreasing down the order (each the largest so far). Both control
    the family-wise error rate under the same assumption; step-down is never larger than single-step, and equal for
    the test with the largest statistic.

    Returns {name: {"raw": p, "adjusted": p}}. Book: part IV, "Windows and sinks, measured".
    """
    names = list(diffs)
    sizes = {k: np.asarray(diffs[k]).size for k in names}
    if not names or len(set(sizes.values())) != 1:
        raise ValueError(f"diffs must map each test to the same number of paired differences (the same seeds), got "
                         f"sizes {sizes}")
    check_type("step_down", step_down, bool, "True or False")
    X = np.array([np.asarray(diffs[k], dtype=float).ravel() for k in names])  # (k, n)
    n = check_int("number of pairs", X.shape[1], minimum=2, maximum=EXACT_MAX_PAIRS)
    if not np.all(np.isfinite(X)):
        raise ValueError("diffs must hold finite numbers")
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))  # (2^n, n); the first row is the observed
    T = np.abs(signs @ X.T) / np.sqrt((X ** 2).sum(axis=1))  # (2^n, k)
    tol = 1e-12 * T.max()
    raw = (T >= T[0] - tol).mean(axis=0)
    if not step_down:
        adjusted = np.array([(T.max(axis=1) >= t - tol).mean() for t in T[0]])
    else:
        order = np.argsort(-T[0], kind="stable")  # largest observed statistic first
        # successive maxima over the tests from the j-th on: the running max taken from the end of the order
        tail_max = np.maximum.accumulate(T[:, order][:, ::-1], axis=1)[:, ::-1]  # (2^n, k)
        stepped = (tail_max >= T[0, order] - tol).mean(axis=0)  # (k,), in the order
        adjusted = np.empty(len(names))
        adjusted[order] = np.maximum.accumulate(stepped)  # monotone down the order
    return {k: {"raw": float(r), "adjusted": float(a)} for k, r, a in zip(names, raw, adjusted)}


def holm_adjusted(p_values):
    """Holm's step-down adjustment of raw p-values (Holm 1979): sort them, p_(1) <= ... <= p_(k); the j-th adjusted
    p is max over i <= j of min(1, (k - i + 1) p_(i)). It controls the family-wise error rate whatever the
    dependence between the tests, needing only each test's own validity.

    ``p_values``: a dict {name: raw p} (returns {name: adjusted p}) or a 1-D sequence (returns an array in the same
    order). Book: part IV, "Windows and sinks, measured".
    """
    keys = list(p_values) if isinstance(p_values, dict) else None
    p = np.asarray([p_values[k] for k in keys] if keys is not None else p_values, dtype=float)
    if p.ndim != 1 or p.size == 0:
        raise ValueError(f"p_values must be a non-empty dict or 1-D sequence of p-values, got shape {p.shape}")
    if not np.all((p >= 0) & (p <= 1)):
        raise ValueError(f"p_values must lie in [0, 1], got {p}")
    k = p.size
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, (k - np.arange(k)) * p[order])  # (k - i + 1) p_(i), i = 1..k
    adjusted = np.empty(k)
    adjusted[order] = np.maximum.accumulate(scaled)
    return dict(zip(keys, adjusted.tolist())) if keys is not None else adjusted


def median_interval(values, confidence: float = 0.95) -> dict:
    """A distribution-free interval for the median of ``values`` (independent draws of a continuous quantity): the
    order statistics x_(k) and x_(n-k+1) with the largest k such that the interval covers the median with probability
    at least ``confidence``; the number of values below the median is Binomial(n, 1/2), so the coverage is
    1 - 2 P(B <= k - 1) (e.g. the 2nd and 10th of 11 values: 98.8%). Returns ``dict(low, high, k, coverage, n)``.
    Book: appendix "Benchmarks" (the median of paired timing ratios)."""
    from scipy.stats import binom

    x = np.sort(_values(_numbers(values, "values")))  # TypeError for a non-sequence, ValueError for non-finite values
    n = x.size
    _alpha(confidence)
    k = 0
    while k + 1 <= n // 2 and 2 * binom.cdf(k, n, 0.5) <= 1 - confidence:
        k += 1
    if k == 0:
        smallest = next(m for m in itertools.count(1) if 2 * 0.5 ** m <= 1 - confidence)
        raise ValueError(f"values must hold at least {smallest} numbers for a {confidence:.0%} interval of the median, "
                         f"got {n}")
    return dict(low=float(x[k - 1]), high=float(x[n - k]), k=k, coverage=float(1 - 2 * binom.cdf(k - 1, n, 0.5)), n=n)
