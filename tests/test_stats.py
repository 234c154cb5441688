"""mha.experiments.stats against independent computations: the Wilson interval's defining equation solved by
bisection, the t and Welch intervals against R's published output for Student's sleep data, the coverage of every
interval by simulation (including at five and six seeds, where a percentile bootstrap undercovers), the permutation
p-value by counting sign patterns by hand, and the unpaired permutation p-value by listing the splits in plain Python; the rules the part III chapters read results by (a verdict and how far it is from flipping,
which pairs separate, the ordering of head counts, Spearman's correlation) against values worked out by hand."""

import itertools
import math
from fractions import Fraction
from statistics import NormalDist

import numpy as np
import pytest

from mha.experiments import stats
from mha.experiments.stats import (EXACT_MAX_PAIRS, against_range, flip_distance, holm_verdict, left_chance, mean_interval,
                                   outcome_of, outcome_orderings, outcome_table, outcomes, paired_difference,
                                   paired_interval, paired_table, rank_correlation, separated, separated_pairs,
                                   unpaired_difference, verdict, wilson_interval)

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


# Student's sleep data (Cushny and Peebles 1905, as in R's `sleep`): extra hours of sleep under two drugs, the same
# ten patients. R 4.x prints for t.test(extra ~ group, data = sleep, paired = TRUE): mean difference -1.58, 95% CI
# -2.4598858 to -0.7001142, p = 0.002833; and for the Welch test (paired = FALSE): CI -3.3654832 to 0.2054832,
# p = 0.07939.
SLEEP_1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
SLEEP_2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]


def test_t_and_welch_intervals_reproduce_r_on_the_sleep_data():
    d = np.array(SLEEP_1) - np.array(SLEEP_2)
    t = mean_interval(d)
    assert (t["mean"], t["low"], t["high"]) == pytest.approx((-1.58, -2.4598858, -0.7001142), abs=1e-7)
    welch = unpaired_difference(SLEEP_1, SLEEP_2)
    assert (welch["low"], welch["high"], welch["p_welch"]) == pytest.approx((-3.3654832, 0.2054832, 0.07939), abs=1e-5)
    assert not welch["real"]  # neither Welch nor the permutation test rejects at 5%
    paired = paired_difference(SLEEP_1, SLEEP_2)  # ten pairs: the exact sign-flip test
    # Nine of ten differences negative and one zero: only 4 of the 1,024 patterns are as extreme (the zero's sign
    # does not change the mean), so p = 4/1024.
    assert paired["method"] == "exact sign-flip" and paired["p_value"] == pytest.approx(4 / 1024)
    assert paired["real"] and paired["low"] < -1.58 < paired["high"] < 0


@pytest.mark.parametrize("n", [5, 6, 10])
def test_t_interval_covers_the_true_mean_at_small_n(n):
    """At five or six seeds the t interval holds its 95% (a percentile bootstrap covers about 83% at n = 5)."""
    rng = np.random.default_rng(n)
    hits = 0
    for _ in range(2000):
        result = mean_interval(rng.normal(loc=2.0, scale=1.0, size=n))
        assert result["low"] <= result["mean"] <= result["high"]
        hits += result["low"] <= 2.0 <= result["high"]
    assert 0.935 <= hits / 2000 <= 0.965  # binomial sd at 95% and 2,000 trials: 0.005


@pytest.mark.parametrize("n", [6, 8, 12])
def test_sign_flip_interval_covers_and_agrees_with_its_test(n):
    """The interval holds its 95% for symmetric differences (here from a t distribution with 3 degrees of freedom,
    heavy-tailed) and excludes 0 exactly when the test rejects."""
    rng = np.random.default_rng(100 + n)
    hits = 0
    for _ in range(300):
        d = 0.3 + rng.standard_t(3, size=n)
        result = paired_difference(d, np.zeros(n))
        hits += result["low"] <= 0.3 <= result["high"]
        assert result["real"] == (result["low"] > 0 or result["high"] < 0) == (result["p_value"] <= 0.05)
    assert hits / 300 >= 0.92  # at least 95% in theory (conservative: the p-value is discrete); 300 trials


