"""Running the cases of a checker: calling your function (with the time limit), comparing, diagnosing, reporting.

A checker builds a list of :class:`Case` (inputs, the reference's expected outputs, and what each known bug would
return) and hands it to :func:`run_cases`, which calls your function on each case in turn and raises
:class:`ExerciseError` at the first wrong one: the message names the case, shows a few expected and actual numbers,
names the book's equation, and, when your result equals a known bug's on that case, the bug and a hint.
"""

from __future__ import annotations

import functools
import itertools
import os
import sys
import sysconfig
import traceback
from dataclasses import dataclass, field
from importlib import import_module
from typing import Callable, NamedTuple

import numpy as np

from mha._checks import check_choice
from mha.exercises.catalogue import ERROR_HINTS, KNOWN_BUGS, Equation
from mha.exercises.language import case_name, tr
from mha.exercises.timelimit import TimedOut, TimeLimit, check_timeout

RTOL = 1e-5  # relative tolerance of every comparison (float64 reference; float32 arithmetic would mostly pass too)
ATOL = 1e-7  # absolute tolerance, times max(1, largest |expected| entry)
_BACKENDS = ("auto", "numpy", "torch")
TIMEOUT = 10.0  # seconds each call of your function may take (see mha.exercises' docstring); None: no limit


class ExerciseError(AssertionError):
    """Your function gave a wrong result (or raised, or returned the wrong kind of thing) on one checker case.

    Attributes: ``checker`` (its name), ``case`` (the case's description), ``bug`` (the id of the known bug your
    result matches, a key of :data:`KNOWN_BUGS`, or None).
    """

    def __init__(self, message: str, checker: str, case: str, bug: str | None = None):
        super().__init__(message)
        self.checker = checker
        self.case = case
        self.bug = bug


class ExerciseTimeout(ExerciseError):
    """Your function did not return within ``timeout`` seconds on one case (an infinite loop, or a very slow one).

    Attributes: those of :class:`ExerciseError` (``bug`` is None), and ``timeout``, the seconds the checker waited.
    """

    def __init__(self, message: str, checker: str, case: str, timeout: float):
        super().__init__(message, checker, case)
        self.timeout = timeout


# ---------------------------------------------------------------------------------------------------------------
# Cases, calls and comparisons.
# ---------------------------------------------------------------------------------------------------------------


class Output(NamedTuple):
    name: str  # as in the signature: "out", "weights", ...
    formula: str  # what it must equal, in words
    equation: Equation


@dataclass
class Case:
    name: str  # what is special about it: shapes and flags
    args: tuple  # positional arguments (NumPy; converted per backend on each call)
    kwargs: dict  # keyword arguments
    expected: tuple  # one float64 (or bool) array per output, from mha.reference
    variants: list = field(default_factory=list)  # (bug id, thunk -> outputs tuple | None) what each bug would give
    note: str = ""  # shown when this case fails and no known bug matches
    call: Callable | None = None  # custom driver (fn, args, kwargs) -> result, for multi-call cases
    arg_names: tuple = ()  # names of args for messages, when they are not fn's own arguments (custom driver)


def _check_fn(checker: str, fn) -> None:
    if not callable(fn):
        raise TypeError(f"{checker}: fn must be a callable (the function you wrote), got {fn!r} of type "
                        f"{type(fn).__name__}")


_KEYWORDS_DOC = """

    Like every checker, it also takes ``backend`` ("auto", "numpy" or "torch": the kind of inputs) and ``timeout``
    (seconds each call of ``fn`` may take, default :data:`TIMEOUT` = 10; None: no limit): a call that runs longer is
    stopped and reported as :class:`ExerciseTimeout`, naming the case. See the docstring of ``mha.exercises``.
    """


def public_checker(body):
    """Decorator for the public checkers: validate ``fn``, ``backend`` and ``timeout`` before any case is built."""
    @functools.wraps(body)
    def check(fn, *args, backend: str = "auto", timeout: float | None = TIMEOUT, **kwargs):
        _check_fn(body.__name__, fn)
        check_choice("backend", backend, _BACKENDS)
        timeout = check_timeout(timeout)
        return body(fn, *args, backend=backend, timeout=timeout, **kwargs)
    check.__doc__ = body.__doc__.rstrip() + _KEYWORDS_DOC  # one wording for the keywords every checker shares
    return check


