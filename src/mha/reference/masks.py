"""Masks: boolean arrays, True = may attend, broadcastable to the weights' shape ``(..., L_q, L_kv)``; the causal
mask, the sliding-window mask, and how ``is_causal=True`` and ``window`` combine with a given mask (logical and).

Book: part I, 'Scaled dot-product attention' (masks); part IV, 'Attention in today's models' (sliding windows); part II,
'Autoregressive decoding and the KV cache'.
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


def sliding_window_mask(l_q, l_kv, window):
    """Boolean ``(l_q, l_kv)``: the causal mask restricted to the ``window`` most recent keys, the query's own
    included. Bottom-right aligned like :func:`causal_mask`: query i sits at absolute position ``p = l_kv - l_q + i``
    (the l_q queries are the last l_q of the l_kv positions) and may attend to key j iff ``p - window < j <= p``.

    So every query sees at most ``window`` keys (fewer near the start), ``window = 1`` is attention to oneself only,
    and ``window >= l_kv`` gives exactly ``causal_mask(l_q, l_kv)``. ``l_q``, ``l_kv`` and ``window`` are integers
    >= 1 (TypeError/ValueError otherwise).

    The convention is gpt-oss's (``sliding_window = 128``: the query and the 127 keys before it; its reference masks
    ``j <= p - window``), and that of Hugging Face's masks (``kv_idx > q_idx - sliding_window``). Conventions that
    count only the *past* keys see one key more for the same number: FlashAttention's ``window_size=(left, 0)``
    (keys ``p - left .. p``) and masks written ``p - j <= w`` (as in PyTorch's FlexAttention examples) mean
    ``window = left + 1`` (``w + 1``) here. A symmetric window (Longformer: ``|p - j| <= w``) is not causal and not
    this mask.

    Book: part IV, 'Attention in today's models' (sliding windows).
    """
    l_q, l_kv = check_int("l_q", l_q), check_int("l_kv", l_kv)
    window = check_int("window", window)
    offset = l_kv - l_q  # query i is at absolute position offset + i
    causal = np.tril(np.ones((l_q, l_kv), dtype=bool), k=offset)  # j <= p
    too_old = np.tril(np.ones((l_q, l_kv), dtype=bool), k=offset - window)  # j <= p - window
    return causal & ~too_old  # (l_q, l_kv)


def _sliding_window(mask, window, l_q, l_kv):
    """``mask`` and (when ``window`` is not None) the sliding-window mask, by logical and; ``window`` is checked."""
    if window is None:
        return mask
    windowed = sliding_window_mask(l_q, l_kv, window)  # (l_q, l_kv), includes the causal mask
    return windowed if mask is None else np.logical_and(mask, windowed)
