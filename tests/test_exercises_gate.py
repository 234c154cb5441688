"""Tests for ``mha.exercises.check_gated_attention`` (book/part4/gated_attention.md): it accepts correct gated layers
and names the classic bugs of the gate.

* Correct implementations, written here independently of ``mha.exercises`` (NumPy by hand, plain Python loops, torch
  by hand, the package's module and its NumPy reference), pass, with NumPy inputs and with torch tensors.
* Each buggy implementation below, a whole function with its mistake written out where a reader makes it (the
  gate after W^O, on the attention weights, on the values, from x_kv or from the output, headwise and elementwise
  confused by np.tile or a reshape without the transpose, no sigmoid, ...), is rejected with exactly the diagnosis
  it must get, and every gate bug of ``KNOWN_BUGS`` is reached by one of them. None is generated from the
  simulator's knobs.
* Correct code in float32, and correct results with noise, are never given a bug's name; the messages name the case,
  the equation (whose label exists on the chapter's page) and the bug; the chapter's write-it-yourself solution
  passes.
"""

from __future__ import annotations

import contextlib
import io
import math
import re
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import pytest
import torch

import mha
from mha import exercises as E
from mha import reference as R
from mha.exercises import catalogue

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "book" / "part4" / "gated_attention.md"
GATE_BUGS = {bug for bug, known in E.KNOWN_BUGS.items() if known.equation == catalogue.EQ_GATE_LAYER}
NAMED_IN_THE_ISSUE = {  # the bugs the chapter's brief names
    "gate_after_output_projection",  # the gate applied after W^O
    "gate_on_attention_weights",  # ... to the attention weights instead of the head outputs
    "gate_from_kv_input",  # ... computed from the keys' / values' input
    "gate_from_output",  # ... or from the output
    "gate_tiled",  # headwise / elementwise confusion (the wrong broadcast)
    "gate_split_no_transpose",  # ... the gate's head axis not moved
    "gate_no_sigmoid",  # a missing sigmoid
}


# ---------------------------------------------------------------------------------------------------------------
# Correct pieces, written here (NumPy).
# ---------------------------------------------------------------------------------------------------------------


def _np(x):
    return x.detach().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float64)