def _torch():
    return import_module("torch")


def _is_tensor(x) -> bool:
    torch = sys.modules.get("torch")  # a tensor exists only if torch was imported
    return torch is not None and isinstance(x, torch.Tensor)


def _fresh(x, backend: str):
    """A new copy of a case input for one call: same layout (a non-contiguous input stays non-contiguous)."""
    if isinstance(x, np.ndarray):
        copy = np.empty_like(x, order="K")  # keeps the axis order of the strides
        np.copyto(copy, x)
        if not x.flags.c_contiguous and copy.flags.c_contiguous:
            copy = np.swapaxes(np.swapaxes(x, -1, -2).copy(), -1, -2)  # a transposed view again
        return _torch().from_numpy(copy) if backend == "torch" else copy
    if isinstance(x, dict):
        return {key: _fresh(value, backend) for key, value in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_fresh(value, backend) for value in x)
    return x


def to_numpy(x):
    """An output as a NumPy array (float64, or bool for a mask); None if it is not array-like."""
    if _is_tensor(x):
        x = x.detach().cpu()
        if x.is_floating_point() and x.dtype != _torch().float64:
            x = x.double()
        x = x.numpy()
    try:
        arr = np.asarray(x)
    except Exception:
        return None
    if arr.dtype == np.bool_:
        return arr
    if arr.dtype.kind not in "iuf":
        return None
    return arr.astype(np.float64)


def _unchanged(passed, pristine) -> bool:
    if isinstance(pristine, np.ndarray):
        now = to_numpy(passed)
        return now is not None and now.shape == pristine.shape and np.array_equal(now, pristine)
    if isinstance(pristine, dict):
        return all(_unchanged(passed[key], value) for key, value in pristine.items())
    if isinstance(pristine, (tuple, list)):
        return all(_unchanged(a, b) for a, b in zip(passed, pristine))
    return True


def _tolerance(expected: np.ndarray) -> float:
    finite = np.abs(expected[np.isfinite(expected)]) if expected.size else np.zeros(0)
    return ATOL * max(1.0, float(finite.max()) if finite.size else 1.0)


def _same(actual, expected, equal_nan: bool = False) -> bool:
    """Does ``actual`` equal ``expected`` (same shape; bool exactly, floats to the tolerance)?"""
    if actual is None or expected is None or actual.shape != expected.shape:
        return False
    if expected.dtype == np.bool_ or actual.dtype == np.bool_:
        return actual.dtype == expected.dtype and bool(np.array_equal(actual, expected))
    return bool(np.allclose(actual, expected, rtol=RTOL, atol=_tolerance(expected), equal_nan=equal_nan))


def _fmt_index(index) -> str:
    return ",".join(str(i) for i in index)


def _fmt_values(values) -> str:
    if values.dtype == np.bool_:
        return "[" + " ".join("T" if v else "F" for v in values) + "]"
    return "[" + ", ".join(f"{v:.6g}" for v in values) + "]"


def _show(name: str, expected: np.ndarray, actual) -> str:
    """A few expected and actual numbers, around the entry that differs most."""
    if actual is None:
        return ""
    if actual.shape != expected.shape:
        return tr("    expected {name} of shape {expected}, got shape {actual}\n").format(
            name=name, expected=expected.shape, actual=actual.shape)
    if expected.ndim == 0:
        return tr("    expected {name} = {expected}, got {actual}\n").format(name=name, expected=expected, actual=actual)
    if expected.dtype == np.bool_ or actual.dtype == np.bool_:
        diff = (actual != expected).astype(np.float64)
    else:
        with np.errstate(invalid="ignore"):
            diff = np.abs(actual - expected)
        diff = np.where(np.isnan(diff), np.inf, diff)
    where = np.unravel_index(int(np.argmax(diff)), diff.shape)
    row, col = where[:-1], where[-1]
    width = expected.shape[-1]
    start = max(0, min(col - 2, width - 5))
    stop = min(width, start + 5)
    label = f"{name}[{_fmt_index(row)}{',' if row else ''}{start}:{stop}]"
    return tr("    expected {label} = {expected}\n    got      {label} = {actual}\n").format(
        label=label, expected=_fmt_values(expected[row][start:stop]), actual=_fmt_values(actual[row][start:stop]))