def test_sign_flip_interval_against_a_grid_of_shifts():
    """The interval's ends found by brute force: test every shift on a fine grid by listing the 2^n sign patterns."""
    d = np.array([0.31, -0.05, 0.22, 0.4, 0.13, 0.27, -0.02])
    result = paired_difference(d, np.zeros(7))

    def p_at(delta):
        x = d - delta
        observed = abs(x.sum())
        return np.mean([abs(sum(s * v for s, v in zip(signs, x))) >= observed - 1e-12
                        for signs in itertools.product((1, -1), repeat=7)])

    grid = np.linspace(-0.3, 0.6, 901)
    accepted = grid[[p_at(delta) > 0.05 for delta in grid]]
    assert result["low"] == pytest.approx(accepted.min(), abs=1e-3)
    assert result["high"] == pytest.approx(accepted.max(), abs=1e-3)


def test_five_pairs_cannot_be_resolved_and_many_pairs_use_t():
    five = paired_difference([1.1, 1.2, 1.3, 1.4, 1.5], [1.0] * 5)  # every difference positive
    assert five["p_value"] == pytest.approx(2 / 32) and not five["real"]
    assert five["low"] == -math.inf and five["high"] == math.inf
    rng = np.random.default_rng(0)
    d = rng.normal(0.2, 1.0, size=EXACT_MAX_PAIRS + 6)
    many = paired_difference(d, np.zeros(d.size))
    assert many["method"] == "t"
    assert (many["low"], many["high"]) == pytest.approx((mean_interval(d)["low"], mean_interval(d)["high"]))


def test_paired_difference_p_value_counts_sign_patterns():
    d = np.array([0.3, 0.1, 0.2, 0.4, 0.25, 0.15])
    result = paired_difference(d + 1.0, np.ones(6))
    assert result["p_value"] == pytest.approx(2 / 64)  # only all-plus and all-minus are as extreme, of 2^6
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
    assert paired.loc[4, "p_holm"] == pytest.approx(2 / 16) and not paired.loc[4, "real_holm"]  # a family of one
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
    result = unpaired_difference(a, b)
    se = math.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size)  # Welch's standard error
    d = a.mean() - b.mean()
    assert result["mean"] == pytest.approx(d)
    # At these sizes Welch's t quantile is within 1% of the normal one.
    np.testing.assert_allclose([result["low"], result["high"]], [d - Z95 * se, d + Z95 * se], atol=0.02 * se)
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
        result = unpaired_difference(a, b)
        assert result["low"] <= result["mean"] <= result["high"]
        hits += result["low"] <= 0.5 <= result["high"]
    assert 0.91 <= hits / 300 <= 0.99  # Welch's interval holds 95% (binomial sd 0.013 at 300 trials)


# ------------------------------------------------------------------- the rules the part III chapters read results by


def test_mean_interval_is_the_t_interval_by_hand_and_a_single_run_has_no_interval():
    values = [0.3, 0.1, 0.4, 0.1, 0.5, 0.9]
    result = mean_interval(values)
    # Student's t written out: mean -+ t_{0.975, 5} s / sqrt(6), t_{0.975, 5} = 2.5705818 (printed tables).
    x = np.array(values)
    half = 2.5705818 * x.std(ddof=1) / math.sqrt(6)
    assert result["mean"] == pytest.approx(sum(values) / 6) and result["n"] == 6
    assert (result["low"], result["high"]) == pytest.approx((x.mean() - half, x.mean() + half), rel=1e-7)
    one = mean_interval([1.25])
    assert one["mean"] == 1.25 and math.isnan(one["low"]) and math.isnan(one["high"]) and one["n"] == 1
    none = mean_interval([])
    assert math.isnan(none["mean"]) and none["n"] == 0
    constant = mean_interval([2.0, 2.0, 2.0])  # no spread: the interval is the value
    assert (constant["low"], constant["mean"], constant["high"]) == (2.0, 2.0, 2.0)


