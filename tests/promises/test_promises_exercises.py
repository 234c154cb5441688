"""What the exercise checkers promise (issue 22, item 7).

Timeouts (every public checker takes ``timeout=``, seconds per call of your function, ``None`` for no limit):

* A function that never returns (``while True: pass``, ``time.sleep(1000)``) is stopped: the checker raises
  ``ExerciseTimeout`` (an ``ExerciseError``) naming the checker, the case that was running, the time waited and a hint.
* The same from a thread that is not the main one (no signals there), for code that runs Python bytecode.
* A timeout leaves nothing behind: no alarm, no handler, no pending exception; the next checker call works, and an
  alarm someone else had set is kept.
* The limit is per call, so a slow but correct function passes; ``timeout=None`` is accepted; bad values are refused.

Diagnoses (bugs that used to get "none of the known bugs"):

* an ignored mask, outputs returned in the wrong order, a causal mask that lets each query see one future key.

The long-running functions below are stopped by the checkers themselves; the tests bound nothing by wall-clock time
beyond "it returned at all" (a thread is joined with a generous limit; pytest-timeout, where installed, is only a
safety net).
"""

from __future__ import annotations

import inspect
import math
import signal
import threading
import time

import pytest

import exercise_bugs as B
from mha import exercises as E
from mha import reference as R

try:
    import pytest_timeout  # noqa: F401
except ImportError:
    pass
else:
    pytestmark = pytest.mark.timeout(300)  # a safety net only

CHECKERS = [name for name in E.__all__ if name.startswith("check_")]
FIRST_CASE = {  # the label of each checker's first case, as its messages name it
    "check_softmax": "x (6,), axis=-1",
    "check_scaled_dot_product_attention": "no batch axes, L_q != L_kv, d_v != d_k",
    "check_causal_mask": "self-attention (square): l_q=4, l_kv=4",
    "check_rope": "one pair (d = 2): x (4, 2), positions [0, 1, 2, 3]",  # part IV's first checker (issue 24)
}
HAS_ALARM = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()  # SIGALRM used


def spin(*args, **kwargs):
    while True:
        pass


def sleep_long(*args, **kwargs):
    time.sleep(1000)


def sleep_in_steps(*args, **kwargs):
    while True:
        time.sleep(0.05)


def _stopped(checker, fn, timeout=0.5):
    """The ExerciseTimeout a checker raises for fn, after checking what every timeout message must say."""
    with pytest.raises(E.ExerciseTimeout) as info:
        getattr(E, checker)(fn, timeout=timeout)
    error = info.value
    message = str(error)
    assert isinstance(error, E.ExerciseError) and error.checker == checker and error.bug is None
    assert message.startswith(f"{checker}: case '{error.case}'"), message
    assert f"did not return within {timeout:g} s" in message, message
    assert "infinite loop" in message and "timeout=" in message, message
    return error


def _in_thread(work):
    """Run work() in a new thread; return what it returned or raised (joined with a generous safety limit)."""
    box = {}

    def target():
        try:
            box["result"] = work()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(120)
    assert not thread.is_alive(), "the checker did not return"
    if "error" in box:
        raise box["error"]
    return box["result"]


# ---------------------------------------------------------------------------------------------------------------
# Timeouts.
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("checker", sorted(FIRST_CASE))
def test_an_infinite_loop_is_stopped_and_the_case_named(checker):
    """A function stuck in `while True: pass` raises ExerciseTimeout naming the checker and the case."""
    assert _stopped(checker, spin).case.startswith(FIRST_CASE[checker])


@pytest.mark.skipif(not HAS_ALARM, reason="no SIGALRM here: a watchdog cannot interrupt a C call")
@pytest.mark.parametrize("checker", sorted(FIRST_CASE))
def test_a_long_sleep_is_stopped(checker):
    """A function blocked in time.sleep(1000) is interrupted too (main thread)."""
    assert _stopped(checker, sleep_long).case.startswith(FIRST_CASE[checker])


def test_the_case_named_is_the_one_that_was_running():
    """The message names the case on which the function hung, not the first one."""
    def hangs_on_masks(q, k, v, mask=None, scale=None):
        if mask is not None:
            spin()
        return R.scaled_dot_product_attention(q, k, v, mask, scale)

    assert _stopped("check_scaled_dot_product_attention", hangs_on_masks).case.startswith("causal mask")


