"""Glued text that the data picks at build time, with every text it could have picked.

A page may paste a word chosen by a measurement ("the time {grew}", "{shrank}" or "{changed by no amount these
rounds resolve}"). Which one the build shows depends on the machine that runs it, so the Chinese edition must hold a
translation of each, not only of the one this machine printed. ``glue_one_of`` glues the chosen text under its name
and the full list under ``name + CHOICES_SUFFIX``: ``tools/i18n.py update`` lists every choice in glue.po, and the
Chinese build (``book/_ext/i18n_glue.py``) fails on a choice without a translation whichever one was picked.

Book: part I, 'One head or many' (the CPU timing verdicts); part II, 'The KV cache'.
"""

from __future__ import annotations

from collections.abc import Collection

__all__ = ["glue_one_of", "CHOICES_SUFFIX"]

# The glue key of the list of possible texts: "<name>__choices" (never pasted; read by the i18n tools).
CHOICES_SUFFIX = "__choices"


def glue_one_of(name: str, value: str, choices: Collection[str]) -> str:
    """Glue ``value`` as ``name`` (not displayed), and ``choices``, every text the cell could have glued there, as
    ``name + CHOICES_SUFFIX``; return ``value``. ValueError when ``value`` is not one of ``choices``."""
    from myst_nb import glue

    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    if isinstance(choices, str) or not all(isinstance(c, str) for c in choices) or not choices:
        raise TypeError(f"choices must be a non-empty collection of str, got {choices!r}")
    if value not in choices:
        raise ValueError(f"value of glue {name!r} must be one of its choices {list(choices)!r}, got {value!r}")
    glue(name, value, display=False)
    glue(name + CHOICES_SUFFIX, list(dict.fromkeys(choices)), display=False)
    return value
