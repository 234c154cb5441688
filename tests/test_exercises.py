"""Tests for mha.exercises: the graded checkers accept correct code and diagnose the classic bugs.

* Every checker accepts the reference and at least two other correct implementations written independently in
  tests/exercise_bugs.py (loops over rows, torch versions, autograd), with NumPy inputs and with torch tensors.
* Every implementation of the buggy catalogue (tests/exercise_bugs.py) is rejected with exactly the diagnosis it
  must get, and every known bug the module can name is reached by at least one of them.
* No bug diagnosis for a correct implementation: correct code passes; correct code computed in float32 and correct
  results with noise added (both may fail the tolerance) are never given a bug's name.
* The messages name the case, the book's equation (whose label must exist in book/) and show numbers; bad arguments
  to a checker are TypeError/ValueError; `import mha.exercises` does not import torch.
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from _optional_hypothesis import given, settings, st  # skips the property tests where hypothesis is missing

import exercise_bugs as B
from mha import exercises as E
from mha.exercises import catalogue
from mha import reference as R

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
CHECKERS = [name for name in E.__all__ if name.startswith("check_")]
TORCH_IMPLEMENTATIONS = {  # correct torch implementations, also run with backend="torch" (non-contiguous tensors)
    "check_softmax": B.softmax_torch,
    "check_scaled_dot_product_attention": B.sdpa_torch,
    "check_split_heads": B.split_heads_torch,
    "check_merge_heads": B.merge_heads_torch,
    "check_multi_head_attention": B.mha_torch,
    "check_causal_mask": B.causal_torch,
    "check_repeat_kv": B.repeat_kv_torch,
    "check_decode_step": B.decode_torch,
    "check_online_softmax_attention": B.online_torch,
    "check_softmax_backward": B.softmax_backward_torch,
    "check_scaled_dot_product_attention_grad": B.sdpa_grad_autograd,
    "check_rope": B.rope_torch,
    "check_rope_decode_step": B.rope_decode_torch,
    "check_sliding_window_mask": B.window_torch,
    "check_sink_attention": B.sink_torch,
    "check_rms_norm": B.rms_norm_torch,
}
REFERENCE = {  # a correct implementation per checker, to perturb
    "check_softmax": R.softmax,
    "check_scaled_dot_product_attention": R.scaled_dot_product_attention,
    "check_split_heads": R.split_heads,
    "check_merge_heads": R.merge_heads,
    "check_multi_head_attention": R.multi_head_attention,
    "check_repeat_kv": R.repeat_kv,
    "check_decode_step": B.decode_np,
    "check_online_softmax_attention": R.online_softmax_attention,
    "check_softmax_backward": R.softmax_backward,
    "check_scaled_dot_product_attention_grad": R.scaled_dot_product_attention_grad,
    "check_rope": R.rope,
    "check_rope_decode_step": B.rope_decode_reference,
    "check_sink_attention": B.sink_reference,
    "check_rms_norm": R.rms_norm,
}


def _correct_params():
    for checker, implementations in B.CORRECT.items():
        for label, fn, kwargs in implementations:
            yield pytest.param(checker, fn, kwargs, id=f"{checker}-{label}")
    for checker, fn in TORCH_IMPLEMENTATIONS.items():
        kwargs = {"gqa": True} if checker == "check_multi_head_attention" else {}
        yield pytest.param(checker, fn, {**kwargs, "backend": "torch"}, id=f"{checker}-torch-backend")


# ---------------------------------------------------------------------------------------------------------------
# Correct implementations pass.
# ---------------------------------------------------------------------------------------------------------------


def test_every_checker_has_three_correct_implementations():
    assert set(B.CORRECT) == set(CHECKERS)
    for checker, implementations in B.CORRECT.items():
        labels = [label for label, _, _ in implementations]
        assert len(labels) >= 3, checker
        assert any("reference" in label for label in labels) or checker in ("check_causal_mask", "check_decode_step")


@pytest.mark.parametrize("checker, fn, kwargs", list(_correct_params()))
def test_correct_implementation_passes(checker, fn, kwargs, record_property):
    start = time.perf_counter()
    assert getattr(E, checker)(fn, **kwargs) is None
    record_property("seconds", round(time.perf_counter() - start, 4))  # timed, not asserted


def test_auto_backend_switches_to_torch_for_a_torch_only_function():
    """A function that only works on tensors is given tensors, and still checked on every case."""
    seen = []

    def torch_only_softmax(x, axis=-1):
        assert isinstance(x, torch.Tensor)  # fails on NumPy input
        seen.append(x.is_contiguous())
        return torch.softmax(x, dim=axis)

    E.check_softmax(torch_only_softmax)
    assert len(seen) >= 9 and not all(seen)  # the non-contiguous case reached it as a non-contiguous tensor


# ---------------------------------------------------------------------------------------------------------------
# The catalogue of buggy implementations: each rejected with the right diagnosis.
# ---------------------------------------------------------------------------------------------------------------

ISSUE_BUGS = {  # the bugs the issue names, by their diagnosis
    "scale_d_model",  # scaling by the model width instead of the head size
    "split_no_transpose",  # splitting heads with a reshape and no transpose
    "mask_fill_large_negative",  # a -1e9 mask: a fully masked row gets uniform weights
    "no_max_subtraction",  # softmax without the max subtraction overflows
    "causal_top_left",  # a causal mask aligned top-left with a KV cache
    "kv_map_tile",  # key/value heads repeated in the wrong order for GQA
    "no_output_projection",  # a forgotten W^O
    "missing_bias_o",  # a forgotten bias
}
ISSUE_24_BUGS = {  # the bugs issue 24 names for part IV's checkers
    "window_one_key_too_many",  # the off-by-one window
    "rope_after_caching",  # RoPE applied after caching
    "rope_on_values",  # ... or to values
    "rope_wrong_pairing",  # the wrong pairing convention
    "sink_column_kept",  # the sink left in the output
}


def test_catalogue_covers_the_issue_and_every_known_bug():
    diagnoses = [bug.diagnosis for bug in B.BUGGY]
    assert len(B.BUGGY) >= 25
    assert ISSUE_BUGS <= set(diagnoses) and ISSUE_24_BUGS <= set(diagnoses)
    assert set(diagnoses) == set(E.KNOWN_BUGS)  # every diagnosis the module can give is reached
    assert {bug.checker for bug in B.BUGGY} == set(CHECKERS)
    assert len({bug.label for bug in B.BUGGY}) == len(B.BUGGY)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the buggy code overflows, as it should
@pytest.mark.parametrize("bug", B.BUGGY, ids=[bug.label for bug in B.BUGGY])
def test_buggy_implementation_gets_its_diagnosis(bug):
    with pytest.raises(E.ExerciseError) as info:
        getattr(E, bug.checker)(bug.fn, **bug.kwargs)
    error = info.value
    message = str(error)
    assert error.bug == bug.diagnosis, message
    assert isinstance(error, AssertionError)
    assert error.checker == bug.checker and message.startswith(f"{bug.checker}: case '{error.case}'")
    known = E.KNOWN_BUGS[bug.diagnosis]
    assert f"This matches a known bug: {known.description}" in message
    assert f"Hint: {known.hint}" in message
    if "differs from" in message:  # a wrong result (not an exception): the equation and a few numbers
        assert "(book Eq. " in message
        assert re.search(r"expected \w+(\[[\d,:]+\] = \[| of shape)", message), message


# ---------------------------------------------------------------------------------------------------------------
# No bug diagnosis for a correct implementation, even when it fails the tolerance.
# ---------------------------------------------------------------------------------------------------------------


def _float32(fn):
    """The same correct torch code, computed in float32."""
    def to32(x):
        if isinstance(x, np.ndarray) and x.dtype == np.float64:
            return torch.from_numpy(x).float()
        if isinstance(x, torch.Tensor) and x.dtype == torch.float64:
            return x.float()
        if isinstance(x, dict):
            return {key: to32(value) for key, value in x.items()}
        return x
    return lambda *args, **kwargs: fn(*map(to32, args), **{key: to32(value) for key, value in kwargs.items()})


@pytest.mark.parametrize("checker", sorted(TORCH_IMPLEMENTATIONS))
def test_float32_correct_code_is_never_given_a_bug(checker):
    kwargs = {"gqa": True} if checker == "check_multi_head_attention" else {}
    try:
        getattr(E, checker)(_float32(TORCH_IMPLEMENTATIONS[checker]), **kwargs)
    except E.ExerciseError as error:  # float32 may miss the float64 tolerance on large logits; that is no bug
        assert error.bug is None, str(error)
        assert "matches none of the known bugs" in str(error)


def _noisy(fn, relative, seed):
    """A correct implementation whose float results get random relative noise (too large for the tolerance)."""
    rng = np.random.default_rng(seed)

    def perturb(value):
        value = np.asarray(value.detach() if isinstance(value, torch.Tensor) else value, dtype=np.float64)
        return value * (1 + relative * rng.standard_normal(value.shape)) + relative * rng.standard_normal(value.shape)

    def noisy(*args, **kwargs):
        result = fn(*args, **kwargs)
        return tuple(map(perturb, result)) if isinstance(result, tuple) else perturb(result)
    return noisy


@settings(max_examples=25, deadline=None)
@given(checker=st.sampled_from(sorted(REFERENCE)), relative=st.floats(1e-3, 3e-2), seed=st.integers(0, 2**16))
def test_noisy_results_are_rejected_without_a_bug_name(checker, relative, seed):
    with pytest.raises(E.ExerciseError) as info:
        getattr(E, checker)(_noisy(REFERENCE[checker], relative, seed))
    assert info.value.bug is None, str(info.value)
    assert "matches none of the known bugs" in str(info.value)


# ---------------------------------------------------------------------------------------------------------------
# Messages, errors, and the book's labels.
# ---------------------------------------------------------------------------------------------------------------


def test_message_of_the_lecture_bug():
    with pytest.raises(E.ExerciseError) as info:
        E.check_multi_head_attention(B.mha_scaled_by_d_model)
    message = str(info.value)
    assert "check_multi_head_attention: case 'no biases: self-attention (x_kv is x_q), x_q (2, 5, 12)" in message
    assert "d_model=12, n_heads=3, n_kv_heads=3, head_dim=4" in message
    assert "out differs from Concat(head_1, ..., head_h) W^O + b^O" in message
    assert "(book Eq. multihead-output, part I 'From one head to h heads')" in message
    expected = re.search(r"expected (out\[[\d,:]+\]) = \[([^\]]+)\]", message)
    got = re.search(r"got +(out\[[\d,:]+\]) = \[([^\]]+)\]", message)
    assert expected and got and expected.group(1) == got.group(1)
    assert len(expected.group(2).split(",")) >= 3
    assert "scaled by 1/sqrt(d_model) instead of 1/sqrt(d_k)" in message
    assert "(book Eq. scaling-var-scaled, part I 'Why divide by √dₖ')" in message
    assert "also wrong: weights" in message


def test_the_numbers_shown_are_the_real_ones():
    """The expected numbers are the reference's, the actual ones the function's, at the same index."""
    with pytest.raises(E.ExerciseError) as info:
        E.check_split_heads(B.split_reshape_only)
    message = str(info.value)
    index, values = re.search(r"expected heads\[([\d,]+),(\d+):(\d+)\] = \[([^\]]+)\]", message).group(1, 4)
    y = np.random.default_rng(303).standard_normal((2, 5, 12))  # the checker's first case, same seed
    n, i, l = map(int, index.split(","))
    start = int(re.search(r"expected heads\[[\d,]+,(\d+):", message).group(1))
    shown = [float(v) for v in values.split(",")]
    np.testing.assert_allclose(shown, y[n, l, 4 * i + start:4 * i + start + len(shown)], rtol=1e-5)


def test_exceptions_are_reported_with_the_case_and_chained():
    def broken(q, k, v, mask=None, scale=None):
        raise ZeroDivisionError("my bug")

    with pytest.raises(E.ExerciseError) as info:
        E.check_scaled_dot_product_attention(broken, backend="numpy")
    assert "case 'no batch axes, L_q != L_kv, d_v != d_k: q (4, 8), k (6, 8), v (6, 5)" in str(info.value)
    assert "your function raised ZeroDivisionError: my bug" in str(info.value)
    assert isinstance(info.value.__cause__, ZeroDivisionError) and info.value.bug is None


def test_the_unfilled_stub_is_reported_once_with_a_hint():
    def my_attention(q, k, v, mask=None, scale=None):
        raise NotImplementedError  # your code here

    with pytest.raises(E.ExerciseError) as info:
        E.check_scaled_dot_product_attention(my_attention)  # auto: fails with NumPy and with torch, same error
    message = str(info.value)
    assert message.count("NotImplementedError") == 2  # the error once, and the hint
    assert "Hint: replace the stub's `raise NotImplementedError` with your code." in message


def test_an_error_only_on_batched_inputs_points_at_the_transpose():
    def two_d_only(q, k, v, mask=None, scale=None):
        weights = R.softmax(q @ k.T / np.sqrt(q.shape[-1]), mask=mask)  # k.T: right for 2-D k only
        return weights @ v, weights

    with pytest.raises(E.ExerciseError) as info:
        E.check_scaled_dot_product_attention(two_d_only)
    assert "case 'batch and head axes" in str(info.value)
    assert "k.T reverses" in str(info.value)


def test_head_dim_from_d_model_gets_the_case_note():
    def head_dim_from_width(x_q, x_kv, params, n_heads, mask=None):
        d_model = x_q.shape[-1]
        assert params["W_q"].shape[1] == d_model, "this reader assumes h * head_dim = d_model"
        return R.multi_head_attention(x_q, x_kv, params, n_heads, mask)

    with pytest.raises(E.ExerciseError) as info:
        E.check_multi_head_attention(head_dim_from_width)
    assert "case 'head_dim != d_model / n_heads" in str(info.value)
    assert "head_dim = W_q.shape[1] // n_heads" in str(info.value)


def test_wrong_kind_of_return_value():
    with pytest.raises(E.ExerciseError, match=r"returned one ndarray; expected a tuple of 2 arrays \(out, weights\)"):
        E.check_scaled_dot_product_attention(lambda q, k, v, mask=None, scale=None: np.zeros(3))
    with pytest.raises(E.ExerciseError, match="softmax is a str, not an array of numbers"):
        E.check_softmax(lambda x, axis=-1: "softmax")
    with pytest.raises(E.ExerciseError, match="returned a tuple of 2 values; expected one array"):
        E.check_softmax(lambda x, axis=-1: (x, x))


def test_a_whole_decode_feeds_back_the_returned_caches():
    """Single steps right, but the cache it returns drops the oldest position: only the whole decode sees it."""
    def forgetful(q, k_new, v_new, k_cache, v_cache):
        out, k_all, v_all = B.decode_np(q, k_new, v_new, k_cache, v_cache)
        return out, k_all, v_all if k_cache.shape[2] == 0 else v_all[:, :, 1:]

    try:
        E.check_decode_step(forgetful)
    except E.ExerciseError as error:
        assert "the new keys and values are not appended" not in str(error)
    else:  # the single-step cases catch it first (v_cache has the wrong length)
        raise AssertionError("not rejected")

    def forgets_after_prefill(q, k_new, v_new, k_cache, v_cache):
        out, k_all, v_all = B.decode_np(q, k_new, v_new, k_cache, v_cache)
        if q.shape[0] == 2 and q.shape[1] == 4 and k_cache.shape[2] == 3 and q.shape[2] == 1:
            return out, k_all[:, :, :0], v_all[:, :, :0]  # only inside the whole decode (after a 3-position prefill)
        return out, k_all, v_all

    with pytest.raises(E.ExerciseError) as info:
        E.check_decode_step(forgets_after_prefill)
    assert "case 'a whole decode" in str(info.value)


@pytest.mark.parametrize("checker", CHECKERS)
def test_bad_arguments_to_a_checker(checker):
    check = getattr(E, checker)
    with pytest.raises(TypeError, match=rf"{checker}: fn must be a callable .*got 3 of type int"):
        check(3)
    with pytest.raises(ValueError, match="backend must be one of 'auto', 'numpy', 'torch', got 'jax'"):
        check(R.softmax, backend="jax")
    with pytest.raises(TypeError, match="backend must be one of"):
        check(R.softmax, backend=1)


def test_tiled_flag_must_be_a_bool():
    with pytest.raises(TypeError, match="tiled must be True or False, got 1"):
        E.check_scaled_dot_product_attention_grad(R.scaled_dot_product_attention_grad, tiled=1)


def test_the_tiled_memory_case_measures_only_the_call():
    """The memory case counts what fn allocates during the call: an fn that allocates nothing new peaks near 0,
    one that makes a single L x L float64 array peaks at least at its size (tracemalloc sees NumPy's buffers)."""
    from mha.exercises.gradient_checks import TILED_LENGTH, _peak_bytes

    x = np.ones((TILED_LENGTH, 4))
    _, idle = _peak_bytes(lambda a: a, (x,), {})
    _, whole = _peak_bytes(lambda a: a @ a.T, (x,), {})
    assert idle < 2**16 and whole >= TILED_LENGTH**2 * 8


def test_gqa_flag_must_be_a_bool():
    with pytest.raises(TypeError, match="gqa must be True or False, got 'yes'"):
        E.check_multi_head_attention(R.multi_head_attention, gqa="yes")


@pytest.mark.parametrize("checker", ["check_rope", "check_rope_decode_step"])
def test_rope_style_must_be_a_pairing(checker):
    with pytest.raises(ValueError, match="style must be one of 'half', 'interleaved', got 'adjacent'"):
        getattr(E, checker)(R.rope, style="adjacent")
    with pytest.raises(TypeError, match="style must be one of 'half', 'interleaved'"):
        getattr(E, checker)(R.rope, style=1)


def test_message_of_the_off_by_one_window():
    """The window that counts only past keys: the case, the mask rows that differ, the equation and the bug."""
    with pytest.raises(E.ExerciseError) as info:
        E.check_sliding_window_mask(B.window_counts_past_keys)
    message = str(info.value)
    assert message.startswith("check_sliding_window_mask: case 'self-attention (square): l_q=6, l_kv=6, window=3'")
    assert "mask differs from mask[i, j] = (p - window < j <= p) with p = l_kv - l_q + i, booleans" in message
    assert "(book Eq. window-mask, part IV 'Sliding windows and attention sinks')" in message
    expected = re.search(r"expected (mask\[[\d,:]+\]) = \[([TF ]+)\]", message)
    got = re.search(r"got +(mask\[[\d,:]+\]) = \[([TF ]+)\]", message)
    assert expected and got and expected.group(1) == got.group(1) and expected.group(2) != got.group(2)
    assert info.value.bug == "window_one_key_too_many" and "window + 1 keys" in message


def test_message_of_rope_after_caching_names_the_cache():
    """A step that caches raw keys: out is right on the first case, the returned key cache is not; the message says
    so and names the other equation of the bug only when it differs."""
    with pytest.raises(E.ExerciseError) as info:
        E.check_rope_decode_step(B.rope_decode_torch_caches_raw_keys)
    message = str(info.value)
    assert "case 'one decoding step: n_heads=2, n_kv_heads=2, 1 new position after 4 cached (at position 4)" in message
    assert "k_cache differs from [K_cache; R k_new]" in message and "(right: out, v_cache)" in message
    assert "(book Eq. rope-cache, part IV 'Rotary position embeddings (RoPE)')" in message
    assert info.value.bug == "rope_after_caching" and "RoPE is applied after caching" in message


def test_the_sink_column_left_in_the_weights_is_named_with_either_placement():
    for fn in (B.sink_weights_with_column, B.sink_torch_column_first):
        with pytest.raises(E.ExerciseError) as info:
            E.check_sink_attention(fn)
        assert info.value.bug == "sink_column_kept", str(info.value)
        assert "expected weights of shape (1, 4, 6), got shape (1, 4, 7)" in str(info.value)


def test_interleaved_rope_is_checked_against_its_own_convention():
    """The interleaved reference passes with style="interleaved" and is named rope_wrong_pairing with the default."""
    interleaved = B.CORRECT["check_rope"][3][1]
    assert E.check_rope(interleaved, style="interleaved") is None
    with pytest.raises(E.ExerciseError) as info:
        E.check_rope(interleaved)
    assert info.value.bug == "rope_wrong_pairing" and "pairs (x[i], x[i + d/2])" in str(info.value)


def _book_labels():
    text = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "book").rglob("*.md"))
    labels = set(re.findall(r"^\$\$ \(([\w-]+)\)", text, flags=re.M)) | set(re.findall(r":label: ([\w-]+)", text))
    titles = set(re.findall(r"^# (.+)$", text, flags=re.M))
    return labels, titles