def known_bug_text(bug: str, where: str = "") -> str:
    """"This matches a known bug: <what it computes><where>.\nHint: <hint>", in the current language."""
    known = KNOWN_BUGS[bug]
    return tr("This matches a known bug: {description}{where}.\nHint: {hint}").format(
        description=tr(known.description), where=where, hint=tr(known.hint))


def equation_text(equation: Equation) -> str:
    """"book Eq. <label>, <chapter>", in the current language."""
    return tr("book Eq. {label}, {chapter}").format(label=equation.label, chapter=tr(equation.chapter))


def _describe_bug(bug: str, equation: Equation) -> str:
    known = KNOWN_BUGS[bug]
    where = "" if known.equation in (None, equation) else tr(" ({equation})").format(
        equation=equation_text(known.equation))
    return known_bug_text(bug, where)


def _diagnose(case: Case, actual: tuple) -> str | None:
    """The first known bug whose output on this case (computed independently) is what ``fn`` returned."""
    for bug, thunk in case.variants:
        try:
            with np.errstate(all="ignore"):
                variant = thunk()
        except Exception:  # the bug cannot happen on these shapes (its code would raise)
            continue
        if variant is None:
            continue
        if callable(variant):  # a predicate on the outputs
            if variant(actual):
                return bug
            continue
        variant = tuple(to_numpy(v) for v in variant)
        if all(_same(v, e, equal_nan=True) for v, e in zip(variant, case.expected)):
            continue  # this bug is invisible on this case
        if all(_same(a, v, equal_nan=True) for a, v in zip(actual, variant)):
            return bug
    return "outputs_swapped" if _swapped_order(case, actual) else None


def _swapped_order(case: Case, actual: tuple) -> tuple | None:
    """The order p such that actual[i] is the expected output p[i], when fn returned its outputs out of order."""
    n = len(case.expected)
    for order in itertools.permutations(range(n)):
        if order == tuple(range(n)) or all(_same(case.expected[j], case.expected[i]) for i, j in enumerate(order)):
            continue  # the right order, or an order that changes nothing on this case
        if all(_same(actual[i], case.expected[j]) for i, j in enumerate(order)):
            return order
    return None


def _header(checker: str, case: Case, backend: str) -> str:
    inputs = tr(" (inputs: torch float64 tensors)") if backend == "torch" else ""
    return tr("{checker}: case '{case}'{inputs}").format(checker=checker, case=case_name(case.name), inputs=inputs)


def _exception_text(exc) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 400 else text[:400] + " ..."


def _exception_message(checker, case, backend, excs) -> tuple[str, str | None]:
    """The message for a case on which fn raised: ``excs`` is [(exception, 'with NumPy arrays' or '')]."""
    if len({_exception_text(exc) for exc, _ in excs}) == 1:  # the same error with both backends: say it once
        excs = excs[:1]
        raised = _exception_text(excs[0][0])
    else:
        raised = tr("; and ").join(f"{tr(where)}{' ' if where else ''}{_exception_text(exc)}" for exc, where in excs)
    message = tr("{header}: your function raised {raised}\n").format(header=_header(checker, case, backend),
                                                                    raised=raised)
    if any(isinstance(exc, NotImplementedError) for exc, _ in excs):
        return message + tr("Hint: replace the stub's `raise NotImplementedError` with your code."), None
    for exc, _ in reversed(excs):  # with both backends tried, the torch error (last) is usually the telling one
        for fragment, hint in ERROR_HINTS:
            if fragment in str(exc):
                if hint in KNOWN_BUGS:
                    return message + known_bug_text(hint), hint
                message += tr("Hint: {hint}\n").format(hint=tr(hint))
                break
        else:
            continue
        break
    if case.note:
        message += tr("About this case: {note}").format(note=tr(case.note))
    return message.rstrip("\n"), None


