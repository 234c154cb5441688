"""The checkers' messages in Chinese (mha.exercises.language, issue 28): every text a message can show has its Chinese
in mha.exercises.messages_zh, each keeps the numbers, code and placeholders of its English, and a failing check
speaks Chinese from its first word to its hint while the numbers and shapes it shows stay those of the English
message."""

from __future__ import annotations

import ast
import re
import string
from pathlib import Path

import pytest

import exercise_bugs as B
from mha import exercises as E
from mha.exercises import catalogue, language

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "mha" / "exercises"
MODULES = ["attention_checks", "head_checks", "decoding_checks", "gradient_checks", "frontier_checks",
           "latent_checks", "gate_checks"]


def _tr_constants() -> set[str]:
    """Every string literal passed to tr() in the package's source (implicit concatenation joined by the parser)."""
    found = set()
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "tr" and node.args
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                found.add(node.args[0].value)
    return found


def _case_texts(monkeypatch) -> set[str]:
    """The labels, notes and output formulas of every case every checker builds (each run once on a correct
    implementation, its cases recorded on the way to the runner)."""
    import importlib

    found = set()
    for name in MODULES:
        module = importlib.import_module(f"mha.exercises.{name}")
        original = module.run_cases

        def recording(checker, fn, backend, inputs, outputs, cases, timeout, original=original):
            for case in cases:
                found.update(language.case_phrases(case.name))
                if case.note:
                    found.add(case.note)
            found.update(output.formula for output in outputs)
            return original(checker, fn, backend, inputs, outputs, cases, timeout)

        monkeypatch.setattr(module, "run_cases", recording)
    for checker, implementations in B.CORRECT.items():  # each checker's variants (gqa=, style=, tiled=) among them
        for _, fn, kwargs in implementations:
            getattr(E, checker)(fn, **kwargs)
    E.check_multi_head_attention(B.mha_torch, backend="torch", gqa=True)
    return found


def all_texts(monkeypatch) -> set[str]:
    texts = _tr_constants() | _case_texts(monkeypatch)
    for bug in catalogue.KNOWN_BUGS.values():
        texts |= {bug.description, bug.hint} | ({bug.equation.chapter} if bug.equation else set())
    texts |= {hint for _, hint in catalogue.ERROR_HINTS if hint not in catalogue.KNOWN_BUGS}
    texts |= {"with NumPy arrays", "with torch tensors"}  # the runner's two backends, passed to tr() by name
    texts |= {value.chapter for value in vars(catalogue).values() if isinstance(value, catalogue.Equation)}
    return {text for text in texts if text}


FIELDS = string.Formatter()
CODE = re.compile(r"`[^`]*`")
NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _fields(text: str) -> list[str]:
    return sorted(name for _, name, _, _ in FIELDS.parse(text) if name is not None)


@pytest.fixture
def zh():
    before = language.get_language()
    language.set_language("zh")
    yield
    language.set_language(before)


def test_every_text_a_message_can_show_has_its_chinese(monkeypatch):
    from mha.exercises.messages_zh import MESSAGES

    missing = sorted(all_texts(monkeypatch) - set(MESSAGES))
    assert not missing, f"{len(missing)} texts have no Chinese in mha.exercises.messages_zh, e.g. {missing[:5]}"


def test_each_chinese_text_keeps_its_placeholders_numbers_and_code():
    from mha.exercises.messages_zh import MESSAGES

    problems = []
    for english, chinese in MESSAGES.items():
        if not chinese or not re.search(r"[\u4e00-\u9fff]", chinese) and re.search(r"[a-z]{3,} [a-z]{3,}", english):
            problems.append(f"not translated: {english[:60]!r}")
        if _fields(english) != _fields(chinese):
            problems.append(f"placeholders differ: {english[:60]!r}: {_fields(english)} vs {_fields(chinese)}")
        if sorted(CODE.findall(english)) != sorted(CODE.findall(chinese)):
            problems.append(f"code spans differ: {english[:60]!r}")
        if sorted(NUMBER.findall(CODE.sub("", english))) != sorted(NUMBER.findall(CODE.sub("", chinese))):
            problems.append(f"numbers differ: {english[:60]!r}")
    assert not problems, "\n".join(problems[:20])


def test_no_chinese_text_is_stale(monkeypatch):
    """messages_zh holds no text the package no longer shows (an edited English leaves its old key behind)."""
    from mha.exercises.messages_zh import MESSAGES

    stale = sorted(set(MESSAGES) - all_texts(monkeypatch))
    assert not stale, f"{len(stale)} Chinese texts for English the package no longer has, e.g. {stale[:3]}"


def test_a_failing_check_speaks_chinese_with_the_english_numbers(zh):
    bug = catalogue.KNOWN_BUGS["no_max_subtraction"]

    def overflowing_softmax(x, axis=-1):
        import numpy as np

        with np.errstate(all="ignore"):
            e = np.exp(x)
            return e / e.sum(axis=axis, keepdims=True)

    with pytest.raises(E.ExerciseError) as chinese:
        E.check_softmax(overflowing_softmax)
    language.set_language("en")
    with pytest.raises(E.ExerciseError) as english:
        E.check_softmax(overflowing_softmax)
    language.set_language("zh")
    text = str(chinese.value)
    assert bug.description not in text and bug.hint not in text and "This matches a known bug" not in text
    from mha.exercises.messages_zh import MESSAGES

    assert MESSAGES[bug.description] in text and MESSAGES[bug.hint] in text
    assert chinese.value.bug == english.value.bug == "no_max_subtraction"
    assert NUMBER.findall(CODE.sub("", text)) and sorted(NUMBER.findall(text)) == sorted(
        NUMBER.findall(str(english.value))), "the Chinese message shows other numbers than the English one"
    assert not language.untranslated(), language.untranslated()


def test_the_language_setting_is_checked():
    with pytest.raises(ValueError, match="one of"):
        language.set_language("fr")
    with pytest.raises(TypeError, match="must be a str"):
        language.set_language(None)
    assert E.set_language is language.set_language and E.get_language is language.get_language