PART4_PAGES = {  # part IV's chapters (issue 24) and the equations their checkers name
    catalogue.ROPE_CH: "part4/rope.md",
    catalogue.WINDOWS_CH: "part4/windows_and_sinks.md",
    catalogue.QK_NORM_CH: "part4/qk_norm.md",
    catalogue.LATENT_CH: "part4/latent_attention.md",  # issue 25
    catalogue.GATE_CH: "part4/gated_attention.md",
}


def _named_equations():
    equations = {value for value in vars(catalogue).values() if isinstance(value, E.Equation)}  # every EQ_*
    return equations | {bug.equation for bug in E.KNOWN_BUGS.values() if bug.equation is not None}


def _unwritten_chapters():
    """Part IV's chapters whose page does not exist yet: their equations are checked once it does (below)."""
    return {chapter for chapter, page in PART4_PAGES.items() if not (ROOT / "book" / page).exists()}


def test_every_equation_named_exists_in_the_book():
    labels, titles = _book_labels()
    equations = _named_equations()
    assert equations
    unwritten = _unwritten_chapters()
    for equation in equations:
        if equation.chapter in unwritten:
            continue
        assert equation.label in labels, equation
        title = re.search(r"'(.+)'", equation.chapter).group(1)
        assert title in titles, equation
    cited = set(re.findall(r"(?:Eqs?\.|Theorem|Lemma|Proposition) ([a-z]+-[\w-]+)", E.__doc__ + "".join(
        getattr(E, name).__doc__ for name in CHECKERS) + "".join(b.hint for b in E.KNOWN_BUGS.values())))
    pending = {equation.label for equation in equations if equation.chapter in unwritten}
    assert cited and cited - pending <= labels, cited - pending - labels