def _unpack(checker, case, backend, outputs, result) -> tuple:
    n = len(outputs)
    names = ", ".join(o.name for o in outputs)
    if n == 1:
        if isinstance(result, (tuple, list)):
            raise ExerciseError(tr("{header}: your function returned a {kind} of {n} values; expected one array, "
                                   "{names}").format(header=_header(checker, case, backend),
                                                     kind=type(result).__name__, n=len(result), names=names),
                                checker, case.name)
        values = (result,)
    else:
        if not isinstance(result, (tuple, list)) or len(result) != n:
            got = (tr("a {kind} of {n} values").format(kind=type(result).__name__, n=len(result))
                   if isinstance(result, (tuple, list)) else tr("one {kind}").format(kind=type(result).__name__))
            raise ExerciseError(tr("{header}: your function returned {got}; expected a tuple of {n} arrays "
                                   "({names})").format(header=_header(checker, case, backend), got=got, n=n,
                                                       names=names), checker, case.name)
        values = tuple(result)
    arrays = tuple(to_numpy(v) for v in values)
    for spec, value, arr in zip(outputs, values, arrays):
        if arr is None:
            raise ExerciseError(tr("{header}: {name} is a {kind}, not an array of numbers").format(
                header=_header(checker, case, backend), name=spec.name, kind=type(value).__name__), checker, case.name)
    return arrays


def run_cases(checker: str, fn, backend: str, inputs: tuple, outputs: tuple, cases: list,
              timeout: float | None) -> None:
    """Call ``fn`` on every case; raise ExerciseError at the first case it gets wrong.

    ``inputs`` names fn's positional arguments (for messages), ``outputs`` describes what it returns; each call may
    take ``timeout`` seconds (ExerciseTimeout).
    """
    if backend == "auto":
        backend, failures = _pick_backend(checker, fn, cases[0], timeout)
        if failures:
            message, bug = _exception_message(checker, cases[0], backend, failures)
            raise ExerciseError(message, checker, cases[0].name, bug) from failures[-1][0]
    for case in cases:
        args, kwargs = _fresh(case.args, backend), _fresh(case.kwargs, backend)
        try:
            result = _call(checker, case, backend, fn, args, kwargs, timeout)
        except ExerciseError:
            raise
        except Exception as exc:
            message, bug = _exception_message(checker, case, backend, [(exc, "")])
            raise ExerciseError(message, checker, case.name, bug) from exc
        names = case.arg_names or inputs
        changed = [name for name, passed, pristine in zip(names, args, case.args) if not _unchanged(passed, pristine)]
        changed += [name for name, value in case.kwargs.items() if not _unchanged(kwargs[name], value)]
        if changed:
            raise ExerciseError(tr("{header}: after the call, {names} no longer held what was passed in.\n").format(
                header=_header(checker, case, backend), names=", ".join(changed)) + known_bug_text("modifies_input"),
                checker, case.name, "modifies_input")
        actual = _unpack(checker, case, backend, outputs, result)
        wrong = [i for i, (a, e) in enumerate(zip(actual, case.expected)) if not _same(a, e)]
        if wrong:
            bug = _diagnose(case, actual)
            raise ExerciseError(_mismatch_message(checker, case, backend, outputs, actual, wrong, bug),
                                checker, case.name, bug)


def _mismatch_message(checker, case, backend, outputs, actual, wrong, bug) -> str:
    first = wrong[0]
    spec, expected, got = outputs[first], case.expected[first], actual[first]
    lines = tr("{header}: {name} differs from {formula} ({equation}).\n").format(
        header=_header(checker, case, backend), name=spec.name, formula=tr(spec.formula),
        equation=equation_text(spec.equation))
    lines += _show(spec.name, expected, got)
    if len(outputs) > 1:
        right = [o.name for i, o in enumerate(outputs) if i not in wrong]
        also = [o.name for i, o in enumerate(outputs) if i in wrong[1:]]
        parts = ([tr("also wrong: {names}").format(names=", ".join(also))] if also else []) + (
            [tr("right: {names}").format(names=", ".join(right))] if right else [])
        lines += "    " + tr("({parts})").format(parts=tr("; ").join(parts)) + "\n"
    if bug == "outputs_swapped":
        order = _swapped_order(case, actual)
        lines += tr("    (your function returned ({returned}) instead of ({expected}))\n").format(
            returned=", ".join(outputs[j].name for j in order), expected=", ".join(o.name for o in outputs))
    if bug is not None:
        return lines + _describe_bug(bug, spec.equation)
    lines += tr("This matches none of the known bugs this checker simulates.")
    if got is not None and got.dtype != np.bool_ and got.shape == expected.shape and not np.all(np.isfinite(got)):
        lines += tr(" Your {name} contains NaN or inf: look for exp of a large number (subtract the maximum), a "
                    "division by zero (rows with no allowed key), or -inf - (-inf).").format(name=spec.name)
    if case.note:
        lines += "\n" + tr("About this case: {note}").format(note=tr(case.note))
    return lines


