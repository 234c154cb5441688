"""Online softmax (the FlashAttention recurrence): exact attention without the L_q x L_kv matrix.

Book: part II, 'Exact attention without the L × L matrix (online softmax)'.
"""

from __future__ import annotations

import numpy as np

from mha._checks import check_int
from mha.reference.checks import _check_attention_args, _check_flag
from mha.reference.scaled_dot_product import _scores


def _normalise(acc, l):
    """``acc / l``, and 0 where ``l = 0`` (rows with no allowed key)."""
    return np.divide(acc, l, out=np.zeros_like(acc), where=l > 0)  # (..., L_q, d_v)


def _row_state(m, l):
    """The per-row statistics of the online softmax as (..., L_q) arrays: m, l and lse = m + log l (-inf if l = 0)."""
    lse = np.full_like(l, -np.inf)
    np.log(l, out=lse, where=l > 0)
    return {"m": m[..., 0].copy(), "l": l[..., 0].copy(), "lse": (m + lse)[..., 0]}


def online_softmax_attention(q, k, v, block_size, mask=None, scale=None, is_causal=False, return_stats=False,
                             return_state=False, keep_history=False):
    """Exact attention without the L_q x L_kv matrix: keys/values visited in blocks of ``block_size``.

    Running row max ``m``, running normaliser ``l`` and un-normalised accumulator ``acc``; for each key block B::

        S_B = scale q K_B^T            m' = max(m, rowmax(S_B))         P = exp(S_B - m')
        l' = exp(m - m') l + rowsum(P)                 acc' = exp(m - m') acc + P V_B

    and finally ``out = acc / l``. Same arguments and conventions as ``scaled_dot_product_attention`` (``mask``,
    ``scale``, ``is_causal``) plus
    ``block_size`` (integer >= 1; larger than L_kv means a single block). Returns ``out`` only (the weights are
    exactly what this form never stores). All-masked query rows give a zero output row. Equal to the naive form to
    float64 rounding.

    With ``return_stats=True`` returns ``(out, stats)`` where ``stats`` counts float64 elements:
    ``'max_block_elements'`` = the largest score block held at once (``batch * L_q * min(block_size, L_kv)``),
    ``'full_matrix_elements'`` = what the naive form materialises (``batch * L_q * L_kv``), ``'n_blocks'``, and
    ``'state_elements'`` = the running state ``m``, ``l``, ``acc`` (``batch * L_q * (2 + d_v)``).

    With ``return_state=True`` returns ``(out, state)`` (``(out, stats, state)`` if both flags are set), where
    ``state`` is a dict of the final per-row statistics, each of shape ``(..., L_q)`` (the broadcast batch axes,
    then one entry per query row):

    * ``'m'``: the row maximum of the allowed scaled scores, ``max_j s_j``;
    * ``'l'``: the normaliser ``sum_j exp(s_j - m)`` (>= 1 for a row with at least one allowed key);
    * ``'lse'``: the logsumexp ``m + log l = log sum_j exp(s_j)``, the one number per row that FlashAttention keeps
      for its backward pass (the weights are ``exp(s_j - lse)``);
    * ``'history'``: ``None``, or with ``keep_history=True`` a list with one dict per key block, in order, holding
      the state after that block: ``'stop'`` (number of keys seen so far), ``'m'``, ``'l'``, ``'lse'`` (shape
      ``(..., L_q)``), ``'alpha'`` = ``exp(m_before - m_after)``, the factor that rescaled the old state
      (``(..., L_q)``; 0 while the old state is empty, as in the first block), and ``'out'`` = ``acc / l``, the
      attention output over the keys seen so far (``(..., L_q, d_v)``). The last entry equals the final state.
      The history costs ``n_blocks`` copies of the state: it is for displaying the recurrence on small inputs,
      not for long sequences.

    Fully masked rows (and, in the history, rows with no allowed key among the keys seen so far): ``m = -inf``,
    ``l = 0``, ``lse = -inf``, output 0 (the empty-state conventions; no NaN, no warning).
    ``keep_history=True`` requires ``return_state=True``; the three flags must be True or False (TypeError).

    Book: part II, 'Exact attention without the L × L matrix (online softmax)'.
    """
    q, k, v, batch, mask, scale = _check_attention_args(q, k, v, mask, scale, is_causal)
    block_size = check_int("block_size", block_size)
    return_stats = _check_flag("return_stats", return_stats)
    return_state = _check_flag("return_state", return_state)
    keep_history = _check_flag("keep_history", keep_history)
    if keep_history and not return_state:
        raise ValueError("keep_history=True requires return_state=True (the history is returned inside the state)")
    l_q, l_kv, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
    if mask is not None:
        mask = np.broadcast_to(mask, batch + (l_q, l_kv))  # a view: (..., L_q, L_kv), nothing materialised

    m = np.full(batch + (l_q, 1), -np.inf)  # running row max
    l = np.zeros(batch + (l_q, 1))  # running sum of exp(s - m)
    acc = np.zeros(batch + (l_q, d_v))  # running sum of exp(s - m) v
    max_block, n_blocks = 0, 0
    history = [] if keep_history else None
    for start in range(0, l_kv, block_size):
        stop = min(start + block_size, l_kv)
        s = _scores(q, k[..., start:stop, :], scale)  # (..., L_q, B)
        if mask is not None:
            s = np.where(mask[..., start:stop], s, -np.inf)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        shift = np.where(np.isfinite(m_new), m_new, 0.0)  # rows with nothing allowed yet: exp(-inf) = 0 anyway
        with np.errstate(over="ignore", under="ignore"):  # exponents <= 0: results in [0, 1], underflow -> 0
            p = np.exp(s - shift)  # (..., L_q, B)
            alpha = np.exp(m - shift)  # rescales the old state to the new max
        l = alpha * l + p.sum(axis=-1, keepdims=True)
        acc = alpha * acc + p @ v[..., start:stop, :]
        m = m_new
        max_block, n_blocks = max(max_block, s.size), n_blocks + 1
        if keep_history:
            history.append({"stop": stop, **_row_state(m, l), "alpha": alpha[..., 0].copy(), "out": _normalise(acc, l)})
    out = _normalise(acc, l)  # (..., L_q, d_v)
    results = (out,)
    if return_stats:
        n_batch = int(np.prod(batch, dtype=np.int64))
        results += ({
            "max_block_elements": max_block,
            "full_matrix_elements": n_batch * l_q * l_kv,
            "n_blocks": n_blocks,
            "state_elements": n_batch * l_q * (2 + d_v),
        },)
    if return_state:
        results += ({**_row_state(m, l), "history": history},)
    return results[0] if len(results) == 1 else results