def _split(y, n):
    N, L, width = y.shape
    return y.reshape(N, L, n, width // n).transpose(0, 2, 1, 3)  # (N, n, L, width / n)


def _merge(y):
    N, n, L, d = y.shape
    return y.transpose(0, 2, 1, 3).reshape(N, L, n * d)


def _softmax_rows(scores, mask=None):
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    e = np.exp(scores - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def _bias(p, name):
    return p[name] if name in p else 0.0


def _qkv(x_q, x_kv, p, h):
    """The heads' queries, and keys and values repeated for their query heads: (N, h, L, head_dim) each."""
    head_dim = p["W_q"].shape[1] // h
    g = p["W_k"].shape[1] // head_dim
    q = _split(x_q @ p["W_q"] + _bias(p, "b_q"), h)
    k = np.repeat(_split(x_kv @ p["W_k"] + _bias(p, "b_k"), g), h // g, axis=1)
    v = np.repeat(_split(x_kv @ p["W_v"] + _bias(p, "b_v"), g), h // g, axis=1)
    return q, k, v


def _attention(x_q, x_kv, p, h, mask=None):
    """Y (N, h, L_q, head_dim), the heads' ungated outputs, and the weights (N, h, L_q, L_kv)."""
    q, k, v = _qkv(x_q, x_kv, p, h)
    weights = _softmax_rows(q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1]), mask)
    return weights @ v, weights


def _gate(x, p):
    """sigmoid(x W_gate + b_gate), (N, L, h or h*head_dim)."""
    with np.errstate(over="ignore"):  # exp(3000) = inf: 1 / inf = 0, the right gate
        return 1.0 / (1.0 + np.exp(-(x @ p["W_gate"] + _bias(p, "b_gate"))))


def _gate_heads(G, h):
    """The gate against the (N, h, L, head_dim) heads: (N, h, L, 1) headwise, (N, h, L, head_dim) elementwise."""
    return G.transpose(0, 2, 1)[..., None] if G.shape[-1] == h else _split(G, h)


def _out(Z, p):
    return _merge(Z) @ p["W_o"] + _bias(p, "b_o")


# ---------------------------------------------------------------------------------------------------------------
# Correct implementations.
# ---------------------------------------------------------------------------------------------------------------


def gated_numpy(x_q, x_kv, params, n_heads, gate, mask=None):
    Y, weights = _attention(x_q, x_kv, params, n_heads, mask)
    return _out(Y * _gate_heads(_gate(x_q, params), n_heads), params), weights


def gated_loop(x_q, x_kv, params, n_heads, gate, mask=None):
    """Every sequence, head, query and coordinate in plain Python, the gate one number at a time."""
    x_q, x_kv = _np(x_q), _np(x_kv)
    p = {key: _np(value) for key, value in params.items()}
    N, L_q, d_model = x_q.shape
    L_kv = x_kv.shape[1]
    hd = p["W_q"].shape[1] // n_heads
    g = p["W_k"].shape[1] // hd
    allowed = np.ones((N, n_heads, L_q, L_kv), dtype=bool) if mask is None else np.broadcast_to(
        _np(mask).astype(bool), (N, n_heads, L_q, L_kv))
    out = np.zeros((N, L_q, d_model)) + _bias(p, "b_o")
    weights = np.zeros((N, n_heads, L_q, L_kv))
    for b in range(N):
        for i in range(n_heads):
            qc = slice(i * hd, (i + 1) * hd)
            c = i // (n_heads // g)
            kc = slice(c * hd, (c + 1) * hd)
            k = x_kv[b] @ p["W_k"][:, kc] + _bias(p, "b_k")[kc] if "b_k" in p else x_kv[b] @ p["W_k"][:, kc]
            v = x_kv[b] @ p["W_v"][:, kc] + _bias(p, "b_v")[kc] if "b_v" in p else x_kv[b] @ p["W_v"][:, kc]
            for t in range(L_q):
                q = x_q[b, t] @ p["W_q"][:, qc] + (p["b_q"][qc] if "b_q" in p else 0.0)
                keys = [j for j in range(L_kv) if allowed[b, i, t, j]]
                head = np.zeros(hd)
                if keys:
                    logits = [float(q @ k[j]) / math.sqrt(hd) for j in keys]
                    top = max(logits)
                    e = [math.exp(s - top) for s in logits]
                    for j, ej in zip(keys, e):
                        weights[b, i, t, j] = ej / sum(e)
                        head += ej / sum(e) * v[j]
                for col in range(hd):
                    column = i if gate == "headwise" else i * hd + col
                    a = float(x_q[b, t] @ p["W_gate"][:, column]) + (p["b_gate"][column] if "b_gate" in p else 0.0)
                    head[col] *= 0.5 * (1.0 + math.tanh(a / 2))  # sigmoid(a), never overflows
                out[b, t] += head @ p["W_o"][qc]
    return out, weights


def gated_torch(x_q, x_kv, params, n_heads, gate, mask=None):
    """By hand in torch (tensors in, tensors out); the gate split like the queries with view and transpose."""
    t = lambda a: a if isinstance(a, torch.Tensor) else torch.from_numpy(np.asarray(a))
    x_q, x_kv = t(x_q), t(x_kv)
    p = {key: t(value) for key, value in params.items()}
    N, L_q, _ = x_q.shape
    L_kv = x_kv.shape[1]
    hd = p["W_q"].shape[1] // n_heads
    g = p["W_k"].shape[1] // hd

    def lin(x, name):
        y = x @ p[f"W_{name}"]
        return y + p[f"b_{name}"] if f"b_{name}" in p else y

    q = lin(x_q, "q").reshape(N, L_q, n_heads, hd).transpose(1, 2)
    k = lin(x_kv, "k").reshape(N, L_kv, g, hd).transpose(1, 2).repeat_interleave(n_heads // g, dim=1)
    v = lin(x_kv, "v").reshape(N, L_kv, g, hd).transpose(1, 2).repeat_interleave(n_heads // g, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(hd)
    if mask is not None:
        allowed = torch.broadcast_to(t(mask).bool(), s.shape)
        s = s.masked_fill(~allowed, float("-inf"))
        weights = torch.nan_to_num(torch.softmax(s, dim=-1)) * allowed.any(dim=-1, keepdim=True)
    else:
        weights = torch.softmax(s, dim=-1)
    G = torch.sigmoid(lin(x_q, "gate"))  # (N, L_q, h or h*hd)
    G = G.reshape(N, L_q, n_heads, -1).transpose(1, 2)  # (N, h, L_q, 1 or hd)
    Z = (weights @ v) * G
    return lin(Z.transpose(1, 2).reshape(N, L_q, n_heads * hd), "o"), weights


def gated_module(x_q, x_kv, params, n_heads, gate, mask=None):
    """The package's torch module, loaded with the case's weights."""
    p = {key: _np(value) for key, value in params.items()}
    hd = p["W_q"].shape[1] // n_heads
    layer = mha.MultiHeadAttention(p["W_q"].shape[0], n_heads, p["W_k"].shape[1] // hd, head_dim=hd,
                                   bias="b_q" in p, gate=gate, impl="naive").double().eval()
    layer.load_params(p)
    with torch.no_grad():
        out, weights = layer(torch.from_numpy(_np(x_q)), torch.from_numpy(_np(x_kv)),
                             mask=None if mask is None else torch.from_numpy(_np(mask).astype(bool)))
    return out, weights


# (label, fn, checker kwargs), as tests/exercise_bugs.py's CORRECT lists them
CORRECT = [
    ("reference (multi_head_attention, gate=)", R.multi_head_attention, {}),
    ("numpy by hand", gated_numpy, {}),
    ("loop", gated_loop, {}),
    ("torch by hand", gated_torch, {}),
    ("the package's module", gated_module, {}),
]


@pytest.mark.parametrize("fn, kwargs", [(fn, kw) for _, fn, kw in CORRECT], ids=[label for label, _, _ in CORRECT])
def test_correct_implementations_pass(fn, kwargs):
    assert E.check_gated_attention(fn, **kwargs) is None


def test_a_torch_implementation_passes_on_torch_tensors():
    seen = []

    def torch_only(x_q, x_kv, params, n_heads, gate, mask=None):
        assert isinstance(x_q, torch.Tensor) and isinstance(params["W_gate"], torch.Tensor)
        seen.append(x_q.is_contiguous())
        return gated_torch(x_q, x_kv, params, n_heads, gate, mask)

    assert E.check_gated_attention(torch_only, backend="torch") is None
    assert E.check_gated_attention(torch_only) is None  # auto: NumPy fails, tensors work
    assert len(seen) >= 24 and not all(seen)  # the non-contiguous case reached it non-contiguous


# ---------------------------------------------------------------------------------------------------------------
# Buggy implementations, each with the diagnosis it must get.
# ---------------------------------------------------------------------------------------------------------------


class Bug(NamedTuple):
    label: str
    fn: Callable
    diagnosis: str  # the expected ExerciseError.bug
    kwargs: dict = {}  # checker kwargs (the fields of tests/exercise_bugs.py's Bug, less the checker's name)


BUGGY: list[Bug] = []


def bug(diagnosis):
    def register(fn):
        BUGGY.append(Bug(fn.__name__, fn, diagnosis))
        return fn
    return register


@bug("gate_missing")
def gate_forgotten(x_q, x_kv, params, n_heads, gate, mask=None):
    Y, weights = _attention(x_q, x_kv, params, n_heads, mask)
    return _out(Y, params), weights


@bug("gate_no_sigmoid")
def gate_logits_only(x_q, x_kv, params, n_heads, gate, mask=None):
    Y, weights = _attention(x_q, x_kv, params, n_heads, mask)
    G = x_q @ params["W_gate"] + _bias(params, "b_gate")  # forgot the sigmoid
    return _out(Y * _gate_heads(G, n_heads), params), weights


@bug("gate_silu")
def gate_as_in_swiglu(x_q, x_kv, params, n_heads, gate, mask=None):
    Y, weights = _attention(x_q, x_kv, params, n_heads, mask)
    a = x_q @ params["W_gate"] + _bias(params, "b_gate")
    G = torch.nn.functional.silu(torch.from_numpy(a)).numpy()  # SwiGLU's gate, not the sigmoid
    return _out(Y * _gate_heads(G, n_heads), params), weights


@bug("gate_bias_ignored")
def gate_without_its_bias(x_q, x_kv, params, n_heads, gate, mask=None):
    Y, weights = _attention(x_q, x_kv, params, n_heads, mask)
    G = 1 / (1 + np.exp(-(x_q @ params["W_gate"])))  # b_gate never added
    return _out(Y * _gate_heads(G, n_heads), params), weights


@bug("gate_after_output_projection")
def gate_after_w_o(x_q, x_kv, params, n_heads, gate, mask=None):
    Y, weights = _attention(x_q, x_kv, params, n_heads, mask)
    out = _merge(Y) @ params["W_o"]
    G = _gate(x_q, params)
    if G.shape[-1] == out.shape[-1]:
        out = out * G
    else:  # headwise: cut the output into n_heads blocks
        out = (out.reshape(*out.shape[:-1], n_heads, -1) * G[..., None]).reshape(out.shape)
    return out + _bias(params, "b_o"), weights


@bug("gate_after_output_projection")
def gate_after_w_o_elementwise_only(x_q, x_kv, params, n_heads, gate, mask=None):
    """Only an elementwise gate as wide as d_model can be put after W^O: the headwise cases pass, and the first
    elementwise case names the bug (the output bias added before the gate, this time)."""
    if gate == "headwise":
        return gated_numpy(x_q, x_kv, params, n_heads, gate, mask)
    Y, weights = _attention(x_q, x_kv, params, n_heads, mask)
    return (_merge(Y) @ params["W_o"] + _bias(params, "b_o")) * _gate(x_q, params), weights


@bug("gate_on_attention_weights")
def gate_on_the_weights(x_q, x_kv, params, n_heads, gate, mask=None):
    q, k, v = _qkv(x_q, x_kv, params, n_heads)
    weights = _softmax_rows(q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1]), mask)
    weights = weights * _gate(x_q, params).transpose(0, 2, 1)[..., None]  # one gate per row of weights
    return _out(weights @ v, params), weights


@bug("gate_on_values")
def gate_on_the_values(x_q, x_kv, params, n_heads, gate, mask=None):
    q, k, v = _qkv(x_q, x_kv, params, n_heads)
    v = v * _gate_heads(_gate(x_kv, params), n_heads)  # each value by its own token's gate
    weights = _softmax_rows(q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1]), mask)
    return _out(weights @ v, params), weights