@pytest.mark.parametrize("fn", [spin, sleep_in_steps], ids=["while True", "sleep in steps"])
@pytest.mark.parametrize("checker", sorted(FIRST_CASE))
def test_a_timeout_works_outside_the_main_thread(checker, fn):
    """From a threading.Thread (no signals there) a running loop is stopped all the same, with the same message."""
    error = _in_thread(lambda: pytest.raises(E.ExerciseTimeout, getattr(E, checker), fn, timeout=0.5).value)
    assert str(error).startswith(f"{checker}: case '{FIRST_CASE[checker]}")


def test_a_thread_carries_on_normally_after_a_timeout():
    """No exception is left pending in a thread whose checker timed out: its next checker call and its sleeps work."""
    def work():
        with pytest.raises(E.ExerciseTimeout):
            E.check_softmax(spin, timeout=0.3)
        E.check_softmax(R.softmax, timeout=30)
        for _ in range(10):
            time.sleep(0.1)  # past the old deadline: nothing may be raised here
        return "done"

    assert _in_thread(work) == "done"


def test_nothing_is_left_behind_in_the_main_thread():
    """After a timeout no alarm is pending, the SIGALRM handler is the previous one, and a second call works."""
    handler = signal.getsignal(signal.SIGALRM) if HAS_ALARM else None
    timer = signal.getitimer(signal.ITIMER_REAL) if HAS_ALARM else None  # (0, 0) unless pytest-timeout set one
    _stopped("check_softmax", spin, timeout=0.3)
    if HAS_ALARM:
        assert signal.getsignal(signal.SIGALRM) is handler
        now = signal.getitimer(signal.ITIMER_REAL)
        assert now == (0.0, 0.0) if timer == (0.0, 0.0) else 0 < now[0] <= timer[0]
    time.sleep(0.5)  # past the old deadline: no late alarm
    assert E.check_softmax(R.softmax, timeout=30) is None
    _stopped("check_causal_mask", spin, timeout=0.3)  # and a second timeout works too


@pytest.mark.skipif(not HAS_ALARM, reason="no SIGALRM here")
def test_an_alarm_set_before_is_kept():
    """A SIGALRM handler and timer set by someone else survive a checker call, timed out or not."""
    fired = []

    def theirs(signum, frame):
        fired.append(signum)

    previous = signal.signal(signal.SIGALRM, theirs)
    try:
        signal.setitimer(signal.ITIMER_REAL, 60)
        E.check_softmax(R.softmax, timeout=5)
        _stopped("check_softmax", spin, timeout=0.3)
        assert signal.getsignal(signal.SIGALRM) is theirs
        assert 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 60
        assert not fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.skipif(not HAS_ALARM, reason="no SIGALRM here")
def test_an_earlier_alarm_set_before_still_fires_first():
    """An alarm someone else set that is due before the checker's timeout fires on time, with their handler."""
    class TheirAlarm(BaseException):
        pass

    def theirs(signum, frame):
        raise TheirAlarm

    previous = signal.signal(signal.SIGALRM, theirs)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(TheirAlarm):
            E.check_softmax(spin, timeout=60)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_the_limit_is_per_call():
    """A correct function that takes 0.2 s per call passes with timeout=1.5, though its 10 calls take longer."""
    def slow_softmax(x, axis=-1):
        time.sleep(0.2)
        return R.softmax(x, axis=axis)

    assert E.check_softmax(slow_softmax, timeout=1.5) is None


@pytest.mark.parametrize("checker", CHECKERS)
def test_timeout_none_is_accepted(checker):
    """timeout=None checks without a limit (and a correct function passes)."""
    _, fn, kwargs = B.CORRECT[checker][0]
    assert getattr(E, checker)(fn, **kwargs, timeout=None) is None


@pytest.mark.parametrize("value, error", [
    ("10", TypeError), (True, TypeError), ([1], TypeError), (0, ValueError), (-1.0, ValueError),
    (math.nan, ValueError), (math.inf, ValueError)])
@pytest.mark.parametrize("checker", CHECKERS)
def test_bad_timeout_values_are_refused(checker, value, error):
    """A timeout that is not a number is a TypeError, one <= 0, NaN or inf a ValueError, both naming `timeout`."""
    with pytest.raises(error, match=r"timeout must be .*got"):
        getattr(E, checker)(R.softmax, timeout=value)


