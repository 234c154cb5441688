"""hypothesis where it is installed (the test extra brings it); where it is not (a stock GPU image), stand-ins with
which a module still imports: every ``@given`` test is skipped, saying why, and the module's other tests run.

    from _optional_hypothesis import given, settings, st, arrays
"""

from __future__ import annotations

import pytest

try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
    from hypothesis.extra.numpy import arrays

    HAS_HYPOTHESIS = True
except ImportError as _error:
    HAS_HYPOTHESIS = False
    REASON = f"hypothesis is not installed ({_error}): this property test needs it"

    class _Anything:
        """Any attribute, call, decorator use or ``|`` of a strategy gives a stand-in: nothing is drawn."""

        def __getattr__(self, name):
            return self

        def __call__(self, *args, **kwargs):
            return self

        def __or__(self, other):
            return self

        __ror__ = __or__

    st = _Anything()
    arrays = _Anything()

    def given(*args, **kwargs):
        return pytest.mark.skip(reason=REASON)

    def settings(*args, **kwargs):
        return lambda test: test

__all__ = ["given", "settings", "st", "arrays", "HAS_HYPOTHESIS"]
