"""Tests for ``mha.kernels``: the Triton FlashAttention forward and backward against the float64 NumPy reference.

Where the kernels run. With CUDA, the compiled kernels run on the GPU. Without it (this project's CI), they run on
CPU tensors through Triton's interpreter. Triton reads ``TRITON_INTERPRET`` when ``triton.language`` is first
imported, and torch may import triton by itself (its FLOP counter and compiler probe for it) in another test of the
same worker; so the root ``conftest.py`` selects the interpreter for the whole session when there is no CUDA, before
any test module is imported. The module-scoped fixture ``kernels`` imports ``mha.kernels`` (this file is the only
test file that does) and, if it was imported without the interpreter anyway, skips the CPU tests and says why.

Every case class of the kernel's contract is compared, forward and dq/dk/dv, with
``mha.reference.scaled_dot_product_attention`` and ``scaled_dot_product_attention_grad`` in float64: odd lengths,
L_q != L_kv both ways, causal (bottom-right) and not, fully masked rows, MHA/GQA/MQA, head_dim 16, 64 and two that
are not powers of two, a custom scale, batch 1 and 2, non-contiguous inputs. GQA is compared without repeating
keys: the reference broadcasts k (N, g, 1, L_kv, d) against q (N, g, h/g, L_q, d) and sums the gradient over the
broadcast axis. The interpreter is slow, so the shapes are small and the tiles 16 x 16 (several tiles per case).

Without Triton installed, the kernel tests skip; the two import tests (``import mha`` without Triton, and the
ImportError's advice) always run, in subprocesses that hide Triton.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from mha import reference

HAS_TRITON = importlib.util.find_spec("triton") is not None
HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason='Triton is not installed (pip install "mha-derived[kernels]")')
_skip_without_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (float16/bfloat16 and large shapes)")


def needs_cuda(test):
    """Marked ``cuda`` (``pytest -m cuda``: the GPU check runs these) and skipped without a CUDA device."""
    return pytest.mark.cuda(_skip_without_cuda(test))
SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
TOL = {"rtol": 2e-5, "atol": 2e-5}  # float32 kernel vs float64 reference; errors seen are ~1e-6


INTERPRETER_NUMPY_BREAK = "only 0-dimensional arrays can be converted to Python scalars"


def interpreter_problem(probe=None) -> str | None:
    """Why Triton's interpreter cannot run the kernels here, or None when it can: tried, not read from versions.

    The probe is a tiny kernel whose loop bound is computed inside it, as the FlashAttention kernel's are. Triton
    3.6's interpreter turns such a bound into a Python int with ``int()`` of a one-element array, which NumPy 2.4
    and later refuse (``TypeError: only 0-dimensional arrays can be converted to Python scalars``); Triton 3.7 and
    NumPy 2.3 both work. That failure gives the reason to skip; any other failure is raised (a real problem)."""
    import numpy
    import triton

    try:
        (probe or _interpreter_probe)()
    except Exception as error:  # noqa: BLE001 - which one is decided by its message, below
        if INTERPRETER_NUMPY_BREAK not in str(error):
            raise
        return (f"Triton {triton.__version__}'s interpreter cannot run with NumPy {numpy.__version__} (a loop bound "
                f"computed in a kernel fails: {INTERPRETER_NUMPY_BREAK!r}); the kernels compile and are tested on a "
                f"GPU (pytest -m cuda). To run these tests on a CPU, use NumPy < 2.4 or Triton >= 3.7")
    return None


def _interpreter_probe() -> None:
    import triton
    import triton.language as tl

    @triton.jit
    def count(y_ptr, n):
        end = tl.program_id(0) + n  # a loop bound computed in the kernel
        total = tl.zeros([1], dtype=tl.float32)
        for _ in range(0, end):
            total += 1.0
        tl.store(y_ptr + tl.arange(0, 1), total)

    y = torch.zeros(1)
    count[(1,)](y, 3)
    if y.item() != 3.0:
        raise AssertionError(f"Triton's interpreter counted {y.item()} iterations of a 3-iteration loop")


@pytest.fixture(scope="module")
def kernels():
    """mha.kernels: compiled with CUDA; otherwise interpreted, with TRITON_INTERPRET=1 while this module runs (and
    skipped, saying why, where the installed Triton and NumPy cannot interpret a kernel: :func:`interpreter_problem`)."""
    if not HAS_TRITON:
        pytest.skip('Triton is not installed (pip install "mha-derived[kernels]")')
    previous = os.environ.get("TRITON_INTERPRET")
    if not HAS_CUDA:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        module = importlib.import_module("mha.kernels")
        if DEVICE == "cpu" and not module.is_interpreted():
            pytest.skip("mha.kernels was imported without TRITON_INTERPRET=1 earlier in this process; CPU tensors "
                        "need the interpreter")
        if DEVICE == "cpu":
            problem = interpreter_problem()
            if problem:
                pytest.skip(problem)
        yield module
    finally:
        if previous is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = previous


@pytest.fixture(scope="module")
def flash_module(kernels):
    return sys.modules["mha.kernels.flash"]


# ------------------------------------------------------------------------------------------------------ helpers


def _random_inputs(rng, n_batch, n_heads, n_kv_heads, seq_len_q, seq_len_kv, head_dim, scale_qk=1.0):
    q = scale_qk * rng.standard_normal((n_batch, n_heads, seq_len_q, head_dim))
    k = scale_qk * rng.standard_normal((n_batch, n_kv_heads, seq_len_kv, head_dim))
    v = rng.standard_normal((n_batch, n_kv_heads, seq_len_kv, head_dim))
    grad_out = rng.standard_normal((n_batch, n_heads, seq_len_q, head_dim))
    return q, k, v, grad_out


def causal_mask(seq_len_q, seq_len_kv):
    """(L_q, L_kv) bottom-right aligned: query i sees key j iff j <= L_kv - L_q + i."""
    return np.tril(np.ones((seq_len_q, seq_len_kv), dtype=bool), k=seq_len_kv - seq_len_q)


def reference_attention(q, k, v, grad_out, is_causal, scale):
    """float64 (out, dq, dk, dv) from mha.reference, GQA by broadcasting (no repeated keys)."""
    n_batch, n_heads, seq_len_q, head_dim = q.shape
    n_kv_heads, seq_len_kv = k.shape[1], k.shape[2]
    group = n_heads // n_kv_heads
    q5 = q.reshape(n_batch, n_kv_heads, group, seq_len_q, head_dim)  # (N, g, h/g, L_q, d): head j -> j // (h/g)
    k5, v5 = k[:, :, None], v[:, :, None]  # (N, g, 1, L_kv, d)
    do5 = grad_out.reshape(q5.shape)  # (N, g, h/g, L_q, d)
    mask = causal_mask(seq_len_q, seq_len_kv) if is_causal else None
    out, _ = reference.scaled_dot_product_attention(q5, k5, v5, mask=mask, scale=scale)
    dq, dk, dv = reference.scaled_dot_product_attention_grad(q5, k5, v5, do5, mask=mask, scale=scale)
    return (out.reshape(q.shape),  # (N, h, L_q, d)
            dq.reshape(q.shape),  # (N, h, L_q, d)
            dk.reshape(k.shape),  # (N, g, L_kv, d): summed over the group by the reference
            dv.reshape(v.shape))  # (N, g, L_kv, d)


def kernel_attention(kernels, q, k, v, grad_out, is_causal, scale):
    """float32 (out, dq, dk, dv) from flash_attention and autograd through its Function."""
    q_t, k_t, v_t = (torch.tensor(a, dtype=torch.float32, device=DEVICE, requires_grad=True) for a in (q, k, v))
    out = kernels.flash_attention(q_t, k_t, v_t, is_causal=is_causal, scale=scale)
    out.backward(torch.tensor(grad_out, dtype=torch.float32, device=DEVICE))
    return tuple(t.detach().cpu().double().numpy() for t in (out, q_t.grad, k_t.grad, v_t.grad))


def assert_matches_reference(kernels, q, k, v, grad_out, is_causal=False, scale=None):
    expected = reference_attention(q, k, v, grad_out, is_causal, scale)
    got = kernel_attention(kernels, q, k, v, grad_out, is_causal, scale)
    for name, g, e in zip(("out", "dq", "dk", "dv"), got, expected):
        np.testing.assert_allclose(g, e, err_msg=name, **TOL)
    return got


# ---------------------------------------------------------------------------------------------- the case table

CASES = {  # name: (N, h, g, L_q, L_kv, head_dim, is_causal, scale)
    "one token": (1, 2, 2, 1, 1, 16, False, None),
    "L = 7, causal": (1, 2, 2, 7, 7, 16, True, None),
    "L = 33, batch 2": (2, 2, 2, 33, 33, 16, False, None),
    "L = 33, causal": (1, 2, 2, 33, 33, 16, True, None),
    "L_q < L_kv": (1, 2, 2, 7, 40, 16, False, None),
    "L_q < L_kv, causal (a cached prefix)": (1, 2, 2, 5, 37, 16, True, None),
    "L_q > L_kv": (1, 2, 2, 40, 7, 16, False, None),
    "L_q > L_kv, causal (fully masked rows)": (1, 2, 2, 40, 7, 16, True, None),
    "GQA h = 4, g = 2, causal": (2, 4, 2, 33, 33, 16, True, None),
    "MQA h = 4, g = 1": (1, 4, 1, 20, 35, 16, False, None),
    "MQA h = 3, g = 1, causal, L_q > L_kv": (1, 3, 1, 35, 20, 16, True, None),
    "head_dim 64, GQA, causal": (1, 4, 2, 33, 33, 64, True, None),
    "head_dim 48": (1, 2, 2, 17, 23, 48, False, None),
    "head_dim 80, causal": (1, 2, 1, 19, 19, 80, True, None),
    "head_dim 128": (1, 1, 1, 17, 17, 128, False, None),
    "custom scale 0.3": (1, 2, 2, 17, 23, 16, False, 0.3),
    "custom scale 1.7, causal, GQA": (1, 2, 1, 23, 17, 16, True, 1.7),
}


@needs_triton
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_forward_and_gradients_match_reference(kernels, case):
    n_batch, n_heads, n_kv_heads, seq_len_q, seq_len_kv, head_dim, is_causal, scale = CASES[case]
    rng = np.random.default_rng(sorted(CASES).index(case))
    q, k, v, grad_out = _random_inputs(rng, n_batch, n_heads, n_kv_heads, seq_len_q, seq_len_kv, head_dim)
    assert_matches_reference(kernels, q, k, v, grad_out, is_causal, scale)


@needs_triton
def test_fully_masked_rows_give_zero_output_and_zero_gradient(kernels):
    # causal with L_q = 12 > L_kv = 5: the first 7 queries see no key (j <= 5 - 12 + i < 0 for i < 7)
    rng = np.random.default_rng(1)
    q, k, v, grad_out = _random_inputs(rng, 1, 2, 1, 12, 5, 16)
    out, dq, _, _ = assert_matches_reference(kernels, q, k, v, grad_out, is_causal=True)
    assert np.all(out[:, :, :7] == 0) and np.all(dq[:, :, :7] == 0)
    assert np.all(out[:, :, 7:] != 0)


@needs_triton
def test_large_scores_stay_finite(kernels):
    # scores in the hundreds: exp(s) overflows float32 without the running-max shift
    rng = np.random.default_rng(2)
    q, k, v, grad_out = _random_inputs(rng, 1, 2, 2, 21, 21, 16, scale_qk=8.0)
    expected = reference_attention(q, k, v, grad_out, True, None)
    got = kernel_attention(kernels, q, k, v, grad_out, True, None)
    assert np.abs(np.einsum("bhid,bhjd->bhij", q, k) / 4).max() > 100
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-4, atol=1e-4)  # scores ~1e2: float32 rounding of s
    assert all(np.all(np.isfinite(g)) for g in got)


@needs_triton
def test_lse_is_the_books_log_sum_exp(kernels):
    # lse = m + log l of the online softmax (base e), as reference.online_softmax_attention returns it; +inf for
    # a row that sees no key
    rng = np.random.default_rng(3)
    q, k, v, _ = _random_inputs(rng, 1, 2, 2, 9, 6, 16)
    out, lse = kernels.flash_attention_forward(*(torch.tensor(a, dtype=torch.float32, device=DEVICE)
                                                 for a in (q, k, v)), is_causal=True)
    assert lse.dtype == torch.float32 and lse.shape == (1, 2, 9)
    mask = causal_mask(9, 6)
    ref_out, state = reference.online_softmax_attention(q, k, v, 4, mask=mask, return_state=True)
    lse = lse.cpu().double().numpy()
    visible = mask.any(axis=1)  # rows 0-2 see no key
    np.testing.assert_allclose(lse[..., visible], state["lse"][..., visible], **TOL)
    assert np.all(np.isposinf(lse[..., ~visible]))
    np.testing.assert_allclose(out.cpu().double().numpy(), ref_out, **TOL)


@needs_triton
def test_backward_entry_point_equals_autograd(kernels):
    rng = np.random.default_rng(4)
    q, k, v, grad_out = (torch.tensor(a, dtype=torch.float32, device=DEVICE)
                         for a in _random_inputs(rng, 1, 4, 2, 18, 21, 16))
    out, lse = kernels.flash_attention_forward(q, k, v, is_causal=True)
    grads = kernels.flash_attention_backward(q, k, v, out, lse, grad_out, is_causal=True)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    kernels.flash_attention(*leaves, is_causal=True).backward(grad_out)
    for got, leaf in zip(grads, leaves):
        torch.testing.assert_close(got, leaf.grad, rtol=0, atol=0)  # the same kernels: bit for bit


@needs_triton
def test_non_contiguous_inputs(kernels):
    # the layer's q is a transposed view of (N, L, h, d); the kernels read through strides
    rng = np.random.default_rng(5)
    q, k, v, grad_out = _random_inputs(rng, 2, 4, 2, 19, 23, 16)
    expected = reference_attention(q, k, v, grad_out, True, None)
    as_view = lambda a: torch.tensor(a.transpose(0, 2, 1, 3).copy(), dtype=torch.float32,  # noqa: E731
                                     device=DEVICE).transpose(1, 2)  # (N, L, h, d) storage, (N, h, L, d) view
    q_t, k_t, v_t = (as_view(a).requires_grad_() for a in (q, k, v))
    assert not q_t.is_contiguous()
    out = kernels.flash_attention(q_t, k_t, v_t, is_causal=True)
    out.backward(as_view(grad_out))
    for got, exp in zip((out, q_t.grad, k_t.grad, v_t.grad), expected):
        np.testing.assert_allclose(got.detach().cpu().double().numpy(), exp, **TOL)


@needs_triton
def test_gradient_of_one_input_only(kernels):
    rng = np.random.default_rng(6)
    q, k, v, grad_out = _random_inputs(rng, 1, 2, 2, 10, 10, 16)
    _, dq_ref, _, _ = reference_attention(q, k, v, grad_out, False, None)
    q_t = torch.tensor(q, dtype=torch.float32, device=DEVICE, requires_grad=True)
    k_t, v_t = (torch.tensor(a, dtype=torch.float32, device=DEVICE) for a in (k, v))
    kernels.flash_attention(q_t, k_t, v_t).backward(torch.tensor(grad_out, dtype=torch.float32, device=DEVICE))
    np.testing.assert_allclose(q_t.grad.cpu().double().numpy(), dq_ref, **TOL)
    assert k_t.grad is None and v_t.grad is None


@needs_triton
@pytest.mark.skipif(HAS_CUDA, reason="tile shapes are chosen per GPU; this swaps the interpreter's tiles")
@pytest.mark.parametrize("block_m, block_n", [(32, 16), (16, 32)])
def test_tiles_of_different_heights_and_widths(kernels, flash_module, monkeypatch, block_m, block_n):
    # on a GPU the query tile is taller than the key tile (or the other way round in the dK/dV kernel): the causal
    # skip and the masked/unmasked split must not depend on B_r = B_c
    tiles = flash_module.Tiles(block_m, block_n)
    monkeypatch.setattr(flash_module, "INTERPRETER_TILES", {"forward": tiles, "backward_kv": tiles,
                                                            "backward_q": tiles})
    rng = np.random.default_rng(block_m)
    for seq_len_q, seq_len_kv in ((37, 53), (53, 37)):
        q, k, v, grad_out = _random_inputs(rng, 1, 2, 1, seq_len_q, seq_len_kv, 16)
        assert_matches_reference(kernels, q, k, v, grad_out, is_causal=True)


# ------------------------------------------------------------------------------------------------- bad input


def _good():
    return {"q": torch.zeros(1, 4, 5, 16), "k": torch.zeros(1, 2, 6, 16), "v": torch.zeros(1, 2, 6, 16)}


BAD_INPUTS = [  # (id, change to the good arguments, exception, words the message must contain)
    ("q not a tensor", {"q": np.zeros((1, 4, 5, 16))}, TypeError, "q must be a torch.Tensor"),
    ("k rank 3", {"k": torch.zeros(2, 6, 16)}, ValueError, "k must have shape"),
    ("q empty axis", {"q": torch.zeros(1, 4, 0, 16)}, ValueError, "no empty axis"),
    ("dtype mismatch", {"k": torch.zeros(1, 2, 6, 16, dtype=torch.float64)}, TypeError, "q's dtype"),
    ("float64", {n: torch.zeros(s, dtype=torch.float64) for n, s in (("q", (1, 4, 5, 16)), ("k", (1, 2, 6, 16)),
                                                                     ("v", (1, 2, 6, 16)))}, TypeError, "dtype"),
    ("integer", {n: torch.zeros(s, dtype=torch.int32) for n, s in (("q", (1, 4, 5, 16)), ("k", (1, 2, 6, 16)),
                                                                   ("v", (1, 2, 6, 16)))}, TypeError, "dtype"),
    ("k and v shapes differ", {"v": torch.zeros(1, 2, 7, 16)}, ValueError, "v must have k's shape"),
    ("batch sizes differ", {"k": torch.zeros(2, 2, 6, 16), "v": torch.zeros(2, 2, 6, 16)}, ValueError, "batch size"),
    ("head_dim differs", {"k": torch.zeros(1, 2, 6, 8), "v": torch.zeros(1, 2, 6, 8)}, ValueError, "head_dim"),
    ("head_dim > 128", {"q": torch.zeros(1, 4, 5, 160), "k": torch.zeros(1, 2, 6, 160),
                        "v": torch.zeros(1, 2, 6, 160)}, ValueError, "head_dim must be an integer <= 128"),
    ("g does not divide h", {"k": torch.zeros(1, 3, 6, 16), "v": torch.zeros(1, 3, 6, 16)}, ValueError,
     "must divide"),
    ("is_causal not bool", {"is_causal": 1}, TypeError, "is_causal must be True or False"),
    ("scale a string", {"scale": "0.5"}, TypeError, "scale must be"),
    ("scale a bool", {"scale": True}, TypeError, "scale must be"),
    ("scale zero", {"scale": 0.0}, ValueError, "scale must be a finite real number > 0"),
    ("scale negative", {"scale": -1.0}, ValueError, "scale must be"),
    ("scale inf", {"scale": math.inf}, ValueError, "scale must be"),
    ("scale nan", {"scale": math.nan}, ValueError, "scale must be"),
]


@needs_triton
@pytest.mark.parametrize("change, error, words", [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_refused_with_a_clear_message(kernels, change, error, words):
    args = _good() | change
    args = {n: a.to(DEVICE) if isinstance(a, torch.Tensor) else a for n, a in args.items()}
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        kernels.flash_attention(**args)


@needs_triton
@pytest.mark.skipif(HAS_CUDA, reason="on CUDA, half precision is supported")
def test_half_precision_on_cpu_is_refused(kernels):
    q, k, v = (torch.zeros(1, 2, 4, 16, dtype=torch.bfloat16) for _ in range(3))
    with pytest.raises(TypeError, match="float16 and bfloat16 run on CUDA only"):
        kernels.flash_attention(q, k, v)


@needs_triton
def test_backward_entry_point_checks_its_extra_arguments(kernels):
    q, k, v = (t.to(DEVICE) for t in _good().values())
    out, lse = kernels.flash_attention_forward(q, k, v)
    with pytest.raises(ValueError, match="grad_out must have shape"):
        kernels.flash_attention_backward(q, k, v, out, lse, out[..., :8])
    with pytest.raises(TypeError, match="lse must have dtype torch.float32"):
        kernels.flash_attention_backward(q, k, v, out, lse.double(), out)


def _run_python(code: str, env_changes: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("TRITON_INTERPRET", None)
    env.update(env_changes or {})
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


@needs_triton
@pytest.mark.skipif(HAS_CUDA, reason="with CUDA, the compiled kernels have a device to run on")
def test_cpu_tensors_without_the_interpreter_get_advice():
    code = ("import torch; from mha.kernels import flash_attention\n"
            "q = torch.zeros(1, 1, 4, 16)\n"
            "try:\n    flash_attention(q, q, q)\nexcept ValueError as e:\n    print('ERROR:', e)\n")
    result = _run_python(code)
    assert "ERROR:" in result.stdout, result.stderr
    assert "TRITON_INTERPRET=1" in result.stdout and "CUDA" in result.stdout


def test_import_mha_works_without_triton_and_kernels_says_how_to_install():
    # sys.modules["triton"] = None makes every `import triton` fail, as if it were not installed
    code = ("import sys; sys.modules['triton'] = None\n"
            "import mha; import mha.reference; mha.counting.flops(1, 4, 4, 8, 2)\n"
            "assert 'kernels' in mha.__all__\n"
            "try:\n    import mha.kernels\nexcept ImportError as e:\n    print('ERROR:', e)\n"
            "try:\n    mha.kernels\nexcept ImportError as e:\n    print('ATTR ERROR:', e)\n")
    result = _run_python(code)
    assert result.returncode == 0, result.stderr
    assert 'ERROR: mha.kernels needs Triton' in result.stdout
    assert 'pip install "mha-derived[kernels]"' in result.stdout
    assert "ATTR ERROR: mha.kernels needs Triton" in result.stdout


# ------------------------------------------------------------------------------------------------- benchmark


@needs_triton
def test_benchmark_smoke_run_is_json(kernels):
    from mha import counting
    from mha.kernels import benchmark

    if HAS_CUDA:
        config = benchmark.BenchConfig(seq_lens=(256,), head_dims=(64,), dtypes=("bfloat16",), repeats=3, warmup=1)
    else:  # the interpreter: tiny sizes, one repeat; no time is asserted
        config = benchmark.BenchConfig(seq_lens=(16,), head_dims=(16,), dtypes=("float32",), batch=1, n_heads=1,
                                       repeats=1, warmup=1, matmul_size=64)
    partials = []  # the result after every row, as a run cut short would have written it (its rows kept)
    result = benchmark.run_benchmark(DEVICE, config, on_row=lambda partial: partials.append(json.dumps(partial)))
    json.dumps(result)  # JSON-serialisable
    partials = [json.loads(text) for text in partials]
    assert [len(p["rows"]) for p in partials] == list(range(1, len(result["rows"]) + 1))
    assert [p["complete"] for p in partials] == [False] * (len(partials) - 1) + [True] and result["complete"]
    assert all(p["rows"] == result["rows"][:len(p["rows"])] for p in partials)  # rows kept as they finish
    with pytest.raises(TypeError, match="on_row must be a function"):
        benchmark.run_benchmark(DEVICE, config, on_row="results.json")
    assert result["device"]["type"] == DEVICE and result["matmul_rate_flops"] > 0
    assert result["device"]["interpreted"] is kernels.is_interpreted() and result["device"]["slug"].startswith(DEVICE)
    assert result["config"]["repeats"] == config.repeats
    rows = result["rows"]
    assert {r["causal"] for r in rows} == {False, True} and {r["pass"] for r in rows} == {"forward", "forward+backward"}
    for row in rows:
        assert row["flops"] == counting.attention_core_flops(row["batch"], row["seq_len"], row["seq_len"],
                                                             row["n_heads"], row["head_dim"], row["causal"],
                                                             backward=row["pass"] != "forward")
        assert row["flops"] > 0 and row["triton_s"] > 0 and row["naive_s"] > 0
        assert row["flash_backend_s"] is None or row["flash_backend_s"] > 0
        assert row["triton_tflops"] > 0 and 0 < row["triton_fraction_of_matmul"]


@needs_triton
def test_interpreter_problem_skips_only_the_numpy_break():
    """The reason to skip is given for the known Triton/NumPy break alone; any other failure of the probe is raised,
    and a probe that runs gives no reason."""
    from triton.runtime.errors import InterpreterError

    def broken():
        raise InterpreterError(repr(TypeError(INTERPRETER_NUMPY_BREAK)))

    def other():
        raise InterpreterError(repr(IndexError("out of bounds")))

    reason = interpreter_problem(broken)
    assert reason is not None and "NumPy < 2.4 or Triton >= 3.7" in reason and INTERPRETER_NUMPY_BREAK in reason
    with pytest.raises(InterpreterError, match="out of bounds"):
        interpreter_problem(other)
    assert interpreter_problem(lambda: None) is None


@needs_triton
def test_benchmark_config_is_a_timing_config_and_quick_is_smaller(kernels):
    from mha.experiments.timing import TimingConfig
    from mha.kernels import benchmark

    assert benchmark.BenchConfig is benchmark.KernelBenchConfig  # the earlier name, one class
    default = benchmark.KernelBenchConfig()
    assert isinstance(default, TimingConfig) and (default.repeats, default.warmup) == (15, 3)
    assert set(benchmark.QUICK.seq_lens) < set(default.seq_lens) and benchmark.QUICK.head_dims == (64,)
    with pytest.raises(ValueError, match="warmup"):
        benchmark.KernelBenchConfig(warmup=0)  # the first call compiles: it is never timed


# ------------------------------------------------------------------------------------------------- CUDA only


@needs_triton
@needs_cuda
@pytest.mark.parametrize("dtype, tol", [(torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_half_precision_close_to_float32_sdpa(kernels, dtype, tol, is_causal):
    torch.manual_seed(0)
    q = torch.randn(2, 8, 300, 64, device="cuda")
    k, v = torch.randn(2, 2, 300, 64, device="cuda"), torch.randn(2, 2, 300, 64, device="cuda")
    grad_out = torch.randn_like(q)
    leaves32 = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = torch.nn.functional.scaled_dot_product_attention(*leaves32, is_causal=is_causal, enable_gqa=True)
    expected.backward(grad_out)
    leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    out = kernels.flash_attention(*leaves, is_causal=is_causal)
    out.backward(grad_out.to(dtype))
    assert out.dtype == dtype
    for got, exp in zip((out, *(t.grad for t in leaves)), (expected, *(t.grad for t in leaves32))):
        scale = exp.abs().max().item()
        assert (got.float() - exp).abs().max().item() <= tol * max(scale, 1.0)


@needs_triton
@needs_cuda
def test_larger_shapes_on_the_gpu(kernels):
    # realistic tiles: every GPU tile size, tails (L not a multiple of 128), GQA, head_dim 128, float32 (IEEE)
    torch.manual_seed(1)
    for seq_len_q, seq_len_kv, is_causal in ((1000, 1000, True), (257, 1537, True), (1537, 257, False)):
        q = torch.randn(2, 8, seq_len_q, 128, device="cuda", dtype=torch.float64)
        k, v = (torch.randn(2, 2, seq_len_kv, 128, device="cuda", dtype=torch.float64) for _ in range(2))
        grad_out = torch.randn_like(q)
        mask = torch.from_numpy(causal_mask(seq_len_q, seq_len_kv)).cuda() if is_causal else None
        leaves64 = [t.clone().requires_grad_() for t in (q, k, v)]
        expected = torch.nn.functional.scaled_dot_product_attention(*leaves64, attn_mask=mask, enable_gqa=True)
        expected.backward(grad_out)
        leaves = [t.float().requires_grad_() for t in (q, k, v)]
        out = kernels.flash_attention(*leaves, is_causal=is_causal)
        out.backward(grad_out.float())
        for got, exp in zip((out, *(t.grad for t in leaves)), (expected, *(t.grad for t in leaves64))):
            torch.testing.assert_close(got.double(), exp, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------ MultiHeadAttention(impl="triton")
def _impl_pair(**kwargs):
    import mha

    naive = mha.MultiHeadAttention(32, 4, impl="naive", **kwargs)
    triton_layer = mha.MultiHeadAttention(32, 4, impl="triton", **kwargs)
    triton_layer.load_state_dict(naive.state_dict())
    return naive, triton_layer


@pytest.mark.parametrize("kwargs", [{}, {"n_kv_heads": 2}, {"n_kv_heads": 1, "head_dim": 12}],
                         ids=["MHA", "GQA", "MQA-head_dim-12"])
def test_module_impl_triton_matches_naive(kernels, kwargs):
    """The module's impl="triton" computes what impl="naive" computes: outputs and every gradient, self- and
    cross-attention, causal or not, with a head mask, unbatched."""
    torch.manual_seed(0)
    naive, triton_layer = _impl_pair(**kwargs)
    x = torch.randn(1, 9, 32, requires_grad=True)
    y = torch.randn(1, 5, 32)
    for args in ((x,), (x, y)):
        for causal in (False, True):
            expected, _ = naive(*args, is_causal=causal, need_weights=False)
            got, none = triton_layer(*args, is_causal=causal, need_weights=False)
            assert none is None
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
            grads_naive = torch.autograd.grad(expected.sum(), [x, *naive.parameters()])
            grads_triton = torch.autograd.grad(got.sum(), [x, *triton_layer.parameters()])
            for g_triton, g_naive in zip(grads_triton, grads_naive):
                torch.testing.assert_close(g_triton, g_naive, rtol=1e-4, atol=1e-5)
    head_mask = torch.tensor([1.0, 0.0, 1.0, 0.5])
    torch.testing.assert_close(triton_layer(x, head_mask=head_mask, need_weights=False)[0],
                               naive(x, head_mask=head_mask, need_weights=False)[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(triton_layer(x[0], is_causal=True, need_weights=False)[0],
                               naive(x[0], is_causal=True, need_weights=False)[0], rtol=1e-5, atol=1e-5)


def test_module_impl_triton_decodes_through_the_cache(kernels):
    from mha import KVCache

    torch.manual_seed(1)
    naive, triton_layer = _impl_pair(n_kv_heads=2)
    cache_naive, cache_triton = KVCache(1, 40, 2, 8), KVCache(1, 40, 2, 8)
    x = torch.randn(1, 9, 32)
    with torch.no_grad():
        for start, stop in ((0, 5), (5, 6), (6, 7), (7, 9)):  # prefill, then one or two positions at a time
            kwargs = dict(is_causal=True, need_weights=False)
            torch.testing.assert_close(triton_layer(x[:, start:stop], kv_cache=cache_triton, **kwargs)[0],
                                       naive(x[:, start:stop], kv_cache=cache_naive, **kwargs)[0],
                                       rtol=1e-5, atol=1e-5)


def test_module_impl_triton_refuses_what_it_cannot_do(kernels):
    import mha

    _, triton_layer = _impl_pair()
    x = torch.randn(1, 9, 32)
    with pytest.raises(ValueError, match="arbitrary mask"):
        triton_layer(x, mask=torch.ones(9, 9, dtype=torch.bool), need_weights=False)
    with pytest.raises(ValueError, match="need_weights must be False"):
        triton_layer(x)  # the default need_weights=True asks for weights the kernel never forms
    with pytest.raises(ValueError, match="dropout must be 0"):
        mha.MultiHeadAttention(32, 4, impl="triton", dropout=0.1)
