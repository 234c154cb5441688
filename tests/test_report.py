"""mha.experiments.report against strings written out by hand: how part III's chapters write an interval, a count,
a list, a figure's error bars, the machine that ran a sweep and the command that regenerates it."""

import math

import numpy as np
import pytest

from mha.experiments import report


def test_interval_text_writes_a_mean_and_its_interval():
    assert report.interval_text(0.1234, 0.1012, 0.1456) == "0.123 [0.101, 0.146]"
    assert report.interval_text(0.05, 0.01, 0.24, ".2f") == "0.05 [0.01, 0.24]"
    assert report.interval_text(-0.0012, -0.0031, 0.0007, "+.4f") == "-0.0012 [-0.0031, +0.0007]"
    assert report.interval_text(1.9, 1.85, 1.95, ".3f", form="to") == "1.900 (1.850 to 1.950)"
    assert report.interval_text(np.float64(2.5), np.float32(2.0), 3, ".1f") == "2.5 [2.0, 3.0]"
    # A single run has no interval: the mean alone.
    assert report.interval_text(0.5, math.nan, math.nan, ".2f") == "0.50"
    assert report.interval_text(0.5, 0.1, math.inf, ".2f", form="to") == "0.50 (unbounded)"
    assert report.interval_text(0.5, -math.inf, math.inf, ".2f") == "0.50 [unbounded]"  # five pairs, sign-flip
    assert report.interval_text(0.5, math.nan, math.nan, ".2f") == "0.50"  # one run: no interval


def test_interval_text_refuses_bad_arguments():
    with pytest.raises(TypeError, match="mean must be a real number"):
        report.interval_text("0.5", 0.1, 0.9)
    with pytest.raises(TypeError, match="high must be a real number"):
        report.interval_text(0.5, 0.1, True)
    with pytest.raises(TypeError, match="fmt must be a format specification"):
        report.interval_text(0.5, 0.1, 0.9, 3)
    with pytest.raises(ValueError, match="fmt must be a format specification"):
        report.interval_text(0.5, 0.1, 0.9, "q")
    with pytest.raises(ValueError, match="form must be one of 'brackets', 'to'"):
        report.interval_text(0.5, 0.1, 0.9, form="parentheses")


def test_result_text_reads_mean_low_and_high():
    assert report.result_text({"mean": 0.25, "low": 0.2, "high": 0.31, "n": 5}, ".2f") == "0.25 [0.20, 0.31]"
    assert report.result_text({"mean": 3.0, "low": math.nan, "high": math.nan}) == "3.000"
    with pytest.raises(TypeError, match="result must hold 'mean', 'low' and 'high'"):
        report.result_text({"diff": 0.1, "low": 0.0, "high": 0.2})


def test_count_text_writes_the_wilson_interval_of_the_fraction():
    # Wilson 95% for 3 of 10: (0.1078, 0.6032); for 0 of 10: (0, 0.2775); for 8 of 10: (0.4902, 0.9433).
    assert report.count_text(3, 10) == "3/10 [0.11, 0.60]"
    assert report.count_text(0, 10) == "0/10 [0.00, 0.28]"
    assert report.count_text(np.int64(8), 10, form="percent") == "8/10 (49%–94%)"
    with pytest.raises(ValueError, match=r"k must be an integer in \[0, 10\]"):
        report.count_text(11, 10)
    with pytest.raises(TypeError, match="k must be an integer"):
        report.count_text(3.0, 10)
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        report.count_text(0, 0)
    with pytest.raises(ValueError, match="form must be one of"):
        report.count_text(1, 2, form="to")