def test_mean_interval_refuses_what_is_not_a_sequence_of_numbers():
    with pytest.raises(TypeError, match="values must be a sequence of real numbers"):
        mean_interval("0.5")
    with pytest.raises(TypeError, match="values must be a sequence of real numbers"):
        mean_interval(0.5)
    with pytest.raises(TypeError, match="values must be a sequence of real numbers"):
        mean_interval(["a", "b"])
    with pytest.raises(ValueError, match="values must be finite"):
        mean_interval([math.nan])
    with pytest.raises(ValueError, match="values must hold at least two finite numbers"):
        mean_interval([1.0, math.inf])
    with pytest.raises(ValueError, match="confidence must be"):
        mean_interval([1.0], confidence=1.0)
    with pytest.raises(TypeError, match="n_boot"):  # the percentile bootstrap and its settings are gone
        mean_interval([1.0, 2.0], n_boot=10)


def test_paired_interval_counts_sign_patterns_and_a_single_pair_is_not_real():
    result = paired_interval([1.3, 1.1, 1.2], [1.0, 1.0, 1.0])
    assert result["mean"] == pytest.approx(0.2) and result["n"] == 3
    assert result["p_value"] == pytest.approx(2 / 8)  # all-plus and all-minus, of the 2^3 sign patterns
    # Three pairs, all positive, are still p = 0.25: not resolved, and no shift is ever rejected (unbounded interval).
    assert not result["real"] and (result["low"], result["high"]) == (-math.inf, math.inf)
    one = paired_interval([2.0], [0.5])
    assert one["mean"] == 1.5 and one["n"] == 1 and not one["real"]
    assert math.isnan(one["low"]) and math.isnan(one["high"]) and math.isnan(one["p_value"])
    with pytest.raises(ValueError, match="a and b must pair one to one"):
        paired_interval([1.0, 2.0], [1.0])
    with pytest.raises(TypeError, match="b must be a sequence of real numbers"):
        paired_interval([1.0], {"x": 1.0})


def test_verdict_reads_the_interval_ends():
    assert verdict({"low": 0.01, "high": 0.3}, "higher", "lower") == "higher"
    assert verdict({"low": -0.3, "high": -0.01}, "higher", "lower") == "lower"
    assert verdict({"low": -0.1, "high": 0.2}, "higher", "lower") == "not distinguishable from"
    assert verdict({"low": 0.0, "high": 0.2}, "higher", "lower", "unresolved") == "unresolved"  # touching 0
    assert verdict({"low": math.nan, "high": math.nan}, "higher", "lower", "no interval") == "no interval"
    with pytest.raises(TypeError, match="result must hold an interval under 'low' and 'high'"):
        verdict({"mean": 0.2}, "higher", "lower")
    with pytest.raises(TypeError, match="above must be a string"):
        verdict({"low": 0.1, "high": 0.2}, 1, "lower")
    with pytest.raises(TypeError, match=r"result\['low'\] must be a real number"):
        verdict({"low": "0.1", "high": 0.2}, "higher", "lower")


def test_verdict_agrees_with_the_real_flag_of_paired_table():
    import pandas as pd

    table = pd.DataFrame({"g": [1] * 4 + [2] * 4 + [3] * 4, "seed": [0, 1, 2, 3] * 3,
                          "val_loss": [1.0, 1.1, 0.9, 1.0, 1.2, 1.3, 1.1, 1.25, 1.0, 1.2, 0.8, 1.05]})
    paired = paired_table(table, "g", reference=1)
    for _, row in paired.iterrows():
        word = verdict(row, "worse", "better", "same")
        assert (word != "same") == row["real"]
        assert word == ("same" if not row["real"] else "worse" if row["diff"] > 0 else "better")


def test_flip_distance_is_the_end_nearest_zero():
    import pandas as pd

    assert flip_distance({"low": -0.3, "high": -0.1}) == pytest.approx(0.1)
    assert flip_distance({"low": 0.2, "high": 0.5}) == pytest.approx(0.2)
    assert flip_distance({"low": -0.1, "high": 0.4}) == pytest.approx(0.1)
    frame = pd.DataFrame({"low": [0.2, -0.5, -0.05], "high": [0.6, -0.25, 0.3]})
    np.testing.assert_allclose(flip_distance(frame), [0.2, 0.25, 0.05])
    with pytest.raises(TypeError, match="result must hold an interval"):
        flip_distance((0.1, 0.2))


