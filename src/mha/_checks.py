"""Argument checks shared by every module: one wording and one rule for each kind of bad input.

The rule, everywhere in the package: a value of the wrong *type* raises ``TypeError``; a value of the right type
but the wrong *value* (out of range, not one of the choices, the wrong shape) raises ``ValueError``. Every message
names the argument, says what it got and what was expected, and is raised before any work is done.

``check_int``, ``check_float``, ``check_bool``, ``check_choice``, ``check_shape`` and ``check_type`` cover the
kinds of argument; ``head_shape`` is the attention layer's shape rule (book: part II, "MQA and GQA") and
``attention_scale`` its score scale (book: part I, "Why divide by sqrt(d_k)"), shared by ``mha.reference`` and
``mha.MultiHeadAttention`` so that both accept and refuse the same values with the same message.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["check_int", "check_float", "check_bool", "check_choice", "check_shape", "check_type", "head_shape",
           "attention_scale", "check_like"]


def _type_name(value) -> str:
    return type(value).__name__


def check_int(name: str, value, minimum: int | None = 1, maximum: int | None = None) -> int:
    """Return ``value`` as an int, or raise before any work is done.

    ``TypeError`` when it is not an integer (``True``/``False`` and ``2.0`` are refused), ``ValueError`` when it is
    below ``minimum`` or above ``maximum`` (``None``: no bound). The message names the argument, what it got and
    what was expected.
    """
    expected = _interval("an integer", minimum, maximum)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be {expected}, got {value!r} of type {_type_name(value)}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be {expected}, got {value}")
    return int(value)


def _interval(kind: str, minimum, maximum, min_inclusive: bool = True, max_inclusive: bool = True) -> str:
    """Words for the values allowed: "<kind> in [a, b]", "<kind> >= a", "<kind> < b" or "<kind>"."""
    if minimum is not None and maximum is not None:
        return f"{kind} in {'[' if min_inclusive else '('}{minimum:g}, {maximum:g}{']' if max_inclusive else ')'}"
    if minimum is not None:
        return f"{kind} {'>=' if min_inclusive else '>'} {minimum:g}"
    if maximum is not None:
        return f"{kind} {'<=' if max_inclusive else '<'} {maximum:g}"
    return kind


def check_float(name: str, value, minimum: float | None = None, maximum: float | None = None,
                min_inclusive: bool = True, max_inclusive: bool = True, finite: bool = True) -> float:
    """Return ``value`` (a real number: int or float, not bool) as a float, or raise.

    ``TypeError`` for anything that is not a real number; ``ValueError`` for NaN or infinity (unless
    ``finite=False``, which still refuses NaN) or a value outside the interval given by ``minimum``/``maximum``
    (each ``None`` for no bound; ``min_inclusive``/``max_inclusive`` choose ``[`` or ``(``).
    """
    expected = _interval("a finite real number" if finite else "a real number", minimum, maximum, min_inclusive,
                         max_inclusive)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {expected}, got {value!r} of type {_type_name(value)}")
    value = float(value)
    if math.isnan(value) or (finite and math.isinf(value)):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    if minimum is not None and (value < minimum or (value == minimum and not min_inclusive)):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    if maximum is not None and (value > maximum or (value == maximum and not max_inclusive)):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return value


def check_bool(name: str, value) -> bool:
    """Return ``value`` if it is ``True`` or ``False`` (NumPy's bool too); otherwise ``TypeError``."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {value!r} of type {_type_name(value)}")


def check_choice(name: str, value, choices: Iterable):
    """Return ``value`` if it is one of ``choices``.

    ``TypeError`` when its type is none of the choices' types (``impl=3`` where the choices are strings),
    ``ValueError`` when it has the right type but is not a choice.
    """
    choices = tuple(choices)
    listed = ", ".join(repr(c) for c in choices)
    types = {type(c) for c in choices}
    if not any(isinstance(value, t) and not (isinstance(value, bool) and t is not bool) for t in types):
        raise TypeError(f"{name} must be one of {listed}, got {value!r} of type {_type_name(value)}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {listed}, got {value!r}")
    return value


def check_type(name: str, value, types, expected: str):
    """Return ``value`` if it is an instance of ``types``; otherwise ``TypeError`` saying ``expected``."""
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
        raise TypeError(f"{name} must be {expected}, got {_type_name(value)}")
    return value


def _as_tuple(types) -> tuple:
    return types if isinstance(types, tuple) else (types,)


def check_shape(name: str, array, shape: Sequence[int | None], names: str | None = None) -> tuple[int, ...]:
    """Return ``tuple(array.shape)`` if it matches ``shape`` (``None`` matches any length on that axis).

    ``array`` is anything with a ``.shape`` (a NumPy array, a torch tensor). ``names`` describes the axes in the
    message, e.g. ``"(N, h, L_q, L_kv)"``. ``ValueError`` for a wrong rank or a wrong length.
    """
    got = tuple(int(s) for s in array.shape)
    wanted = tuple(shape)
    if len(got) != len(wanted) or any(w is not None and g != w for g, w in zip(got, wanted)):
        shown = "(" + ", ".join("any" if w is None else str(w) for w in wanted) + ("," if len(wanted) == 1 else "") + ")"
        label = f"{names} = {shown}" if names else shown
        raise ValueError(f"{name} must have shape {label}, got shape {got}")
    return got


def head_shape(d_model, n_heads, n_kv_heads=None, head_dim=None) -> tuple[int, int, int, int]:
    """Validated ``(d_model, n_heads, n_kv_heads, head_dim)`` with the defaults g = h and head_dim = d_model / h.

    Book: part II, 'MQA and GQA' (g must divide h: g = h is MHA, g = 1 is MQA).
    """
    d_model, n_heads = check_int("d_model", d_model), check_int("n_heads", n_heads)
    n_kv_heads = n_heads if n_kv_heads is None else check_int("n_kv_heads", n_kv_heads)
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads ({n_heads}) must be divisible by n_kv_heads ({n_kv_heads}): each key/value head "
                         f"serves n_heads / n_kv_heads query heads")
    if head_dim is None:
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads}) when head_dim is None; "
                             f"pass head_dim explicitly to use another head size")
        head_dim = d_model // n_heads
    return d_model, n_heads, n_kv_heads, check_int("head_dim", head_dim)


def attention_scale(scale, head_dim: int) -> float:
    """The multiplier of q k^T: ``1 / sqrt(head_dim)`` for None, else ``scale`` as a float, which must be a finite
    real number > 0 (TypeError for another type, ValueError for 0, a negative number, NaN or infinity)."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    return check_float("scale", scale, minimum=0.0, min_inclusive=False)


def check_like(name: str, value, other_name: str, other) -> None:
    """``value`` (a tensor) has the dtype (else TypeError) and the device (else ValueError) of ``other``."""
    if value.dtype != other.dtype:
        raise TypeError(f"{name} must have the dtype of {other_name} ({other.dtype}), got {value.dtype}")
    if value.device != other.device:
        raise ValueError(f"{name} must be on the device of {other_name} ({other.device}), got {value.device}")