@bug("gate_from_kv_input")
def gate_from_x_kv(x_q, x_kv, params, n_heads, gate, mask=None):
    Y, weights = _attention(x_q, x_kv, params, n_heads, mask)
    return _out(Y * _gate_heads(_gate(x_kv, params), n_heads), params), weights


@bug("gate_from_output")
def gate_from_the_heads(x_q, x_kv, params, n_heads, gate, mask=None):
    Y, weights = _attention(x_q, x_kv, params, n_heads, mask)
    return _out(Y * _gate_heads(_gate(_merge(Y), params), n_heads), params), weights  # sigma(Y W_gate)


@bug("gate_from_output")
def gate_from_the_layer_output(x_q, x_kv, params, n_heads, gate, mask=None):
    Y, weights = _attention(x_q, x_kv, params, n_heads, mask)
    ungated = _out(Y, params)
    return _out(Y * _gate_heads(_gate(ungated, params), n_heads), params), weights


@bug("gate_tiled")
def gate_tiled_to_the_concat(x_q, x_kv, params, n_heads, gate, mask=None):
    Y, weights = _attention(x_q, x_kv, params, n_heads, mask)
    concat, G = _merge(Y), _gate(x_q, params)
    if G.shape[-1] == n_heads:
        G = np.tile(G, Y.shape[-1])  # the headwise gate made as wide as the concatenation, in the wrong order
    return concat * G @ params["W_o"] + _bias(params, "b_o"), weights


