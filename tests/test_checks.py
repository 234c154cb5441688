"""The shared argument checks: one rule (TypeError for a wrong type, ValueError for a wrong value), one wording."""

import math

import numpy as np
import pytest
import torch

from mha._checks import check_bool, check_choice, check_float, check_int, check_shape, check_type


@pytest.mark.parametrize("value, error", [
    (True, TypeError), (2.0, TypeError), ("3", TypeError), (None, TypeError),
    (0, ValueError), (-4, ValueError), (11, ValueError),
])
def test_check_int_refuses(value, error):
    with pytest.raises(error, match=r"^n_heads must be an integer in \[1, 10\], got"):
        check_int("n_heads", value, minimum=1, maximum=10)


def test_check_int_accepts_numpy_integers_and_returns_int():
    got = check_int("n", np.int64(3))
    assert got == 3 and type(got) is int
    assert check_int("n", -5, minimum=None) == -5
    assert check_int("n", 0, minimum=0) == 0


@pytest.mark.parametrize("value, error", [
    (True, TypeError), ("0.1", TypeError), (None, TypeError), ([0.1], TypeError),
    (math.nan, ValueError), (math.inf, ValueError), (-0.1, ValueError), (1.0, ValueError), (1.5, ValueError),
])
def test_check_float_half_open_interval(value, error):
    with pytest.raises(error, match=r"^dropout must be a finite real number in \[0, 1\), got"):
        check_float("dropout", value, minimum=0.0, maximum=1.0, max_inclusive=False)


def test_check_float_accepts_ints_and_numpy_floats():
    assert check_float("lr", 1, minimum=0.0) == 1.0
    assert check_float("lr", np.float32(0.5), minimum=0.0) == 0.5
    assert check_float("x", -3.0) == -3.0
    assert check_float("x", math.inf, finite=False) == math.inf
    with pytest.raises(ValueError, match="> 0"):
        check_float("scale", 0.0, minimum=0.0, min_inclusive=False)


def test_check_bool():
    assert check_bool("flag", np.bool_(True)) is True
    for value in (1, 0, "yes", None, 1.0):
        with pytest.raises(TypeError, match=r"^flag must be True or False, got"):
            check_bool("flag", value)


def test_check_choice_type_then_value():
    assert check_choice("impl", "sdpa", ("sdpa", "naive")) == "sdpa"
    with pytest.raises(TypeError, match=r"^impl must be one of 'sdpa', 'naive', got 3 of type int"):
        check_choice("impl", 3, ("sdpa", "naive"))
    with pytest.raises(ValueError, match=r"^impl must be one of 'sdpa', 'naive', got 'flash'"):
        check_choice("impl", "flash", ("sdpa", "naive"))
    with pytest.raises(TypeError):  # True is not an int choice
        check_choice("n", True, (1, 2))


def test_check_shape_any_axis_and_message():
    assert check_shape("head_mask", torch.ones(4), (4,)) == (4,)
    assert check_shape("x", np.zeros((2, 3, 5)), (None, 3, None)) == (2, 3, 5)
    with pytest.raises(ValueError, match=r"^head_mask must have shape \(h,\) = \(4,\), got shape \(3,\)"):
        check_shape("head_mask", torch.ones(3), (4,), names="(h,)")
    with pytest.raises(ValueError, match=r"got shape \(2, 3\)"):
        check_shape("x", np.zeros((2, 3)), (None, 3, None))


def test_check_type():
    assert check_type("x", 1.0, float, "a float") == 1.0
    with pytest.raises(TypeError, match=r"^x must be a torch.Tensor, got list"):
        check_type("x", [1], torch.Tensor, "a torch.Tensor")
    with pytest.raises(TypeError):
        check_type("n", True, int, "an int")