def _pick_backend(checker: str, fn, case: Case, timeout: float | None) -> tuple[str, list]:
    """'numpy', unless fn fails on the first case's NumPy arrays and runs on torch tensors.

    Returns (backend, failures): failures is empty, or [(numpy exception, ...), (torch exception, ...)] when fn
    raised with both. A call that runs out of time raises ExerciseTimeout at once.
    """
    failures = []
    for backend, where in (("numpy", "with NumPy arrays"), ("torch", "with torch tensors")):
        args, kwargs = _fresh(case.args, backend), _fresh(case.kwargs, backend)
        try:
            _call(checker, case, backend, fn, args, kwargs, timeout)
            return backend, []
        except ExerciseTimeout:
            raise
        except Exception as exc:
            failures.append((exc, where))
    return "numpy", failures


# ---------------------------------------------------------------------------------------------------------------
# One call of fn, stopped after `timeout` seconds.
# ---------------------------------------------------------------------------------------------------------------

_LIBRARIES = tuple(sysconfig.get_paths()[key] for key in ("stdlib", "purelib", "platlib"))
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep  # the checkers' own frames: not your code


def _timeout_message(checker, case, backend, timeout, exc) -> str:
    where = [frame for frame in traceback.extract_tb(exc.__traceback__) if not frame.filename.startswith(_PACKAGE)]
    where = [f for f in where if not f.filename.startswith(_LIBRARIES)] or where  # your code, if it is on the stack
    at = "" if not where else tr(" at {file}, line {line}").format(file=where[-1].filename, line=where[-1].lineno) + (
        f" (`{where[-1].line}`)" if where[-1].line else "")
    return tr("{header}: your function did not return within {timeout} s, so the checker stopped it{at}.\nHint: "
              "look for an infinite loop (a while loop whose condition never turns false, a counter that is never "
              "incremented) or a very slow loop over single elements; these cases hold a few dozen numbers, so a "
              "correct function returns in well under a second. To wait longer, pass timeout=<seconds> "
              "(timeout=None: no limit).").format(header=_header(checker, case, backend), timeout=f"{timeout:g}",
                                                  at=at)


def _call(checker, case, backend, fn, args, kwargs, timeout):
    """fn on one case (through the case's driver if it has one), stopped after ``timeout`` seconds."""
    if timeout is None:
        return case.call(fn, args, kwargs) if case.call else fn(*args, **kwargs)
    limit = TimeLimit(timeout)
    try:
        try:
            limit.start()
            return case.call(fn, args, kwargs) if case.call else fn(*args, **kwargs)
        finally:
            limit.stop()
    except TimedOut as exc:
        raise ExerciseTimeout(_timeout_message(checker, case, backend, timeout, exc), checker, case.name,
                              timeout) from exc


# ---------------------------------------------------------------------------------------------------------------
# Inputs of the cases.
# ---------------------------------------------------------------------------------------------------------------


def shapes_of(**arrays) -> str:
    """``"q (2, 3), k (4, 3)"``: the names and shapes of a case's arrays, for its name."""
    return ", ".join(f"{name} {tuple(a.shape)}" for name, a in arrays.items())


def row_with_no_key(rng, shape, empty_row):
    """A random boolean mask with at least one allowed key per row, except row ``empty_row`` (no key)."""
    mask = rng.random(shape) < 0.6
    mask[..., 0] |= ~mask.any(axis=-1)
    mask[..., empty_row, :] = False
    return mask


def padding_mask(lengths, l_kv):
    """(N, 1, 1, l_kv) padding mask: sequence b keeps its first lengths[b] keys."""
    return (np.arange(l_kv)[None, :] < np.asarray(lengths)[:, None])[:, None, None, :]


def transposed(x):
    """A non-contiguous copy of x: the same values, stored with its last two axes swapped."""
    return np.swapaxes(np.ascontiguousarray(np.swapaxes(x, -1, -2)), -1, -2)


def mask_and_scale(mask, scale) -> tuple[str, dict]:
    """The ``mask`` and ``scale`` of an attention case: how its name says them, and the keyword arguments passed."""
    text = (f", mask {tuple(mask.shape)}" if mask is not None else ", mask=None") + (
        f", scale={scale}" if scale is not None else ", scale=None")
    return text, {key: value for key, value in (("mask", mask), ("scale", scale)) if value is not None}
