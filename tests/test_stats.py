"""mha.experiments.stats against independent computations: the Wilson interval's defining equation solved by
bisection, the bootstrap's coverage by simulation, the permutation p-value by counting sign patterns by hand, the
unpaired bootstrap interval against Welch's normal interval, and the unpaired permutation p-value by listing the
splits in plain Python."""

import itertools
import math
from fractions import Fraction
from statistics import NormalDist

import numpy as np
import pytest

from mha.experiments.stats import (bootstrap_mean_interval, outcome_of, outcome_table, outcomes, paired_difference,
                                   paired_table, separated, unpaired_difference, wilson_interval)

Z95 = 1.959963984540054


def wilson_by_bisection(k, n, z=Z95):
    """The endpoints are the p with (k/n - p)^2 = z^2 p (1 - p) / n: solve on each side of k/n by bisection."""
    phat = k / n

    def f(p):
        return (phat - p) ** 2 - z * z * p * (1 - p) / n

    def root(lo, hi):
        for _ in range(200):
            mid = (lo + hi) / 2
            if (f(lo) > 0) == (f(mid) > 0):
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    low = 0.0 if k == 0 else root(0.0, phat)
    high = 1.0 if k == n else root(phat, 1.0)
    return low, high


@pytest.mark.parametrize("k, n", [(0, 10), (8, 10), (20, 20), (3, 20), (11, 20), (1, 1)])
def test_wilson_solves_its_defining_equation(k, n):
    np.testing.assert_allclose(wilson_interval(k, n), wilson_by_bisection(k, n), atol=1e-9)


def test_wilson_known_values_and_errors():
    np.testing.assert_allclose(wilson_interval(8, 10), (0.4902, 0.9433), atol=1e-4)  # the textbook example
    with pytest.raises(ValueError, match=r"k must be an integer in \[0, 10\]"):
        wilson_interval(11, 10)
    with pytest.raises(TypeError, match="n must be an integer"):
        wilson_interval(1, 2.0)


def test_bootstrap_interval_covers_the_true_mean_about_95_percent_of_the_time():
    rng = np.random.default_rng(1)
    hits = 0
    for trial in range(300):
        sample = rng.normal(loc=2.0, scale=1.0, size=20)
        interval = bootstrap_mean_interval(sample, n_boot=2000, seed=trial)
        assert interval["low"] <= interval["mean"] <= interval["high"]
        hits += interval["low"] <= 2.0 <= interval["high"]
    assert 0.88 <= hits / 300 <= 0.99  # the percentile bootstrap undercovers a little at n = 20


def test_paired_difference_p_value_counts_sign_patterns():
    d = np.array([0.3, 0.1, 0.2, 0.4, 0.25])
    result = paired_difference(d + 1.0, np.ones(5))
    assert result["p_value"] == pytest.approx(2 / 32)  # only all-plus and all-minus are as extreme, of 2^5
    assert result["real"] and result["low"] > 0 and result["mean"] == pytest.approx(d.mean())
    mixed = paired_difference([1.0, 2.0, 3.0, 4.0], [1.5, 1.5, 3.5, 3.5])  # d = -0.5, 0.5, -0.5, 0.5
    assert not mixed["real"] and mixed["p_value"] == 1.0
    with pytest.raises(ValueError, match="pair one to one"):
        paired_difference([1, 2, 3], [1, 2])


def test_outcomes_and_separation():
    ln2, ln4 = math.log(2), math.log(4)
    assert [outcome_of(x, 4) for x in (0.001, 0.3, 0.69, 0.837, 1.2, 1.386)] == [
        "solved", "solved", "partial", "partial", "chance", "chance"]
    table = outcomes([0.0, ln2, ln4, ln4], 4)
    assert table["chance"]["count"] == 2 and table["chance"]["fraction"] == 0.5
    assert (table["solved"]["low"], table["solved"]["high"]) == pytest.approx(wilson_interval(1, 4))
    assert separated((0.1, 0.2), (0.3, 0.4)) and not separated((0.1, 0.35), (0.3, 0.4))