@bug("gate_split_no_transpose")
def gate_reshaped_without_transpose(x_q, x_kv, params, n_heads, gate, mask=None):
    Y, weights = _attention(x_q, x_kv, params, n_heads, mask)
    G = _gate(x_q, params)
    N, L_q, _ = G.shape
    return _out(Y * G.reshape(N, n_heads, L_q, -1), params), weights


@bug("gate_split_no_transpose")
def gate_broadcast_without_moving_the_head_axis(x_q, x_kv, params, n_heads, gate, mask=None):
    Y, weights = _attention(x_q, x_kv, params, n_heads, mask)
    G = _gate(x_q, params)
    G = G[..., None] if gate == "headwise" else _split(G, n_heads)  # (N, L_q, h, 1) against (N, h, L_q, hd)
    return _out(Y * G, params), weights


@bug("scale_d_model")
def gated_scaled_by_d_model(x_q, x_kv, params, n_heads, gate, mask=None):
    """A bug of the layer itself, not of the gate: still named under a correct gate."""
    q, k, v = _qkv(x_q, x_kv, params, n_heads)
    weights = _softmax_rows(q @ np.swapaxes(k, -1, -2) / math.sqrt(x_q.shape[-1]), mask)
    return _out((weights @ v) * _gate_heads(_gate(x_q, params), n_heads), params), weights