@pytest.mark.parametrize("checker", CHECKERS)
def test_every_checker_documents_its_timeout(checker):
    """Every checker has a keyword `timeout` (default E.TIMEOUT) that its docstring and the module docstring mention."""
    check = getattr(E, checker)
    parameter = inspect.signature(check).parameters["timeout"]
    assert parameter.kind is inspect.Parameter.KEYWORD_ONLY and parameter.default == E.TIMEOUT
    assert "timeout" in check.__doc__ and "timeout=" in E.__doc__


# ---------------------------------------------------------------------------------------------------------------
# Diagnoses that used to be "none of the known bugs".
# ---------------------------------------------------------------------------------------------------------------

NEW_BUGS = [  # (buggy implementation in tests/exercise_bugs.py, its checker, the diagnosis it must get)
    ("sdpa_ignores_mask", "check_scaled_dot_product_attention", "mask_ignored"),
    ("mha_ignores_mask", "check_multi_head_attention", "mask_ignored"),
    ("mha_torch_ignores_mask", "check_multi_head_attention", "mask_ignored"),
    ("online_ignores_mask", "check_online_softmax_attention", "mask_ignored"),
    ("grad_ignores_mask", "check_scaled_dot_product_attention_grad", "mask_ignored"),
    ("sdpa_returns_weights_first", "check_scaled_dot_product_attention", "outputs_swapped"),
    ("sdpa_torch_returns_weights_first", "check_scaled_dot_product_attention", "outputs_swapped"),
    ("mha_returns_weights_first", "check_multi_head_attention", "outputs_swapped"),
    ("decode_returns_caches_swapped", "check_decode_step", "outputs_swapped"),
    ("grad_returns_dv_first", "check_scaled_dot_product_attention_grad", "outputs_swapped"),
    ("causal_one_future_key", "check_causal_mask", "causal_one_future_key"),
    ("causal_torch_range_to_i_plus_1", "check_causal_mask", "causal_one_future_key"),
    ("decode_mask_one_future_key", "check_decode_step", "causal_one_future_key"),
]


def _diagnosis(name, checker):
    with pytest.raises(E.ExerciseError) as info:
        getattr(E, checker)(getattr(B, name))
    return info.value


@pytest.mark.parametrize("name, checker, diagnosis", NEW_BUGS, ids=[name for name, _, _ in NEW_BUGS])
def test_a_new_bug_is_named(name, checker, diagnosis):
    """Each of these buggy implementations is rejected with its own diagnosis, description and hint."""
    error = _diagnosis(name, checker)
    assert error.bug == diagnosis, str(error)
    known = E.KNOWN_BUGS[diagnosis]
    assert f"This matches a known bug: {known.description}" in str(error) and f"Hint: {known.hint}" in str(error)


def test_an_ignored_mask_is_caught_on_the_first_masked_case():
    """An ignored mask is named on the first case that has a mask (and passes the cases without one)."""
    error = _diagnosis("sdpa_ignores_mask", "check_scaled_dot_product_attention")
    assert error.bug == "mask_ignored" and error.case.startswith("causal mask"), str(error)


def test_swapped_outputs_say_which_order_was_returned():
    """The message for swapped outputs shows the order returned and the order expected."""
    message = str(_diagnosis("sdpa_returns_weights_first", "check_scaled_dot_product_attention"))
    assert "returned (weights, out) instead of (out, weights)" in message, message
    message = str(_diagnosis("grad_returns_dv_first", "check_scaled_dot_product_attention_grad"))
    assert "returned (dv, dk, dq) instead of (dq, dk, dv)" in message, message


def test_every_new_bug_has_an_equation_or_none_and_a_hint():
    """The new catalogue entries have a description, a hint, and the book equation they break (None for the order)."""
    for diagnosis in ("mask_ignored", "outputs_swapped", "causal_one_future_key"):
        known = E.KNOWN_BUGS[diagnosis]
        assert known.description and known.hint
        assert (known.equation is None) == (diagnosis == "outputs_swapped")


@pytest.mark.parametrize("checker", ["check_scaled_dot_product_attention", "check_multi_head_attention",
                                     "check_causal_mask", "check_decode_step",
                                     "check_online_softmax_attention", "check_scaled_dot_product_attention_grad"])
def test_correct_implementations_are_still_accepted(checker):
    """The correct implementations of the checkers that gained diagnoses still pass, with the default timeout."""
    for _, fn, kwargs in B.CORRECT[checker]:
        assert getattr(E, checker)(fn, **kwargs) is None
