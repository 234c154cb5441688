"""Argument checks of ``mha.kernels``: every bad input is refused before a kernel is launched.

The package's rule (``mha._checks``): a wrong *type* raises ``TypeError`` (a non-tensor, an unsupported dtype),
a wrong *value* raises ``ValueError`` (a shape, a device, a scale out of range); every message names the argument,
what it got and what was expected.

Book: part II, "From the recurrence to a kernel".
"""

from __future__ import annotations

import math

import torch

from mha._checks import check_bool, check_float, check_shape, check_type

MAX_HEAD_DIM = 128
_GPU_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_attention_inputs(q, k, v, is_causal, scale, interpreted: bool) -> tuple[bool, float]:
    """Check q (N, h, L_q, d), k and v (N, g, L_kv, d), the flags and the device; return (is_causal, scale).

    ``interpreted``: whether the kernels run under Triton's CPU interpreter (then CPU tensors are accepted).
    ``scale=None`` becomes 1/sqrt(d). Book: part II, "From the recurrence to a kernel".
    """
    for name, tensor, axes in (("q", q, "(N, h, L_q, d)"), ("k", k, "(N, g, L_kv, d)"), ("v", v, "(N, g, L_kv, d)")):
        check_type(name, tensor, torch.Tensor, f"a torch.Tensor of shape {axes}")
        check_shape(name, tensor, (None, None, None, None), axes)
        if 0 in tensor.shape:
            raise ValueError(f"{name} must have no empty axis, got shape {tuple(tensor.shape)}")
    _check_same_dtype_and_device(q, k, v)
    _check_device_and_dtype(q, interpreted)
    _check_shapes(q, k, v)
    is_causal = check_bool("is_causal", is_causal)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    scale = check_float("scale", scale, minimum=0.0, min_inclusive=False)
    return is_causal, scale


def _check_same_dtype_and_device(q, k, v) -> None:
    for name, tensor in (("k", k), ("v", v)):
        if tensor.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {tensor.dtype}")
        if tensor.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {tensor.device}")


def _check_device_and_dtype(q, interpreted: bool) -> None:
    """float32 anywhere; float16/bfloat16 on CUDA only; CPU tensors only under the interpreter."""
    device = q.device.type
    if device == "cpu" and not interpreted:
        raise ValueError("q, k and v are CPU tensors, but Triton is compiling for a GPU: move them to CUDA, or run "
                         "on the CPU through Triton's interpreter by setting TRITON_INTERPRET=1 before triton and "
                         "mha.kernels are first imported")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"q, k and v must be CUDA tensors (or CPU tensors under TRITON_INTERPRET=1), got device "
                         f"{q.device}")
    allowed = _GPU_DTYPES if device == "cuda" else (torch.float32,)
    if q.dtype not in allowed:
        listed = ", ".join(str(d) for d in allowed)
        raise TypeError(f"q, k and v on {device} must have dtype {listed}, got {q.dtype}"
                        + ("; float16 and bfloat16 run on CUDA only" if device == "cpu" else ""))


def _check_shapes(q, k, v) -> None:
    n_batch, n_heads, _, head_dim = q.shape
    if k.shape != v.shape:
        raise ValueError(f"v must have k's shape (N, g, L_kv, d) = {tuple(k.shape)}, got {tuple(v.shape)}")
    if k.shape[0] != n_batch:
        raise ValueError(f"k and v must have q's batch size N = {n_batch}, got shape {tuple(k.shape)}")
    if k.shape[-1] != head_dim:
        raise ValueError(f"k and v must have q's head_dim d = {head_dim}, got shape {tuple(k.shape)}")
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be an integer <= {MAX_HEAD_DIM}, got {head_dim} (q shape {tuple(q.shape)})")
    n_kv_heads = k.shape[1]
    if n_heads % n_kv_heads:
        raise ValueError(f"the number of key/value heads g = {n_kv_heads} (k shape {tuple(k.shape)}) must divide "
                         f"the number of query heads h = {n_heads} (q shape {tuple(q.shape)})")


def check_backward_inputs(q, out, lse, grad_out) -> None:
    """``out`` and ``grad_out`` shaped and typed like q; ``lse`` float32 (N, h, L_q) on q's device."""
    n_batch, n_heads, l_q, _ = q.shape
    for name, tensor in (("out", out), ("grad_out", grad_out)):
        check_type(name, tensor, torch.Tensor, "a torch.Tensor shaped like q")
        check_shape(name, tensor, tuple(q.shape), "(N, h, L_q, d)")
        if tensor.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {tensor.dtype}")
    check_type("lse", lse, torch.Tensor, "a float32 torch.Tensor of shape (N, h, L_q)")
    check_shape("lse", lse, (n_batch, n_heads, l_q), "(N, h, L_q)")
    if lse.dtype != torch.float32:
        raise TypeError(f"lse must have dtype torch.float32, got {lse.dtype}")
    for name, tensor in (("out", out), ("lse", lse), ("grad_out", grad_out)):
        if tensor.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {tensor.device}")
    if not lse.is_contiguous():
        raise ValueError("lse must be contiguous (as the forward returns it)")