@pytest.mark.parametrize("chapter", sorted(PART4_PAGES), ids=[PART4_PAGES[c] for c in sorted(PART4_PAGES)])
def test_part4_equations_are_defined_on_their_own_page(chapter):
    """Each part IV equation a checker names is labelled on its chapter's page, whose title the chapter string
    quotes. Skipped while the page is being written (then the test above leaves its equations out)."""
    page = ROOT / "book" / PART4_PAGES[chapter]
    if not page.exists():
        pytest.skip(f"book/{PART4_PAGES[chapter]} is not written yet")
    text = page.read_text(encoding="utf-8")
    labels = set(re.findall(r"^\$\$ \(([\w-]+)\)", text, flags=re.M)) | set(re.findall(r":label: ([\w-]+)", text))
    wanted = {equation.label for equation in _named_equations() if equation.chapter == chapter}
    assert wanted and wanted <= labels, wanted - labels
    title = re.search(r"'(.+)'", chapter).group(1)
    assert f"\n# {title}\n" in "\n" + text, f"book/{PART4_PAGES[chapter]} must be titled '# {title}'"


def test_import_is_cheap_and_numpy_checks_do_not_import_torch():
    code = ("import sys, mha; from mha import exercises, reference; "
            "exercises.check_softmax(reference.softmax); "
            "exercises.check_multi_head_attention(reference.multi_head_attention, gqa=True); "
            "exercises.check_rope(reference.rope); exercises.check_rms_norm(reference.rms_norm); "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "exercises" in __import__("mha").__all__


# ---------------------------------------------------------------------------------------------------------------
# The book: every part I, II and IV chapter ends with a write-it-yourself block whose solution passes its checker,
# or points to the chapter whose block it would repeat.
# ---------------------------------------------------------------------------------------------------------------

CHAPTERS = sorted((ROOT / "book").glob("part[12]/*.md")) + [  # and part IV's chapters once they are written
    path for path in (ROOT / "book" / page for page in sorted(PART4_PAGES.values())) if path.exists()]
BLOCK = re.compile(
    r"^% write-it-yourself: (?P<checkers>[\w, ]+)\n(?P<body>.*?)^% end write-it-yourself\n", re.M | re.S)


# Chapters whose write-it-yourself exercise would repeat another's: "write multi-head attention" is kept where it
# teaches most (worked_example, after the numbers by hand; mqa_gqa, in torch with GQA), the softmax of every head in
# counting (one line per counted operation); these point there.
POINTS_TO_ANOTHER = {"part1/intuition": "{doc}`worked_example`", "part1/layer_in_code": "{doc}`worked_example`",
                     "part1/one_vs_many": "{doc}`../part2/counting`"}


def _chapter_id(chapter) -> str:
    return f"{chapter.parent.name}/{chapter.stem}"


@pytest.mark.parametrize("chapter", [c for c in CHAPTERS if _chapter_id(c) in POINTS_TO_ANOTHER], ids=_chapter_id)
def test_a_chapter_without_its_own_block_points_to_the_exercise(chapter):
    text = chapter.read_text(encoding="utf-8")
    assert not BLOCK.search(text), "listed in POINTS_TO_ANOTHER but has a write-it-yourself block: drop it from there"
    exercises = text[text.index("## Exercises"):]
    assert POINTS_TO_ANOTHER[_chapter_id(chapter)] in exercises


@pytest.mark.parametrize("chapter", [c for c in CHAPTERS if _chapter_id(c) not in POINTS_TO_ANOTHER], ids=_chapter_id)
def test_chapter_ends_with_a_write_it_yourself_block_whose_solution_passes(chapter):
    text = chapter.read_text(encoding="utf-8")
    blocks = list(BLOCK.finditer(text))
    assert len(blocks) == 1, "one write-it-yourself block per chapter"
    block = blocks[0]
    assert text.index("## Exercises") < block.start() and not text[block.end():].strip(), "at the end of Exercises"
    checkers = [name.strip() for name in block["checkers"].split(",")]
    assert checkers and set(checkers) <= set(CHECKERS)
    body = block["body"]
    stub = re.search(r"^```python\n(.*?)^```", body, re.M | re.S).group(1)
    assert "raise NotImplementedError" in stub
    solution = re.search(r":class: dropdown\n```python\n(.*?)^```", body, re.M | re.S).group(1)
    # the verified cell: hidden, its printed line shown in Chinese on the Chinese page (translate-output)
    cell = re.search(r"^```\{code-cell\} ipython3\n:tags: \[remove-input, translate-output\]\n\n(.*?)^```", body,
                     re.M | re.S).group(1)
    assert cell.startswith(solution), "the verified code is the solution shown"
    assert all(f"exercises.{name}(" in cell for name in checkers)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(cell, str(chapter), "exec"), {})  # the checkers accept the book's solution
    assert printed.getvalue().startswith("The solution above passes")


def test_appendix_lists_every_checker():
    page = (ROOT / "book" / "appendix" / "exercises.md").read_text(encoding="utf-8")
    front_matter = (ROOT / "book" / "appendix" / "notation.md").read_text(encoding="utf-8").split("\n---\n")[0]
    assert page.startswith(front_matter + "\n---\n\n# Check your own implementation")
    for name in CHECKERS:
        assert f"| `{name}(fn" in page, name