def test_and_join_and_pairs_text():
    assert report.and_join([]) == ""
    assert report.and_join(["one"]) == "one"
    assert report.and_join(["a", "b"]) == "a and b"
    assert report.and_join([8, 32, 128]) == "8, 32 and 128"
    assert report.and_join(f"{x:g}" for x in (0.001, 0.01)) == "0.001 and 0.01"
    with pytest.raises(TypeError, match="items must be an iterable of items"):
        report.and_join("abc")
    assert report.pairs_text([(1, 4), (2, 4)]) == "1 and 4, 2 and 4"
    assert report.pairs_text([]) == "no pair"
    assert report.pairs_text([], none="none") == "none"
    with pytest.raises(ValueError, match="pairs must hold pairs"):
        report.pairs_text([(1, 2, 3)])


def test_number_ranges_groups_consecutive_integers():
    assert report.number_ranges([5, 0, 1, 2, 1337]) == "0–2, 5, 1337"
    assert report.number_ranges(np.array([7, 8])) == "7–8"
    assert report.number_ranges([3]) == "3"
    assert report.number_ranges([]) == ""
    with pytest.raises(TypeError, match="values must be an integer"):
        report.number_ranges([1.0, 2.0])


def test_error_bars_are_distances_to_the_ends_clipped_at_zero():
    bars = report.error_bars([0.5, 0.0], [0.25, 1e-17], [0.75, 0.3])  # a Wilson bound a rounding error above 0
    np.testing.assert_array_equal(bars, [[0.25, 0.0], [0.25, 0.3]])
    assert bars.shape == (2, 2)
    with pytest.raises(ValueError, match="mid, low and high must have one shape"):
        report.error_bars([0.5, 0.1], [0.2], [0.7, 0.2])
    with pytest.raises(TypeError, match="low must be real numbers"):
        report.error_bars([0.5], ["a"], [0.7])


def test_machine_values_collects_each_value_once():
    machines = [{"cpu_id": ["b", "a"], "threads": ["1"]}, {"cpu_id": ["a"]}, {}]
    assert report.machine_values(machines, "cpu_id") == ["a", "b"]
    assert report.machine_values(machines, "threads") == ["1"]
    assert report.machine_values(machines, "torch_version") == []
    with pytest.raises(TypeError, match="machines must be an iterable of machine records"):
        report.machine_values(["cpu"], "cpu_id")
    with pytest.raises(TypeError, match="machines must be an iterable"):
        report.machine_values({"cpu_id": ["a"]}, "cpu_id")
    with pytest.raises(TypeError, match="key must be a column name"):
        report.machine_values(machines, 3)


def test_regenerate_command_for_run_and_unrun_sweeps():
    from mha.experiments.results import experiments_dir, sweep_names
    from mha.experiments.sweep_file import load_sweep

    root = experiments_dir().parent
    unrun = [name for name, path in sorted(sweep_names().items())
             if name.endswith("-gpu") and not (path.parent / name / "results.csv").exists()]
    for name in ("head-count", unrun[0]):  # committed results, and a GPU file that has not been run
        path = sweep_names()[name]
        jobs = load_sweep(path).jobs
        expected = f"python -m mha.sweep {path.relative_to(root).as_posix()}" + (f" --jobs {jobs}" if jobs > 1 else "")
        assert report.regenerate_command(name) == expected
    assert report.regenerate_command("head-count").startswith(
        "python -m mha.sweep experiments/head_count/head-count.yaml")
    with pytest.raises(ValueError, match="no sweep named 'no-such-sweep'"):
        report.regenerate_command("no-such-sweep")
    with pytest.raises(TypeError, match="name must be a sweep name"):
        report.regenerate_command(3)


def test_difference_text_says_exact_only_for_an_exact_zero():
    assert report.difference_text(0.0) == "0 (exact)"
    assert report.difference_text(np.float64(0)) == "0 (exact)"
    assert report.difference_text(2.220446049250313e-16) == "2e-16"  # one significant digit, not "0"
    assert report.difference_text(np.float32(3.1e-7)) == "3e-07"
    with pytest.raises(ValueError, match="difference"):
        report.difference_text(float("nan"))  # a check that compared nothing
    with pytest.raises(ValueError, match="difference"):
        report.difference_text(-1e-16)
    with pytest.raises(TypeError, match="difference"):
        report.difference_text("0")