@bug("modifies_input")
def gate_in_place(x_q, x_kv, params, n_heads, gate, mask=None):
    out, weights = gated_numpy(x_q, x_kv, params, n_heads, gate, mask)
    params["W_gate"] *= 1.0  # harmless, but it writes ...
    params["W_gate"] += 1e-3  # ... and this changes the caller's weights
    return out, weights


def test_every_gate_bug_is_reached_and_the_issue_is_covered():
    diagnoses = {b.diagnosis for b in BUGGY}
    assert NAMED_IN_THE_ISSUE <= GATE_BUGS
    assert GATE_BUGS <= diagnoses, GATE_BUGS - diagnoses
    assert len({b.label for b in BUGGY}) == len(BUGGY)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the buggy code may overflow, as it should
@pytest.mark.parametrize("buggy", BUGGY, ids=[b.label for b in BUGGY])
def test_buggy_implementation_gets_its_diagnosis(buggy):
    with pytest.raises(E.ExerciseError) as info:
        E.check_gated_attention(buggy.fn, **buggy.kwargs)
    error, message = info.value, str(info.value)
    assert error.bug == buggy.diagnosis, message
    assert error.checker == "check_gated_attention" and message.startswith(f"check_gated_attention: case "
                                                                           f"'{error.case}'")
    known = E.KNOWN_BUGS[buggy.diagnosis]
    assert f"This matches a known bug: {known.description}" in message and f"Hint: {known.hint}" in message
    if "differs from" in message:
        assert "(book Eq. " in message
        assert re.search(r"expected \w+(\[[\d,:]+\] = \[| of shape)", message), message


def test_the_message_of_the_gate_after_w_o():
    with pytest.raises(E.ExerciseError) as info:
        E.check_gated_attention(gate_after_w_o)
    message = str(info.value)
    assert message.startswith("check_gated_attention: case 'headwise, no biases, L_q = n_heads: headwise gate, "
                              "self-attention (x_kv is x_q), x_q (2, 3, 12), x_kv (2, 3, 12), W_gate (12, 3)")
    assert "out differs from Concat(Y_1 * G_1, ..., Y_h * G_h) W^O + b^O" in message
    assert "(book Eq. gate-layer, part IV 'Gated attention')" in message
    assert "(right: weights)" in message and "the gate multiplies the layer's output after W^O" in message


def test_the_gate_from_x_kv_shows_only_in_cross_attention():
    """In self-attention x_kv is x_q, so the bug is invisible there; the first cross-attention case with L_q = L_kv
    names it."""
    with pytest.raises(E.ExerciseError) as info:
        E.check_gated_attention(gate_from_x_kv)
    assert "case 'elementwise, L_q = L_kv, x_kv is not x_q" in str(info.value)
    assert info.value.bug == "gate_from_kv_input"


def test_the_weights_gated_are_caught_by_the_weights_alone():
    with pytest.raises(E.ExerciseError) as info:
        E.check_gated_attention(gate_on_the_weights)
    message = str(info.value)
    assert "weights differs from softmax(Q_i K_i^T / sqrt(head_dim)) for every head i, not gated" in message
    assert "(right: out)" in message


# ---------------------------------------------------------------------------------------------------------------
# No bug's name for correct code that misses the tolerance; arguments; the book.
# ---------------------------------------------------------------------------------------------------------------


