"""The language of the checkers' messages: English (the default) or Chinese (``"zh"``, the book's Chinese edition).

``set_language("zh")`` (or the environment variable ``MHA_EXERCISES_LANGUAGE=zh`` before the first check) makes every
message of ``mha.exercises`` Chinese: the framing ("your function raised ...", "expected ..., got ..."), the known
bugs' descriptions and hints, the chapters and formulas named, each case's note and the description of what is
special about it. Numbers, shapes, code and the names of arguments stay as they are. The Chinese texts are
``mha.exercises.messages_zh.MESSAGES``, keyed by the English; a text with no Chinese there is shown in English and
remembered (:func:`untranslated`), which tests/test_exercises.py checks stays empty for every checker.
"""

from __future__ import annotations

import os
import re

LANGUAGES = ("en", "zh")
ENVIRONMENT = "MHA_EXERCISES_LANGUAGE"
_state = {"language": None}
_untranslated: set[str] = set()


def _check(language, what: str) -> str:
    if not isinstance(language, str):
        raise TypeError(f"{what} must be a str, one of {LANGUAGES}, got {type(language).__name__}")
    if language not in LANGUAGES:
        raise ValueError(f"{what} must be one of {LANGUAGES}, got {language!r}")
    return language


def set_language(language: str) -> None:
    """The language of every later message: ``"en"`` (English, the default) or ``"zh"`` (Chinese)."""
    _state["language"] = _check(language, "language")


def get_language() -> str:
    """The language set by :func:`set_language`, else ``$MHA_EXERCISES_LANGUAGE``, else ``"en"``."""
    if _state["language"] is None:
        _state["language"] = _check(os.environ.get(ENVIRONMENT, "en"), f"${ENVIRONMENT}")
    return _state["language"]


def tr(text: str) -> str:
    """``text`` in the current language (English texts are the keys; an empty text stays empty)."""
    if not text or get_language() == "en":
        return text
    from mha.exercises.messages_zh import MESSAGES

    found = MESSAGES.get(text)
    if found is None:
        _untranslated.add(text)
        return text
    return found


# A case's name joins short phrases with ": ", ", " and "; " outside brackets ("large logits: every entry near
# +1000", "no biases, mask=None", "x_q (2, 5, 12)"). A phrase with a word in it (three letters or more, not part of a
# name such as n_heads, mask= or x.max() is translated; shapes, flags and code are kept.
_SEPARATORS = (": ", ", ", "; ")
_SEPARATORS_ZH = {": ": "：", ", ": "，", "; ": "；"}  # the same separators in Chinese punctuation
_WORD = re.compile(r"(?<![\w=.\-])[A-Za-z]{3,}(?![\w=(.])")
_NUMBER = re.compile(r"\d+")


def _split(name: str) -> list[str]:
    """``name`` cut at the separators outside brackets: phrases at even indices, separators at odd ones."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(name):
        char = name[i]
        depth += (char in "([") - (char in ")]")
        separator = next((sep for sep in _SEPARATORS if name.startswith(sep, i)), None) if depth == 0 else None
        if separator:
            parts += [name[start:i], separator]
            i = start = i + len(separator)
            continue
        i += 1
    return parts + [name[start:]]


def case_phrases(name: str) -> list[str]:
    """The phrases of a case's name that are translated, as :data:`MESSAGES` keys them: numbers as {0}, {1}, ..."""
    return [_NUMBER.sub(_numbered(), part) for part in _split(name)[::2] if _WORD.search(part)]


def _numbered():
    count = iter(range(1000))
    return lambda match: "{" + str(next(count)) + "}"


def _phrase(text: str) -> str:
    """A phrase of a case's name translated: its numbers taken out, the template looked up, the numbers put back in
    whatever order the translation needs."""
    numbers = _NUMBER.findall(text)
    template = tr(_NUMBER.sub(_numbered(), text))
    return template.format(*numbers) if numbers else template


def case_name(name: str) -> str:
    """A case's name in the current language: each of its worded phrases translated, shapes and flags kept."""
    if get_language() == "en":
        return name
    parts = _split(name)
    return "".join(_phrase(part) if i % 2 == 0 and _WORD.search(part) else
                   _SEPARATORS_ZH[part] if i % 2 else part for i, part in enumerate(parts))


def untranslated() -> list[str]:
    """The English texts a message needed in Chinese and ``messages_zh`` lacked, since the process started."""
    return sorted(_untranslated)