def test_separated_pairs_sorts_pairs_into_disjoint_and_overlapping():
    intervals = {4: (0.5, 2.5), 1: (0.0, 1.0), 2: (2.0, 3.0), 8: (math.nan, math.nan)}  # 8: a single run, no interval
    assert separated_pairs(intervals) == ([(1, 2)], [(1, 4), (2, 4)])
    assert separated_pairs({}) == ([], [])
    with pytest.raises(TypeError, match="intervals must be a mapping"):
        separated_pairs([(0.0, 1.0)])
    with pytest.raises(ValueError, match=r"intervals\[1\] must be a pair"):
        separated_pairs({1: (0.0, 1.0, 2.0)})


def _orderings_table():
    import pandas as pd

    ln4 = math.log(4)
    # Six runs per head count: 4 heads all at chance, 8 heads all solved, 16 heads three solved and three at chance.
    losses = {4: [ln4] * 6, 8: [0.0] * 6, 16: [0.0, 0.0, 0.0, ln4, ln4, ln4]}
    table = pd.DataFrame([{"n_heads": h, "seed": s, "val_loss": loss} for h, values in losses.items()
                          for s, loss in enumerate(values)])
    return outcome_table(table)


def test_outcome_orderings_names_the_better_head_count_where_intervals_are_disjoint():
    table = _orderings_table()
    orderings = outcome_orderings(table, (4, 8, 16))
    assert list(orderings) == [(4, 8), (4, 16), (8, 16)]
    # 0/6 against 6/6: the Wilson intervals [0, 0.39] and [0.61, 1] are disjoint for solved and for chance; the mean
    # losses are ln 4 and 0 exactly (zero-width t intervals).
    assert wilson_interval(0, 6)[1] < wilson_interval(6, 6)[0]
    assert orderings[(4, 8)] == [("solved", 8, 4), ("chance", 8, 4), ("loss", 8, 4)]
    # 3/6 overlaps both 0/6 and 6/6 in the Wilson sense, so only the mean loss could order 16 against 4 or 8. Three
    # 0s and three ln 4: mean ln 4 / 2, s = sqrt(6/5) ln 4 / 2, and the t interval's half-width t_{0.975,5} s / sqrt(6)
    # = 1.1496 x ln 4 / 2, more than ln 4 / 2: it reaches past both 0 and ln 4, so nothing orders 16 heads against
    # the others (the percentile bootstrap this replaced, which undercovers at this size, ordered both pairs).
    assert not separated(wilson_interval(3, 6), wilson_interval(0, 6))
    assert not separated(wilson_interval(3, 6), wilson_interval(6, 6))
    half = 2.5705818 * math.sqrt(6 / 5) * (math.log(4) / 2) / math.sqrt(6)
    assert half > math.log(4) / 2
    assert orderings[(4, 16)] == [] and orderings[(8, 16)] == []
    assert outcome_orderings(table)[(4, 8)] == orderings[(4, 8)]  # default: every level of the table


def test_outcome_orderings_refuses_other_tables_and_levels():
    import pandas as pd

    table = _orderings_table()
    with pytest.raises(TypeError, match="table must be a pandas DataFrame"):
        outcome_orderings({"solved": 1}, (4, 8))
    with pytest.raises(ValueError, match="missing"):
        outcome_orderings(pd.DataFrame({"solved": [0.5]}), (0,))
    with pytest.raises(ValueError, match=r"levels must name at least two rows of table.*not in the table: \[2\]"):
        outcome_orderings(table, (2, 4))
    with pytest.raises(ValueError, match="levels must name at least two rows"):
        outcome_orderings(table, (4,))