def test_tables_on_a_small_results_table():
    import pandas as pd

    ln2, ln4 = math.log(2), math.log(4)
    table = pd.DataFrame({"n_heads": [1, 1, 1, 1, 4, 4, 4, 4], "seed": [0, 1, 2, 3] * 2,
                          "val_loss": [ln4, ln4, ln2, ln4, 0.01, ln2, 0.02, 0.0]})
    out = outcome_table(table)
    assert out.loc[1, "runs"] == 4 and out.loc[1, "chance"] == 0.75 and out.loc[4, "solved"] == 0.75
    assert (out.loc[4, "solved_low"], out.loc[4, "solved_high"]) == pytest.approx(wilson_interval(3, 4))
    assert out.loc[1, "loss_mean"] == pytest.approx((3 * ln4 + ln2) / 4)
    paired = paired_table(table, "n_heads", reference=1)
    d = table.val_loss[4:].to_numpy() - table.val_loss[:4].to_numpy()
    assert paired.loc[4, "pairs"] == 4 and paired.loc[4, "diff"] == pytest.approx(d.mean())
    assert paired.loc[4, "p_value"] == pytest.approx(2 / 16)  # every difference negative: 2 of 2^4 patterns
    with pytest.raises(ValueError, match="reference 2 is not a value"):
        paired_table(table, "n_heads", reference=2)


def _split_p_by_hand(a, b):
    """Count, with exact fractions, the splits of the pooled values into groups of len(a) and len(b) whose
    difference of means is at least the observed one in absolute value."""
    pooled = list(a) + list(b)
    observed = abs(Fraction(sum(a)) / len(a) - Fraction(sum(b)) / len(b))
    hits = total = 0
    for group in itertools.combinations(range(len(pooled)), len(a)):
        inside = [pooled[i] for i in group]
        outside = [pooled[i] for i in range(len(pooled)) if i not in group]
        total += 1
        hits += abs(Fraction(sum(inside)) / len(a) - Fraction(sum(outside)) / len(b)) >= observed
    return hits / total


def test_unpaired_difference_p_value_lists_every_split():
    result = unpaired_difference([1.0, 2.0, 3.0], [10.0, 11.0, 12.0, 13.0])
    assert result["p_value"] == pytest.approx(1 / 35)  # only the observed split of C(7, 3) = 35 is as extreme
    assert result["mean"] == pytest.approx(2.0 - 11.5) and result["real"] and result["high"] < 0
    assert (result["n_a"], result["n_b"]) == (3, 4)
    a, b = [1.0, 4.0, 2.5, 3.5], [3.0, 0.5, 2.0, 5.0, 1.5]  # overlapping groups, one tie in the sums
    assert unpaired_difference(a, b)["p_value"] == pytest.approx(_split_p_by_hand(a, b))
    same = unpaired_difference([1.0, 2.0, 3.0], [3.0, 2.0, 1.0])
    assert same["mean"] == 0 and same["p_value"] == 1.0 and not same["real"]
    with pytest.raises(ValueError, match="at least two"):
        unpaired_difference([1.0], [1.0, 2.0])


def test_unpaired_interval_matches_welch_for_large_groups():
    rng = np.random.default_rng(3)
    a, b = rng.normal(1.0, 2.0, size=120), rng.normal(0.5, 1.0, size=100)
    result = unpaired_difference(a, b, n_boot=20_000)
    se = math.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size)  # Welch's standard error
    d = a.mean() - b.mean()
    assert result["mean"] == pytest.approx(d)
    np.testing.assert_allclose([result["low"], result["high"]], [d - Z95 * se, d + Z95 * se], atol=0.06 * se)
    # The p-value from 100,000 random splits (C(220, 120) are far too many to list) against the normal
    # approximation of the split distribution: mean 0, variance s^2 (1/n_a + 1/n_b), s^2 the pooled values' variance.
    pooled = np.concatenate([a, b])
    sd = math.sqrt(pooled.var(ddof=1) * (1 / a.size + 1 / b.size))
    assert result["p_value"] == pytest.approx(2 * (1 - NormalDist().cdf(abs(d) / sd)), abs=0.01)


def test_unpaired_interval_covers_the_true_difference_about_95_percent_of_the_time():
    rng = np.random.default_rng(2)
    hits = 0
    for trial in range(300):
        a, b = rng.normal(0.5, 1.0, size=9), rng.normal(0.0, 1.0, size=8)
        result = unpaired_difference(a, b, n_boot=2000, seed=trial)
        assert result["low"] <= result["mean"] <= result["high"]
        hits += result["low"] <= 0.5 <= result["high"]
    assert 0.85 <= hits / 300 <= 0.99  # the percentile bootstrap undercovers a little at these sizes
