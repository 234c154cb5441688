"""Time limits: stop a call of your function that runs longer than ``timeout`` seconds.

``TimeLimit(seconds)``: ``start()`` ... ``stop()`` raises :class:`TimedOut` in the calling thread once ``seconds``
have passed in between (SIGALRM in the main thread, a watchdog thread elsewhere). The checkers turn it into an
``ExerciseTimeout`` naming the case (``mha.exercises.runner``).
"""

from __future__ import annotations

import ctypes
import signal
import threading
import time

from mha._checks import check_float


class TimedOut(BaseException):
    """Raised inside fn when its time is up: a BaseException, like KeyboardInterrupt, so that an ``except Exception``
    in fn (or in the checker) does not swallow it. The checker turns it into an ExerciseTimeout."""


class TimeLimit:
    """``start()`` ... ``stop()`` raises TimedOut in the calling thread once ``seconds`` have passed in between.

    The main thread uses SIGALRM (signal.setitimer), which also interrupts time.sleep and other blocking calls;
    other threads (no signal handlers there), and the main thread when an alarm set by someone else is due first,
    use a watchdog thread. After ``stop()`` nothing is left: no timer or handler of ours, no pending exception; the
    alarm we replaced gets its handler back and its timer, less the time spent. Call ``stop()`` in a ``finally``
    whose ``try`` includes ``start()`` (which is not a context manager for that reason: a timeout due while
    ``__enter__`` returns would skip ``__exit__``).
    """

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.theirs = None  # (handler, delay, interval) of the alarm we replaced, while ours is set
        self.watcher = None

    def start(self):
        self.begin = time.monotonic()
        if (hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGALRM) is not None):  # None: a handler installed outside Python
            delay, interval = signal.getitimer(signal.ITIMER_REAL)
            if not 0 < delay <= self.seconds:  # their alarm, if any, is due after ours: replace it for now
                self.theirs = (signal.signal(signal.SIGALRM, self._on_alarm), delay, interval)
                signal.setitimer(signal.ITIMER_REAL, self.seconds)
                return
        self._start_watchdog()

    def stop(self):
        if self.theirs is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            handler, delay, interval = self.theirs
            signal.signal(signal.SIGALRM, handler)  # first runs a still-pending alarm: _on_alarm ignores it here
            self.theirs = None
            if delay > 0:  # their timer, less the time spent here (due at once if it fell due meanwhile)
                signal.setitimer(signal.ITIMER_REAL, max(delay - (time.monotonic() - self.begin), 1e-6), interval)
        elif self.watcher is not None:
            self._stop_watchdog()

    def _on_alarm(self, signum, frame):
        # An alarm that arrives once fn has returned (inside stop) is ignored: fn did return in time.
        if frame is None or frame.f_code is not TimeLimit.stop.__code__:
            raise TimedOut

    # The watchdog: a thread that, when time is up, makes the calling thread raise TimedOut with
    # PyThreadState_SetAsyncExc. Its limits: the exception is raised only when that thread next runs Python bytecode,
    # so one long C call (time.sleep(1000), a huge matmul, a blocking read) is not interrupted until it returns; and
    # code that catches BaseException (a bare `except:`) can swallow it. The lock makes "fire" and "the call is
    # over" exclusive; an exception fired but not yet raised when the call ends is withdrawn.

    def _start_watchdog(self):
        self.target, self.lock, self.over = threading.get_ident(), threading.Lock(), threading.Event()
        self.done = self.fired = False

        def watch():
            if self.over.wait(self.seconds):
                return
            with self.lock:
                if not self.done:
                    self.fired = True
                    _set_async_exc(self.target, TimedOut)

        self.watcher = threading.Thread(target=watch, name="mha.exercises time limit", daemon=True)
        self.watcher.start()

    def _stop_watchdog(self):
        self.over.set()
        with self.lock:
            self.done = True
            if self.fired:
                _set_async_exc(self.target, None)  # withdraw it if it is still pending
        self.watcher.join()


def _set_async_exc(thread_id: int, exc) -> None:
    """Make thread ``thread_id`` raise ``exc`` at its next bytecode (None: withdraw a pending one). CPython only."""
    set_async_exc = getattr(getattr(ctypes, "pythonapi", None), "PyThreadState_SetAsyncExc", None)
    if set_async_exc is not None:
        set_async_exc(ctypes.c_ulong(thread_id), None if exc is None else ctypes.py_object(exc))


def check_timeout(timeout) -> float | None:
    """A checker's ``timeout``: None (no limit) or a number of seconds > 0 (TypeError/ValueError otherwise)."""
    if timeout is None:
        return None
    try:
        return check_float("timeout", timeout, minimum=0, min_inclusive=False)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{exc} (seconds each call of your function may take; None: no limit)") from None
