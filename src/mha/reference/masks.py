"""Masks: boolean arrays, True = may attend, broadcastable to the weights' shape ``(..., L_q, L_kv)``; the causal
mask, and how ``is_causal=True`` combines with a given mask (logical and).

Book: part I, 'Scaled dot-product attention' (masks); part II, 'Autoregressive decoding and the KV cache'.
"""

from __future__ import annotations

import numpy as np

from mha._checks import check_bool, check_int


def _check_mask(mask, target_shape, target_desc):
    """A boolean mask broadcastable *to* ``target_shape`` (the weights' shape), or None."""
    if mask is None:
        return None
    mask = np.asarray(mask)
    if mask.dtype != np.bool_:
        raise TypeError(f"mask must be a boolean array (True = may attend), got dtype {mask.dtype}")
    try:
        broadcast = np.broadcast_shapes(mask.shape, target_shape)
    except ValueError:
        broadcast = None
    if broadcast != tuple(target_shape):
        raise ValueError(
            f"mask shape {mask.shape} is not broadcastable to the attention weights shape "
            f"{tuple(target_shape)} {target_desc}"
        )
    return mask


def causal_mask(l_q, l_kv):
    """Boolean ``(l_q, l_kv)``, bottom-right aligned: query i (of the *last* l_q positions) may attend to key j iff
    ``j <= l_kv - l_q + i``. For ``l_q == l_kv`` the lower triangle; with a KV cache (l_q new queries after
    ``l_kv - l_q`` cached positions) each new query sees every cached key and itself. A query with ``l_kv - l_q + i
    < 0`` (possible when l_q > l_kv) sees no key.

    Book: part I, 'Scaled dot-product attention' (masks); part II, 'Autoregressive decoding and the KV cache'.
    """
    l_q, l_kv = check_int("l_q", l_q), check_int("l_kv", l_kv)
    return np.tril(np.ones((l_q, l_kv), dtype=bool), k=l_kv - l_q)  # (l_q, l_kv)


def _with_causal(mask, is_causal, l_q, l_kv):
    """``mask`` and (when ``is_causal``) the causal mask, by logical and; None when neither."""
    if not check_bool("is_causal", is_causal):
        return mask
    causal = causal_mask(l_q, l_kv)  # (l_q, l_kv), broadcasts against any mask
    return causal if mask is None else np.logical_and(mask, causal)