def test_left_chance_counts_runs_off_the_chance_plateau():
    ln2, ln4 = math.log(2), math.log(4)
    result = left_chance([0.0, ln2, ln4, ln4, 0.01], vocab_size=4)
    assert (result["n"], result["left"], result["solved"]) == (5, 3, 2)
    np.testing.assert_allclose(result["left_iv"], wilson_by_bisection(3, 5), atol=1e-9)
    np.testing.assert_allclose(result["solved_iv"], wilson_by_bisection(2, 5), atol=1e-9)
    with pytest.raises(TypeError, match="losses must be a sequence of real numbers"):
        left_chance("0.1", vocab_size=4)
    with pytest.raises(ValueError, match="vocab_size must be an integer >= 3"):
        left_chance([0.1, 0.2], vocab_size=2)


def _pearson(x, y):
    x, y = [Fraction(v) for v in x], [Fraction(v) for v in y]
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx, syy = sum((a - mx) ** 2 for a in x), sum((b - my) ** 2 for b in y)
    return float(sxy) / math.sqrt(float(sxx * syy))


def test_rank_correlation_is_spearman():
    a, b = [0.3, 1.2, -0.5, 2.0, 0.9], [10.0, 30.0, 20.0, 50.0, 40.0]
    # No ties: 1 - 6 sum d^2 / (n (n^2 - 1)); ranks of a: 2, 4, 1, 5, 3; of b: 1, 3, 2, 5, 4.
    d2 = sum((ra - rb) ** 2 for ra, rb in zip([2, 4, 1, 5, 3], [1, 3, 2, 5, 4]))
    assert rank_correlation(a, b) == pytest.approx(1 - 6 * d2 / (5 * (25 - 1)))
    # Ties take their mean rank: a = 1, 2, 2, 3 has ranks 1, 2.5, 2.5, 4.
    assert rank_correlation([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(_pearson([1, 2.5, 2.5, 4], [1, 3, 2, 4]))
    assert rank_correlation([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="pair one to one"):
        rank_correlation([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="a NaN has no rank"):
        rank_correlation([1, math.nan, 3], [1, 2, 3])
    with pytest.raises(TypeError, match="a must be a sequence of real numbers"):
        rank_correlation("abc", [1, 2, 3])


def test_against_range_places_an_interval():
    assert against_range({"low": 0.45, "high": 0.6}, 0.2, 0.4) == "above"
    assert against_range({"low": 0.05, "high": 0.15}, 0.2, 0.4) == "below"
    assert against_range({"low": 0.25, "high": 0.35}, 0.2, 0.4) == "inside"
    assert against_range({"low": 0.2, "high": 0.4}, 0.2, 0.4) == "inside"  # ends included
    assert against_range({"low": 0.1, "high": 0.3}, 0.2, 0.4) == "overlapping"
    assert against_range({"low": 0.1, "high": 0.5}, 0.2, 0.4) == "overlapping"
    with pytest.raises(ValueError, match="lower must not exceed upper"):
        against_range({"low": 0.1, "high": 0.5}, 0.4, 0.2)
    with pytest.raises(TypeError, match="lower must be a finite real number"):
        against_range({"low": 0.1, "high": 0.5}, "0.2", 0.4)


def test_best_rate_comparison_chooses_on_one_block_and_compares_on_the_other():
    """The plan of head-count-lr.yaml, checked on a constructed table: the best rate is chosen by solved count on the
    selecting seeds only (ties: lower median loss), the held-out seeds give the fractions, and Fisher's two-sided p is
    the sum of the hypergeometric probabilities no larger than the observed one (computed here with math.comb),
    Holm-adjusted by hand."""
    import math as _math

    import pandas as pd

    from mha.experiments.stats import best_rate_comparison, wilson_interval

    rows = []
    # level A: rate 0.1 solves 3 of 4 selecting seeds, rate 0.2 solves 3 too but with a higher median loss
    # level B: rate 0.2 solves 4 of 4; on the held-out seeds A (at 0.1) solves 1 of 4 and B (at 0.2) 4 of 4
    plan = {("A", 0.1): ([1, 1, 1, 0], [0.1, 0.1, 0.1, 2.0], [1, 0, 0, 0]),
            ("A", 0.2): ([1, 1, 1, 0], [0.2, 0.2, 0.2, 2.0], [1, 1, 1, 1]),  # held-out seeds would favour 0.2
            ("B", 0.1): ([0, 0, 0, 0], [2.0] * 4, [1, 1, 1, 1]),
            ("B", 0.2): ([1, 1, 1, 1], [0.1] * 4, [1, 1, 1, 1])}
    for (level, lr), (sel, losses, held) in plan.items():
        for seed in range(4):
            rows.append(dict(n_heads=level, lr=lr, seed=seed, solved=bool(sel[seed]), val_loss=losses[seed]))
            rows.append(dict(n_heads=level, lr=lr, seed=seed + 4, solved=bool(held[seed]), val_loss=1.0))
    result = best_rate_comparison(pd.DataFrame(rows), range(4), range(4, 8))
    assert result["best_rate"] == {"A": 0.1, "B": 0.2}  # chosen without looking at seeds 4-7
    assert result["fraction"]["A"]["k"] == 1 and result["fraction"]["B"]["k"] == 4
    assert (result["fraction"]["A"]["low"], result["fraction"]["A"]["high"]) == wilson_interval(1, 4)

    def fisher_two_sided(a, b, c, d):  # the 2x2 table [[a, b], [c, d]], margins fixed: hypergeometric
        row1, col1, n = a + b, a + c, a + b + c + d
        prob = [(_math.comb(col1, x) * _math.comb(n - col1, row1 - x) / _math.comb(n, row1), x)
                for x in range(max(0, row1 - (n - col1)), min(row1, col1) + 1)]
        observed = next(p for p, x in prob if x == a)
        return sum(p for p, _ in prob if p <= observed * (1 + 1e-9))

    expected = fisher_two_sided(1, 3, 4, 0)
    assert abs(result["pairs"][("A", "B")]["p"] - expected) < 1e-12
    assert result["pairs"][("A", "B")]["p_holm"] == pytest.approx(min(1.0, expected))  # one pair: Holm changes nothing


def test_best_rate_paired_chooses_on_one_block_and_compares_pairs_on_the_other():
    """The plan of head-count-shakespeare-lr.yaml on a constructed table: the best rate is the lowest mean loss on
    the choosing seeds only; at the best rates, on the other seeds, each pair is the exact sign-flip test of the
    per-seed differences, here counted by hand (all 2^n sign patterns), and Holm over three pairs by hand."""
    import pandas as pd

    from mha.experiments.stats import best_rate_paired

    choose_seeds, compare_seeds = range(3), range(3, 9)
    rng = np.random.default_rng(1)
    held = {"A": 1.0 + 0.01 * rng.standard_normal(6), "B": 1.0 + 0.01 * rng.standard_normal(6)}
    held["C"] = held["A"] + 0.05  # C is worse than A by 0.05 on every compared seed
    rows = []
    for level, best, other in (("A", 0.1, 0.3), ("B", 0.3, 0.1), ("C", 0.1, 0.3)):
        for seed in choose_seeds:
            rows += [dict(n_heads=level, lr=best, seed=seed, val_loss=1.0),
                     dict(n_heads=level, lr=other, seed=seed, val_loss=1.2)]
        for i, seed in enumerate(compare_seeds):  # only the best rate runs on the compared seeds, and a decoy:
            rows.append(dict(n_heads=level, lr=best, seed=seed, val_loss=float(held[level][i])))
            rows.append(dict(n_heads=level, lr=other, seed=seed, val_loss=0.0))  # lower, but not the chosen rate
    result = best_rate_paired(pd.DataFrame(rows), choose_seeds, compare_seeds)
    assert result["best_rate"] == {"A": 0.1, "B": 0.3, "C": 0.1}
    assert list(result["wide"].index) == list(compare_seeds) and (result["wide"]["C"] == held["C"]).all()

    def sign_flip_p(d):  # two-sided: patterns whose |mean| reaches the observed one, out of 2^n
        observed = abs(d.mean())
        means = [abs((d * signs).mean()) for signs in itertools.product([-1, 1], repeat=len(d))]
        return sum(m >= observed - 1e-12 for m in means) / len(means)

    raw = {(a, b): sign_flip_p(held[a] - held[b]) for a, b in itertools.combinations("ABC", 2)}
    order = sorted(raw, key=raw.get)
    holm, running = {}, 0.0
    for i, pair in enumerate(order):
        running = max(running, min(1.0, (len(order) - i) * raw[pair]))
        holm[pair] = running
    for pair, r in result["pairs"].items():
        assert r["p_value"] == pytest.approx(raw[pair]) and r["p_holm"] == pytest.approx(holm[pair])
        assert r["mean"] == pytest.approx((held[pair[0]] - held[pair[1]]).mean())
    assert result["pairs"][("A", "C")]["p_value"] == pytest.approx(2 / 2 ** 6)  # every seed one way


def test_best_rate_paired_needs_every_compared_run_at_the_best_rate():
    import pandas as pd

    from mha.experiments.stats import best_rate_paired

    runs = pd.DataFrame([dict(n_heads=1, lr=0.1, seed=0, val_loss=1.0), dict(n_heads=1, lr=0.1, seed=1, val_loss=1.0),
                         dict(n_heads=2, lr=0.1, seed=0, val_loss=1.0)])
    with pytest.raises(ValueError, match=r"\(2, 1\)"):
        best_rate_paired(runs, [0], [1])
    with pytest.raises(ValueError, match="disjoint"):
        best_rate_paired(runs, [0, 1], [1])
    partial = pd.DataFrame([dict(n_heads=1, lr=lr, seed=s, val_loss=1.0) for lr in (0.1, 0.2) for s in (0, 1)][:-1])
    with pytest.raises(ValueError, match="every choosing seed"):  # (1, 0.2) has seed 0 only
        best_rate_paired(partial, [0, 1], [2])


def test_best_rate_comparison_rejects_overlapping_seed_blocks():
    import pandas as pd

    from mha.experiments.stats import best_rate_comparison

    runs = pd.DataFrame([dict(n_heads=1, lr=0.1, seed=0, solved=True, val_loss=0.0)])
    with pytest.raises(ValueError, match="disjoint"):
        best_rate_comparison(runs, [0, 1], [1, 2])
    with pytest.raises(ValueError, match="missing"):
        best_rate_comparison(runs.drop(columns="val_loss"), [0], [1])


def test_newcombe_interval_matches_the_published_examples():
    """Newcombe (1998), Table II, method 10 (hybrid score): 56/70 - 48/80 = 0.2000 with interval 0.0524 to 0.3339, and
    9/10 - 3/10 = 0.6000 with 0.1705 to 0.8090 (the values printed in the paper, to 4 decimals)."""
    from mha.experiments.stats import newcombe_interval

    d, low, high = newcombe_interval(56, 70, 48, 80)
    assert (round(d, 4), round(low, 4), round(high, 4)) == (0.2, 0.0524, 0.3339)
    d, low, high = newcombe_interval(9, 10, 3, 10)
    assert (round(d, 4), round(low, 4), round(high, 4)) == (0.6, 0.1705, 0.809)


def test_paired_table_holm_adjusts_over_its_rows():
    import pandas as pd

    # Against reference 0, level 1 is +1 on every one of 8 seeds (p = 2/256), level 2 mixed (p = 1), level 3 +1 on
    # seven seeds and -1 on one (p = 18/256: the 2 all-same-sign patterns and the 16 with one sign flipped, of 2^8).
    # Holm by hand: sorted p 2/256, 18/256, 1 -> 3 x 2/256, max(that, 2 x 18/256), max(..., 1) = 6/256, 36/256, 1.
    seeds = range(8)
    rows = [{"level": 0, "seed": s, "m": 0.0} for s in seeds]
    rows += [{"level": 1, "seed": s, "m": 1.0} for s in seeds]
    rows += [{"level": 2, "seed": s, "m": (-1.0) ** s} for s in seeds]
    rows += [{"level": 3, "seed": s, "m": 1.0 if s else -1.0} for s in seeds]
    out = paired_table(pd.DataFrame(rows), "level", reference=0, metric="m")
    assert out["p_value"].tolist() == pytest.approx([2 / 256, 1.0, 18 / 256])
    assert out["p_holm"].tolist() == pytest.approx([6 / 256, 1.0, 36 / 256])
    assert out["real_holm"].tolist() == [True, False, False]


def test_holm_verdict_reads_the_adjusted_test_and_refuses_an_impossible_row():
    assert holm_verdict({"diff": 0.2, "real": True, "real_holm": True}, "higher", "lower") == "higher"
    assert holm_verdict({"diff": -0.2, "real": True, "real_holm": True}, "higher", "lower") == "lower"
    assert holm_verdict({"diff": 0.2, "real": True, "real_holm": False}, "higher", "lower") == "not resolved"
    with pytest.raises(ValueError, match="an adjusted p cannot be below the raw p"):
        holm_verdict({"diff": 0.2, "real": False, "real_holm": True}, "higher", "lower")
    with pytest.raises(TypeError, match="row must be a row of paired_table"):
        holm_verdict({"diff": 0.2}, "higher", "lower")


# ------------------------------------------------------------------------------------------------ sign_flip_p_range
def test_sign_flip_p_range_at_no_movement_is_the_exact_test():
    rng = np.random.default_rng(3)
    for n in (2, 5, 8):
        d = rng.normal(0.01, 0.02, n)
        low, high = stats.sign_flip_p_range(d, 0.0)
        assert low == high == stats.paired_difference(d, np.zeros(n))["p_value"]


def test_sign_flip_p_range_holds_every_moved_p_value():
    # Independent: move each run's pair by every corner of [-move, move]^2 and recompute the exact test.
    rng = np.random.default_rng(4)
    for trial in range(6):
        d = rng.normal(0.005, 0.01, 4)
        move = 0.001 * (trial + 1)
        low, high = stats.sign_flip_p_range(d, move)
        assert 0 < low <= high <= 1
        for corner in itertools.product((-2 * move, 0.0, 2 * move), repeat=4):
            p = stats.paired_difference(d + np.array(corner), np.zeros(4))["p_value"]
            assert low - 1e-12 <= p <= high + 1e-12, (d, corner, p, low, high)


def test_sign_flip_p_range_checks_its_arguments():
    with pytest.raises(ValueError, match="move must be >= 0, got -0.1"):
        stats.sign_flip_p_range([0.1, 0.2], -0.1)
    with pytest.raises(TypeError, match="move must be a real number"):
        stats.sign_flip_p_range([0.1, 0.2], "0.1")
    with pytest.raises(ValueError, match="the exact test takes 2 to"):
        stats.sign_flip_p_range(np.ones(stats.EXACT_MAX_PAIRS + 1), 0.0)


def test_median_interval_order_statistics_and_coverage():
    """The ranks and coverage against the binomial sums written out with math.comb, and the coverage against a
    simulation: intervals from 11 exponential draws cover the true median (ln 2) about 98.8% of the time."""
    def coverage(n, k):  # P(x_(k) <= median <= x_(n-k+1)) = 1 - 2 P(fewer than k draws below the median)
        return 1 - 2 * sum(math.comb(n, j) for j in range(k)) / 2 ** n

    values = [5.0, 1.0, 4.0, 9.0, 2.0, 8.0, 3.0, 7.0, 6.0, 11.0, 10.0]
    result = stats.median_interval(values)
    assert (result["k"], result["n"]) == (2, 11) and (result["low"], result["high"]) == (2.0, 10.0)
    assert result["coverage"] == pytest.approx(coverage(11, 2)) and coverage(11, 3) < 0.95 <= coverage(11, 2)
    for n in range(6, 40):  # the largest k whose coverage reaches 95%
        k = stats.median_interval(np.arange(float(n)))["k"]
        assert coverage(n, k) >= 0.95 and (k + 1 > n // 2 or coverage(n, k + 1) < 0.95), n
    rng = np.random.default_rng(0)
    draws = rng.exponential(size=(20_000, 11))
    covered = np.mean([(lambda r: r["low"] <= math.log(2) <= r["high"])(stats.median_interval(row)) for row in draws])
    assert abs(covered - coverage(11, 2)) < 0.004
    with pytest.raises(ValueError, match="at least 6 numbers"):
        stats.median_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    with pytest.raises(ValueError):
        stats.median_interval([1.0, float("nan"), 2.0, 3.0, 4.0, 5.0])
