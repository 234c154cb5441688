"""RMSNorm and its backward pass: the normalisation of QK-norm as in Qwen3 and Gemma 3, which rescales each head's
query and key vectors to a fixed root-mean-square before RoPE and the scores, so that ``q . k`` cannot grow without
bound. (OLMo 2 normalises the whole projection, all heads together, before the split: another layer.)

Book: part IV, 'QK-norm and logit soft-capping'.
"""

from __future__ import annotations

import numpy as np

from mha._checks import check_float
from mha.reference.checks import _as_float_array, _check_nonempty


def _rms_norm(x, weight, eps):
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last axis. No checks."""
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)  # (..., 1)
    return x * r * weight


def _rms_norm_grad(x, weight, grad, eps):
    """``(dx, dweight)`` of ``_rms_norm`` (derivation in ``rms_norm_backward``). No checks."""
    d = x.shape[-1]
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)  # (..., 1)
    x_hat = x * r  # (..., d)
    u = grad * weight  # dL/dx_hat
    dx = r * (u - x_hat * np.sum(u * x_hat, axis=-1, keepdims=True) / d)
    d_weight = np.sum(grad * x_hat, axis=tuple(range(x.ndim - 1)))  # (d,): summed over every leading axis
    return dx, d_weight


def _check_rms_norm_args(x, weight, eps):
    x = _as_float_array("x", x)
    if x.ndim < 1:
        raise ValueError(f"x must have at least 1 axis (..., d), got a scalar (shape {x.shape})")
    _check_nonempty("x", x)
    weight = _as_float_array("weight", weight)
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"weight must have shape (d,) = {x.shape[-1:]} (x's last axis), got {weight.shape}")
    return x, weight, check_float("eps", eps, minimum=0.0, min_inclusive=False)


def rms_norm(x, weight, eps=1e-6):
    """RMSNorm over the last axis: ``y = x / sqrt(mean(x^2) + eps) * weight``.

    ``x`` is ``(..., d)``, ``weight`` ``(d,)`` (learned, one gain per coordinate; for QK-norm ``d = head_dim`` and
    one weight is shared by all heads), ``eps`` a finite real number > 0. Unlike LayerNorm it subtracts no mean and
    adds no bias: each vector is divided by its root-mean-square, so ``y`` has RMS 1 before the gain.
    TypeError/ValueError before any computation for non-finite or mismatched inputs or a bad ``eps``.

    Book: part IV, 'QK-norm and logit soft-capping'.
    """
    x, weight, eps = _check_rms_norm_args(x, weight, eps)
    return _rms_norm(x, weight, eps)


def rms_norm_backward(x, weight, grad, eps=1e-6):
    """Backward of :func:`rms_norm`: returns ``(dx, dweight)`` for ``grad = dL/dy`` (shape of x).

    With ``r = (mean(x^2) + eps)^(-1/2)``, ``x_hat = r x`` and ``y = x_hat * w``, let ``u = dL/dx_hat = grad * w``.
    Since ``dr/dx_j = -r^3 x_j / d``, the Jacobian is ``dx_hat_i/dx_j = r delta_ij - r^3 x_i x_j / d``, so::

        dx = r (u - x_hat (u . x_hat) / d)          dweight = sum over every leading axis of grad * x_hat

    (``dx`` is ``r u`` minus its component along ``x``, scaled: moving x along itself barely changes ``x_hat``,
    and not at all as ``eps -> 0``.) Checks as in :func:`rms_norm`, and ``grad`` must have x's shape.

    Book: part IV, 'QK-norm and logit soft-capping'.
    """
    x, weight, eps = _check_rms_norm_args(x, weight, eps)
    grad = _as_float_array("grad", grad)
    if grad.shape != x.shape:
        raise ValueError(f"grad shape {grad.shape} must equal x shape {x.shape}")
    return _rms_norm_grad(x, weight, grad, eps)