def test_float32_correct_code_is_never_given_a_bug():
    def float32(x_q, x_kv, params, n_heads, gate, mask=None):
        f = lambda a: torch.from_numpy(np.asarray(a)).float()
        out, weights = gated_torch(f(x_q), f(x_kv), {key: f(value) for key, value in params.items()}, n_heads, gate,
                                   mask)
        return out.double(), weights.double()

    try:
        E.check_gated_attention(float32)
    except E.ExerciseError as error:  # float32 may miss the float64 tolerance; that is no bug
        assert error.bug is None and "matches none of the known bugs" in str(error), str(error)


@pytest.mark.parametrize("relative, seed", [(1e-3, 0), (1e-2, 1), (3e-2, 2)])
def test_noisy_results_are_rejected_without_a_bug_name(relative, seed):
    rng = np.random.default_rng(seed)

    def noisy(*args, **kwargs):
        return tuple(value * (1 + relative * rng.standard_normal(value.shape)) + relative * rng.standard_normal(
            value.shape) for value in R.multi_head_attention(*args, **kwargs))

    with pytest.raises(E.ExerciseError) as info:
        E.check_gated_attention(noisy)
    assert info.value.bug is None and "matches none of the known bugs" in str(info.value)


def test_bad_arguments_and_the_stub():
    with pytest.raises(TypeError, match=r"check_gated_attention: fn must be a callable .*got 3 of type int"):
        E.check_gated_attention(3)
    with pytest.raises(ValueError, match="backend must be one of 'auto', 'numpy', 'torch', got 'jax'"):
        E.check_gated_attention(R.multi_head_attention, backend="jax")

    def stub(x_q, x_kv, params, n_heads, gate, mask=None):
        raise NotImplementedError

    with pytest.raises(E.ExerciseError, match="replace the stub's `raise NotImplementedError`"):
        E.check_gated_attention(stub)


def test_exported_and_in_the_appendix():
    assert "check_gated_attention" in E.__all__ and E.check_gated_attention.__module__ == "mha.exercises.gate_checks"
    page = (ROOT / "book" / "appendix" / "exercises.md").read_text(encoding="utf-8")
    assert "| `check_gated_attention(fn" in page


def _labels(text):
    return set(re.findall(r"^\$\$ \(([\w-]+)\)", text, flags=re.M)) | set(re.findall(r":label: ([\w-]+)", text))


def test_the_equations_named_are_on_the_chapter_page():
    text = PAGE.read_text(encoding="utf-8")
    named = {known.equation.label for known in E.KNOWN_BUGS.values() if known.equation is not None
             and known.equation.chapter == catalogue.GATE_CH} | {catalogue.EQ_GATE_LAYER.label}
    assert named <= _labels(text), named - _labels(text)
    cited = set(re.findall(r"(?:Eqs?\.|Theorem|Lemma|Proposition) ([a-z]+-[\w-]+)",
                           E.check_gated_attention.__doc__ + "".join(E.KNOWN_BUGS[b].hint for b in GATE_BUGS)))
    book = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "book").rglob("*.md"))
    assert cited and cited <= _labels(book), cited - _labels(book)
    title = re.search(r"'(.+)'", catalogue.GATE_CH).group(1)
    assert f"\n# {title}\n" in "\n" + text


BLOCK = re.compile(
    r"^% write-it-yourself: (?P<checkers>[\w, ]+)\n(?P<body>.*?)^% end write-it-yourself\n", re.M | re.S)


def test_the_chapter_ends_with_a_write_it_yourself_block_whose_solution_passes():
    text = PAGE.read_text(encoding="utf-8")
    blocks = list(BLOCK.finditer(text))
    assert len(blocks) == 1
    block = blocks[0]
    assert text.index("## Exercises") < block.start() and not text[block.end():].strip()
    assert [name.strip() for name in block["checkers"].split(",")] == ["check_gated_attention"]
    body = block["body"]
    assert "raise NotImplementedError" in re.search(r"^```python\n(.*?)^```", body, re.M | re.S).group(1)
    solution = re.search(r":class: dropdown\n```python\n(.*?)^```", body, re.M | re.S).group(1)
    cell = re.search(r"^```\{code-cell\} ipython3\n:tags: \[remove-input, translate-output\]\n\n(.*?)^```", body,
                     re.M | re.S).group(1)  # hidden; its printed line shown in Chinese on the Chinese page
    assert cell.startswith(solution) and "exercises.check_gated_attention(" in cell
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(cell, str(PAGE), "exec"), {})
    assert printed.getvalue().startswith("The solution above passes")
