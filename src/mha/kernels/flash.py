"""FlashAttention in Triton: the online-softmax recurrence of part II run over tiles, forward and backward.

Book: part II, "From the recurrence to a kernel" (``book/part2/flash_kernel.md``), which derives every kernel
below from the chapter "Exact attention without the L × L matrix (online softmax)".

Shapes: q (N, h, L_q, d), k and v (N, g, L_kv, d), g dividing h; query head j reads key/value head j // (h/g) by
pointer arithmetic (nothing is repeated in memory). The output is (N, h, L_q, d).

Design, in one place (each kernel's docstring says more):

* **Tiling.** A forward program owns one query tile (``BLOCK_M`` rows) of one (batch, head) and loops over the key
  tiles (``BLOCK_N`` columns); the query tile, the running max m, the running sum l and the float32 accumulator
  stay on chip, and O and the log-sum-exp are written once. Key tiles that no row of the tile may see (causal) are
  never visited; tiles that every row sees in full skip the mask.
* **LSE in base e.** The kernels exponentiate with ``exp2`` (scores are pre-multiplied by ``scale * log2(e)``) but
  store the natural-log statistic ``L_i = m_i + log l_i`` of the book, float32, shape (N, h, L_q). A query row
  with no allowed key (causal with L_q > L_kv) has output 0 and ``L_i = +inf``, so ``exp(s - L_i) = 0`` in the
  backward without a special case (mathematically the log-sum-exp of an empty set is -inf; +inf is the storage
  convention that makes recomputed weights vanish).
* **Backward: recompute, two kernels, no atomics.** A preprocessing kernel forms ``D_i = rowsum(dO_i * O_i)``. Then
  one program per *key tile* of one key/value head loops over the query tiles of every query head of its group and
  accumulates dK and dV on chip; and one program per *query tile* loops over the key tiles and accumulates dQ.
  Each gradient is written exactly once by one program, so the result is deterministic and dK/dV of a GQA group
  are summed without atomics or a float32 scratch buffer. The price is that the scores S and dP = dO V^T are
  recomputed twice (in both kernels): 7 tile matrix products per tile pair instead of the 5 of an atomic-add dQ.
* **Precision.** fp16/bf16 inputs are multiplied on tensor cores and accumulated in float32 (m, l, the
  accumulators, D and the LSE are float32); float32 inputs use IEEE float32 products (not TF32).
* **Tails and head sizes.** Any L_q, L_kv: rows and columns past the end are loaded as zeros and masked where
  they could matter. head_dim up to 128, padded inside the kernel to the next power of two (at least 16) with
  masked loads, so 48 or 80 work too.
* **Tile sizes.** Under the interpreter, 16 x 16 (``INTERPRETER_TILES``). On a GPU, ``triton.autotune`` picks
  among a few candidates (``GPU_TILES``) on the first call for each dtype, head size, causal flag and
  power-of-two length bucket.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from mha.kernels._validate import check_attention_inputs, check_backward_inputs

__all__ = ["flash_attention", "flash_attention_forward", "flash_attention_backward", "FlashAttentionFunction",
           "is_interpreted"]

LOG2_E = 1.4426950408889634  # log2(e): e^x = 2^(x log2 e); the kernels spell it (and ln 2) as literals


# ---------------------------------------------------------------------------------------------------------------
# Small device functions shared by the kernels.
# ---------------------------------------------------------------------------------------------------------------

@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """a @ b accumulated in float32; ``IEEE`` asks for true float32 products (float32 inputs, not TF32).

    Book: part II, "From the recurrence to a kernel" (precision).
    """
    if IEEE:
        c = tl.dot(a, b, input_precision="ieee")
    else:
        c = tl.dot(a, b)
    return c


@triton.jit
def _load_rows(base, rows, n_rows, stride_row, stride_col, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Load ``base[rows, :HEAD_DIM]`` as a (len(rows), BLOCK_D) tile; rows past n_rows and the padding columns
    past HEAD_DIM read as 0 (zero columns change no dot product).

    Book: part II, "From the recurrence to a kernel" (tails and head-size padding).
    """
    dims = tl.arange(0, BLOCK_D)
    ptrs = base + rows[:, None] * stride_row + dims[None, :] * stride_col
    if HEAD_DIM < BLOCK_D:
        inside = (rows[:, None] < n_rows) & (dims[None, :] < HEAD_DIM)
    else:  # no padding: a mask constant along the row keeps the loads vectorised
        inside = rows[:, None] < n_rows
    return tl.load(ptrs, mask=inside, other=0.0)


@triton.jit
def _store_rows(base, tile, rows, n_rows, stride_row, stride_col, HEAD_DIM: tl.constexpr,
                BLOCK_D: tl.constexpr):
    """Store the (len(rows), BLOCK_D) ``tile`` into ``base[rows, :HEAD_DIM]``, skipping rows past n_rows.

    Book: part II, "From the recurrence to a kernel".
    """
    dims = tl.arange(0, BLOCK_D)
    ptrs = base + rows[:, None] * stride_row + dims[None, :] * stride_col
    if HEAD_DIM < BLOCK_D:
        inside = (rows[:, None] < n_rows) & (dims[None, :] < HEAD_DIM)
    else:
        inside = rows[:, None] < n_rows
    tl.store(ptrs, tile.to(base.dtype.element_ty), mask=inside)


@triton.jit
def _allowed(rows, cols, l_kv, causal_offset, IS_CAUSAL: tl.constexpr):
    """(len(rows), len(cols)) boolean: key ``col`` exists and, if causal, query ``row`` may see it.

    Bottom-right alignment: query i (of the last L_q positions) sees key j iff j <= L_kv - L_q + i, so
    ``causal_offset = L_kv - L_q``. Book: part II, "Autoregressive decoding and the KV cache".
    """
    allowed = (cols[None, :] < l_kv) & (rows[:, None] >= 0)  # the second term only broadcasts to 2-D
    if IS_CAUSAL:
        allowed = allowed & (cols[None, :] <= rows[:, None] + causal_offset)
    return allowed


@triton.jit
def _key_tiles(first_row, l_kv, causal_offset, IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr):
    """For the query tile starting at ``first_row``: ``(full_end, visible_end)``.

    Key tiles starting below ``full_end`` are seen in full by every row of the query tile (no mask needed);
    those in ``[full_end, visible_end)`` need the mask; keys from ``visible_end`` on are seen by no row and are
    skipped. Book: part II, "From the recurrence to a kernel" (the causal skip).
    """
    if IS_CAUSAL:
        # the last row sees keys < first_row + BLOCK_M + offset; the first row sees keys < first_row + offset + 1
        visible_end = tl.minimum(tl.maximum(first_row + BLOCK_M + causal_offset, 0), l_kv)
        every_row_end = tl.minimum(tl.maximum(first_row + causal_offset + 1, 0), l_kv)
    else:
        visible_end = l_kv
        every_row_end = l_kv
    full_end = (every_row_end // BLOCK_N) * BLOCK_N  # whole tiles only; a partial tile goes to the masked loop
    return full_end, visible_end


# ---------------------------------------------------------------------------------------------------------------
# Forward.
# ---------------------------------------------------------------------------------------------------------------

# [forward-kernel-start]
@triton.jit
def _forward_tile(acc, m, l, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, start_n, rows,
                  l_kv, causal_offset, scale_log2, IS_CAUSAL: tl.constexpr, MASK: tl.constexpr,
                  IEEE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr):
    """One step of the online softmax: fold the key tile starting at ``start_n`` into (acc, m, l).

    Scores are in base 2 (``scale_log2 = scale * log2 e``), so ``exp2(s - m)`` is the book's ``e^{s - m}``.
    Book: part II, "Exact attention without the L × L matrix", eq. (online-matrix).
    """
    cols = start_n + tl.arange(0, BLOCK_N)  # key positions of this tile
    k = _load_rows(k_base, cols, l_kv, stride_kn, stride_kd, HEAD_DIM, BLOCK_D)  # (BLOCK_N, BLOCK_D)
    v = _load_rows(v_base, cols, l_kv, stride_vn, stride_vd, HEAD_DIM, BLOCK_D)  # (BLOCK_N, BLOCK_D)
    s = _dot(q, tl.trans(k), IEEE) * scale_log2  # (BLOCK_M, BLOCK_N) base-2 scores
    if MASK:
        s = tl.where(_allowed(rows, cols, l_kv, causal_offset, IS_CAUSAL), s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))  # eq. (online-rec-m)
    if MASK:
        m_new_finite = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing seen yet: shift by 0, not -inf
    else:
        m_new_finite = m_new
    alpha = tl.exp2(m - m_new_finite)  # rescales the old state; 0 while it is empty
    p = tl.exp2(s - m_new_finite[:, None])  # (BLOCK_M, BLOCK_N) un-normalised weights of this tile
    l = l * alpha + tl.sum(p, 1)  # eq. (online-rec-l)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE)  # eq. (online-rec-acc), (BLOCK_M, BLOCK_D)
    return acc, m_new, l


@triton.jit
def _forward_kernel(Q, K, V, Out, Lse,
                    stride_qb, stride_qh, stride_qm, stride_qd,
                    stride_kb, stride_kh, stride_kn, stride_kd,
                    stride_vb, stride_vh, stride_vn, stride_vd,
                    stride_ob, stride_oh, stride_om, stride_od,
                    n_heads, n_rep, l_q, l_kv, scale_log2, tune_len_q, tune_len_kv,
                    IS_CAUSAL: tl.constexpr, IEEE: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    HEAD_DIM: tl.constexpr):
    """One program: one query tile of one (batch, query head); grid (cdiv(L_q, BLOCK_M), N * h).

    Keeps the Q tile, m, l and the accumulator on chip, streams K and V tiles of key/value head
    ``head // n_rep``, and writes O and the log-sum-exp (base e) once.
    ``tune_len_q`` and ``tune_len_kv`` are not read: they are the lengths rounded up to a power of two, the
    autotuner's key on a GPU.
    Book: part II, "From the recurrence to a kernel".
    """
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    batch = (pid_bh // n_heads).to(tl.int64)
    head = (pid_bh % n_heads).to(tl.int64)
    kv_head = head // n_rep  # GQA: the key/value head this query head reads, no copy
    first_row = pid_m * BLOCK_M
    rows = first_row + tl.arange(0, BLOCK_M)  # query positions of this tile

    q_base = Q + batch * stride_qb + head * stride_qh
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh
    q = _load_rows(q_base, rows, l_q, stride_qm, stride_qd, HEAD_DIM, BLOCK_D)  # (BLOCK_M, BLOCK_D)

    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running max (base 2)
    l = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)  # un-normalised output
    causal_offset = l_kv - l_q
    full_end, visible_end = _key_tiles(first_row, l_kv, causal_offset, IS_CAUSAL, BLOCK_M, BLOCK_N)
    for start_n in range(0, full_end, BLOCK_N):  # tiles every row sees in full: no mask
        acc, m, l = _forward_tile(acc, m, l, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                                  start_n, rows, l_kv, causal_offset, scale_log2,
                                  IS_CAUSAL, False, IEEE, BLOCK_N, BLOCK_D, HEAD_DIM)
    for start_n in range(full_end, visible_end, BLOCK_N):  # the diagonal and the tail: masked
        acc, m, l = _forward_tile(acc, m, l, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                                  start_n, rows, l_kv, causal_offset, scale_log2,
                                  IS_CAUSAL, True, IEEE, BLOCK_N, BLOCK_D, HEAD_DIM)

    empty = l == 0.0  # rows with no allowed key
    l_safe = tl.where(empty, 1.0, l)
    out = acc / l_safe[:, None]  # eq. (online-final); 0 for empty rows, whose acc is 0
    lse = tl.where(empty, float("inf"), (m + tl.log2(l_safe)) * 0.6931471805599453)  # base e: ln 2 (m + log2 l)
    o_base = Out + batch * stride_ob + head * stride_oh
    _store_rows(o_base, out, rows, l_q, stride_om, stride_od, HEAD_DIM, BLOCK_D)
    tl.store(Lse + pid_bh.to(tl.int64) * l_q + rows, lse, mask=rows < l_q)
# [forward-kernel-end]


# ---------------------------------------------------------------------------------------------------------------
# Backward.
# ---------------------------------------------------------------------------------------------------------------

# [backward-kernels-start]
@triton.jit
def _backward_preprocess_kernel(Out, dOut, Delta,
                                stride_ob, stride_oh, stride_om, stride_od,
                                stride_db, stride_dh, stride_dm, stride_dd,
                                n_heads, l_q,
                                BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr):
    """D_i = rowsum(dO_i * O_i) = sum_j A_ij dA_ij, float32, one program per query tile of one (batch, head).

    Book: part II, "From the recurrence to a kernel" (the backward); the identity: "Exact attention without the
    L × L matrix", section on the backward pass.
    """
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    batch = (pid_bh // n_heads).to(tl.int64)
    head = (pid_bh % n_heads).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_base = Out + batch * stride_ob + head * stride_oh
    do_base = dOut + batch * stride_db + head * stride_dh
    o = _load_rows(o_base, rows, l_q, stride_om, stride_od, HEAD_DIM, BLOCK_D)  # (BLOCK_M, BLOCK_D)
    do = _load_rows(do_base, rows, l_q, stride_dm, stride_dd, HEAD_DIM, BLOCK_D)  # (BLOCK_M, BLOCK_D)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)  # (BLOCK_M,)
    tl.store(Delta + pid_bh.to(tl.int64) * l_q + rows, delta, mask=rows < l_q)


@triton.jit
def _recompute_weights(q, k, lse_log2, rows, cols, l_kv, causal_offset, scale_log2,
                       IS_CAUSAL: tl.constexpr, MASK: tl.constexpr, IEEE: tl.constexpr):
    """P = exp(S - L) for one (query tile, key tile), from Q, K and the stored log-sum-exp; no max, no sum.

    Book: part II, "Exact attention without the L × L matrix", eq. (online-recompute).
    """
    s = _dot(q, tl.trans(k), IEEE) * scale_log2  # (BLOCK_M, BLOCK_N) base-2 scores
    if MASK:
        s = tl.where(_allowed(rows, cols, l_kv, causal_offset, IS_CAUSAL), s, float("-inf"))
    return tl.exp2(s - lse_log2[:, None])  # (BLOCK_M, BLOCK_N); masked entries and rows with L = +inf give 0


@triton.jit
def _backward_kv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_qd, stride_dm,
                      stride_dd, start_m, cols, l_q, l_kv, causal_offset, scale_log2,
                      IS_CAUSAL: tl.constexpr, MASK: tl.constexpr, IEEE: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Add one query tile's contribution to dK and dV of the key tile ``cols``: dV += P^T dO, dK += dS^T Q.

    dS = P * (dP - D) with dP = dO V^T (the scale is applied once, at the end). Book: part II, "The backward
    pass"; "From the recurrence to a kernel".
    """
    rows = start_m + tl.arange(0, BLOCK_M)
    q = _load_rows(q_base, rows, l_q, stride_qm, stride_qd, HEAD_DIM, BLOCK_D)  # (BLOCK_M, BLOCK_D)
    do = _load_rows(do_base, rows, l_q, stride_dm, stride_dd, HEAD_DIM, BLOCK_D)  # (BLOCK_M, BLOCK_D)
    lse_log2 = tl.load(lse_base + rows, mask=rows < l_q, other=float("inf")) * 1.4426950408889634
    delta = tl.load(delta_base + rows, mask=rows < l_q, other=0.0)  # (BLOCK_M,)
    p = _recompute_weights(q, k, lse_log2, rows, cols, l_kv, causal_offset, scale_log2,
                           IS_CAUSAL, MASK, IEEE)  # (BLOCK_M, BLOCK_N)
    dv += _dot(tl.trans(p.to(do.dtype)), do, IEEE)  # (BLOCK_N, BLOCK_D)
    dp = _dot(do, tl.trans(v), IEEE)  # (BLOCK_M, BLOCK_N)
    ds = p * (dp - delta[:, None])  # (BLOCK_M, BLOCK_N), dS / scale
    dk += _dot(tl.trans(ds.to(q.dtype)), q, IEEE)  # (BLOCK_N, BLOCK_D)
    return dk, dv


@triton.jit
def _query_tiles(first_col, l_q, l_kv, causal_offset, IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    """For the key tile starting at ``first_col``: ``(first_start, full_start, end)`` over query tiles.

    Query tiles in ``[first_start, full_start)`` need the mask (the diagonal, or every tile when this key tile
    runs past L_kv); those in ``[full_start, end)`` see the whole key tile; rows before ``first_start`` see none
    of it and are skipped. Book: part II, "From the recurrence to a kernel" (the causal skip).
    """
    end = tl.cdiv(l_q, BLOCK_M) * BLOCK_M
    if IS_CAUSAL:
        # row i sees key j iff i >= j - offset: first_col needs i >= first_col - offset, the last key one more
        first_row = tl.minimum(tl.maximum(first_col - causal_offset, 0), end)
        first_start = (first_row // BLOCK_M) * BLOCK_M
        every_col_row = tl.minimum(tl.maximum(first_col + BLOCK_N - 1 - causal_offset, 0), end)
        full_start = tl.cdiv(every_col_row, BLOCK_M) * BLOCK_M
    else:
        first_start = 0
        full_start = 0
    full_start = tl.where(first_col + BLOCK_N > l_kv, end, full_start)  # a tail key tile: mask them all
    return first_start, full_start, end


@triton.jit
def _backward_kv_kernel(Q, K, V, dOut, Lse, Delta, dK, dV,
                        stride_qb, stride_qh, stride_qm, stride_qd,
                        stride_kb, stride_kh, stride_kn, stride_kd,
                        stride_vb, stride_vh, stride_vn, stride_vd,
                        stride_db, stride_dh, stride_dm, stride_dd,
                        stride_dkb, stride_dkh, stride_dkn, stride_dkd,
                        stride_dvb, stride_dvh, stride_dvn, stride_dvd,
                        n_kv_heads, n_rep, n_heads, l_q, l_kv, scale, scale_log2,
                        tune_len_q, tune_len_kv, IS_CAUSAL: tl.constexpr, IEEE: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    HEAD_DIM: tl.constexpr):
    """One program: one key tile of one (batch, key/value head); grid (cdiv(L_kv, BLOCK_N), N * g).

    Keeps K, V, dK and dV of its tile on chip and loops over the query tiles of each of the ``n_rep``
    query heads that read this key/value head, so a GQA group's gradients are summed here, with no atomics.
    ``tune_len_q``, ``tune_len_kv``: as in the forward: they are the lengths rounded up to a power of two, the
    autotuner's key on a GPU.
    Book: part II, "From the recurrence to a kernel".
    """
    pid_n = tl.program_id(0)
    pid_bg = tl.program_id(1)
    batch = (pid_bg // n_kv_heads).to(tl.int64)
    kv_head = (pid_bg % n_kv_heads).to(tl.int64)
    first_col = pid_n * BLOCK_N
    cols = first_col + tl.arange(0, BLOCK_N)  # key positions of this tile
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh
    k = _load_rows(k_base, cols, l_kv, stride_kn, stride_kd, HEAD_DIM, BLOCK_D)  # (BLOCK_N, BLOCK_D)
    v = _load_rows(v_base, cols, l_kv, stride_vn, stride_vd, HEAD_DIM, BLOCK_D)  # (BLOCK_N, BLOCK_D)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    causal_offset = l_kv - l_q
    first_start, full_start, end = _query_tiles(first_col, l_q, l_kv, causal_offset, IS_CAUSAL,
                                                BLOCK_M, BLOCK_N)
    for member in range(0, n_rep):  # the query heads of this key/value head's group
        head = kv_head * n_rep + member
        q_base = Q + batch * stride_qb + head * stride_qh
        do_base = dOut + batch * stride_db + head * stride_dh
        lse_base = Lse + (batch * n_heads + head) * l_q
        delta_base = Delta + (batch * n_heads + head) * l_q
        for start_m in range(first_start, full_start, BLOCK_M):  # the diagonal (and tails): masked
            dk, dv = _backward_kv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_qd,
                                       stride_dm, stride_dd, start_m, cols, l_q, l_kv,
                                       causal_offset, scale_log2, IS_CAUSAL, True, IEEE, BLOCK_M, BLOCK_D,
                                       HEAD_DIM)
        for start_m in range(full_start, end, BLOCK_M):  # query tiles that see the whole key tile
            dk, dv = _backward_kv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_qd,
                                       stride_dm, stride_dd, start_m, cols, l_q, l_kv,
                                       causal_offset, scale_log2, IS_CAUSAL, False, IEEE, BLOCK_M, BLOCK_D,
                                       HEAD_DIM)
    dk = dk * scale  # dK = scale dS^T Q
    dk_base = dK + batch * stride_dkb + kv_head * stride_dkh
    dv_base = dV + batch * stride_dvb + kv_head * stride_dvh
    _store_rows(dk_base, dk, cols, l_kv, stride_dkn, stride_dkd, HEAD_DIM, BLOCK_D)
    _store_rows(dv_base, dv, cols, l_kv, stride_dvn, stride_dvd, HEAD_DIM, BLOCK_D)


@triton.jit
def _backward_q_tile(dq, q, do, lse_log2, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                     start_n, rows, l_kv, causal_offset, scale_log2,
                     IS_CAUSAL: tl.constexpr, MASK: tl.constexpr, IEEE: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Add one key tile's contribution to dQ of the query tile: dQ += dS K (the scale is applied at the end).

    Book: part II, "The backward pass"; "From the recurrence to a kernel".
    """
    cols = start_n + tl.arange(0, BLOCK_N)
    k = _load_rows(k_base, cols, l_kv, stride_kn, stride_kd, HEAD_DIM, BLOCK_D)  # (BLOCK_N, BLOCK_D)
    v = _load_rows(v_base, cols, l_kv, stride_vn, stride_vd, HEAD_DIM, BLOCK_D)  # (BLOCK_N, BLOCK_D)
    p = _recompute_weights(q, k, lse_log2, rows, cols, l_kv, causal_offset, scale_log2,
                           IS_CAUSAL, MASK, IEEE)  # (BLOCK_M, BLOCK_N)
    dp = _dot(do, tl.trans(v), IEEE)  # (BLOCK_M, BLOCK_N)
    ds = p * (dp - delta[:, None])  # (BLOCK_M, BLOCK_N), dS / scale
    dq += _dot(ds.to(k.dtype), k, IEEE)  # (BLOCK_M, BLOCK_D)
    return dq


@triton.jit
def _backward_q_kernel(Q, K, V, dOut, Lse, Delta, dQ,
                       stride_qb, stride_qh, stride_qm, stride_qd,
                       stride_kb, stride_kh, stride_kn, stride_kd,
                       stride_vb, stride_vh, stride_vn, stride_vd,
                       stride_db, stride_dh, stride_dm, stride_dd,
                       stride_dqb, stride_dqh, stride_dqm, stride_dqd,
                       n_rep, n_heads, l_q, l_kv, scale, scale_log2, tune_len_q, tune_len_kv,
                       IS_CAUSAL: tl.constexpr, IEEE: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    HEAD_DIM: tl.constexpr):
    """One program: one query tile of one (batch, query head), looping over key tiles like the forward;
    grid (cdiv(L_q, BLOCK_M), N * h). Keeps Q, dO, L, D and dQ of its tile on chip and writes dQ once.
    ``tune_len_q``, ``tune_len_kv``: as in the forward.

    Book: part II, "From the recurrence to a kernel".
    """
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    batch = (pid_bh // n_heads).to(tl.int64)
    head = (pid_bh % n_heads).to(tl.int64)
    kv_head = head // n_rep
    first_row = pid_m * BLOCK_M
    rows = first_row + tl.arange(0, BLOCK_M)
    q_base = Q + batch * stride_qb + head * stride_qh
    do_base = dOut + batch * stride_db + head * stride_dh
    q = _load_rows(q_base, rows, l_q, stride_qm, stride_qd, HEAD_DIM, BLOCK_D)  # (BLOCK_M, BLOCK_D)
    do = _load_rows(do_base, rows, l_q, stride_dm, stride_dd, HEAD_DIM, BLOCK_D)  # (BLOCK_M, BLOCK_D)
    row_stats = pid_bh.to(tl.int64) * l_q + rows
    lse_log2 = tl.load(Lse + row_stats, mask=rows < l_q, other=float("inf")) * 1.4426950408889634
    delta = tl.load(Delta + row_stats, mask=rows < l_q, other=0.0)  # (BLOCK_M,)
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    causal_offset = l_kv - l_q
    full_end, visible_end = _key_tiles(first_row, l_kv, causal_offset, IS_CAUSAL, BLOCK_M, BLOCK_N)
    for start_n in range(0, full_end, BLOCK_N):
        dq = _backward_q_tile(dq, q, do, lse_log2, delta, k_base, v_base, stride_kn, stride_kd, stride_vn,
                              stride_vd, start_n, rows, l_kv, causal_offset, scale_log2,
                              IS_CAUSAL, False, IEEE, BLOCK_N, BLOCK_D, HEAD_DIM)
    for start_n in range(full_end, visible_end, BLOCK_N):
        dq = _backward_q_tile(dq, q, do, lse_log2, delta, k_base, v_base, stride_kn, stride_kd, stride_vn,
                              stride_vd, start_n, rows, l_kv, causal_offset, scale_log2,
                              IS_CAUSAL, True, IEEE, BLOCK_N, BLOCK_D, HEAD_DIM)
    dq = dq * scale  # dQ = scale dS K
    dq_base = dQ + batch * stride_dqb + head * stride_dqh
    _store_rows(dq_base, dq, rows, l_q, stride_dqm, stride_dqd, HEAD_DIM, BLOCK_D)
# [backward-kernels-end]


# ---------------------------------------------------------------------------------------------------------------
# Host side: tile sizes, launches, the autograd Function.
# ---------------------------------------------------------------------------------------------------------------


class Tiles(NamedTuple):
    """Launch configuration of one kernel: tile rows (queries, B_r), tile columns (keys, B_c), warps, stages."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2


def is_interpreted() -> bool:
    """True when these kernels run under Triton's CPU interpreter (``TRITON_INTERPRET=1`` at import time).

    Triton reads the variable when a kernel is *defined* (when this module is first imported), not when it runs.
    """
    return type(_forward_kernel).__name__ == "InterpretedFunction"


#: Tiles under the interpreter: the smallest tl.dot accepts on a GPU, so small test shapes still span several
#: tiles (tails, the causal diagonal and both loops are exercised). Tests may replace them.
INTERPRETER_TILES = {"forward": Tiles(16, 16), "backward_kv": Tiles(16, 16), "backward_q": Tiles(16, 16)}

#: Candidate tiles on a GPU, (B_r, B_c, warps, stages), per kernel, precision and head width (d <= 64 or wider),
#: in the range FlashAttention-2 uses. Not timed on hardware here (no GPU was available): Triton's autotuner times
#: them on the first call of each (dtype, head size, causal, power-of-two length bucket) and keeps the fastest.
#: Every 16-bit candidate was compiled for sm_90 without a GPU (triton.compile with an explicit target): all fit in
#: shared memory and none spills registers except forward (128, 64, 8, 3) at d = 128 (92 bytes), kept because it is
#: the usual best at that width. The float32 candidates (for checking, not speed) were only partly compiled.
GPU_TILES = {
    ("forward", "half", False): [(128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3), (128, 32, 4, 4),
                                 (64, 32, 4, 4)],
    ("forward", "half", True): [(64, 64, 4, 3), (64, 32, 4, 4), (128, 64, 8, 3), (128, 32, 8, 3),
                                (64, 64, 8, 3)],
    ("backward_kv", "half", False): [(32, 128, 8, 2), (32, 64, 4, 2), (64, 64, 8, 2), (16, 64, 4, 2)],
    ("backward_kv", "half", True): [(32, 64, 8, 2), (16, 64, 8, 2), (32, 32, 8, 2)],
    ("backward_q", "half", False): [(128, 32, 8, 2), (128, 64, 8, 2), (64, 64, 4, 2), (64, 32, 4, 2)],
    ("backward_q", "half", True): [(64, 32, 8, 2), (64, 64, 8, 2), (32, 32, 4, 2), (32, 64, 4, 2)],
    ("forward", "float32", False): [(32, 32, 4, 2), (64, 32, 8, 2)],
    ("forward", "float32", True): [(32, 32, 4, 2), (16, 32, 4, 2)],
    ("backward_kv", "float32", False): [(32, 64, 4, 1), (16, 32, 4, 1)],
    ("backward_kv", "float32", True): [(16, 32, 4, 1), (16, 16, 4, 1)],
    ("backward_q", "float32", False): [(64, 32, 4, 1), (32, 32, 4, 1)],
    ("backward_q", "float32", True): [(32, 16, 4, 1), (16, 16, 4, 1)],
}
PREPROCESS_ROWS = 64  # the D_i kernel's query tile on a GPU (16 under the interpreter)
_TUNE_KEY = ["tune_len_q", "tune_len_kv", "HEAD_DIM", "IS_CAUSAL"]  # the autotuner also keys on the dtypes
_KERNELS = {"forward": _forward_kernel, "backward_kv": _backward_kv_kernel, "backward_q": _backward_q_kernel}
_TUNED = {}


def _tuned_kernel(kind: str, dtype: torch.dtype, block_d: int):
    """The GPU kernel ``kind`` wrapped in ``triton.autotune`` over its ``GPU_TILES`` (built once per kind,
    precision and head width)."""
    key = (kind, "float32" if dtype == torch.float32 else "half", block_d > 64)
    if key not in _TUNED:
        configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
                   for m, n, w, s in GPU_TILES[key]]
        _TUNED[key] = triton.autotune(configs=configs, key=_TUNE_KEY)(_KERNELS[kind])
    return _TUNED[key]


def _launch(kind: str, grid, args, dtype: torch.dtype, **constexprs) -> None:
    """Launch ``kind`` on ``grid(meta)``: fixed tiles under the interpreter, autotuned tiles on a GPU."""
    if is_interpreted():
        tiles = INTERPRETER_TILES[kind]
        _KERNELS[kind][grid](*args, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, **constexprs)
    else:
        _tuned_kernel(kind, dtype, constexprs["BLOCK_D"])[grid](*args, **constexprs)


def _padded_head_dim(head_dim: int) -> int:
    """head_dim rounded up to a power of two, at least 16 (tl.dot's smallest inner size on a GPU)."""
    return max(16, triton.next_power_of_2(head_dim))


def _tune_len(seq_len: int) -> int:
    """A length rounded up to a power of two: the autotuner re-tunes only when a length crosses one."""
    return triton.next_power_of_2(seq_len)


def _strides(t: torch.Tensor) -> tuple[int, int, int, int]:
    return tuple(t.stride())  # (batch, head, position, feature)


def _forward(q, k, v, is_causal: bool, scale: float):
    """Launch the forward kernel on checked inputs; returns (out (N, h, L_q, d), lse (N, h, L_q) float32)."""
    n_batch, n_heads, l_q, head_dim = q.shape
    n_kv_heads, l_kv = k.shape[1], k.shape[2]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)  # (N, h, L_q, d)
    lse = torch.empty((n_batch, n_heads, l_q), device=q.device, dtype=torch.float32)  # (N, h, L_q)
    args = (q, k, v, out, lse, *_strides(q), *_strides(k), *_strides(v), *_strides(out),
            n_heads, n_heads // n_kv_heads, l_q, l_kv, scale * LOG2_E,
            _tune_len(l_q), _tune_len(l_kv))
    grid = lambda meta: (triton.cdiv(l_q, meta["BLOCK_M"]), n_batch * n_heads)  # noqa: E731
    _launch("forward", grid, args, q.dtype, IS_CAUSAL=is_causal, IEEE=q.dtype == torch.float32,
            BLOCK_D=_padded_head_dim(head_dim), HEAD_DIM=head_dim)
    return out, lse


def _backward(q, k, v, out, lse, grad_out, is_causal: bool, scale: float):
    """Launch the three backward kernels on checked inputs; returns (dq, dk, dv) in the inputs' dtype."""
    n_batch, n_heads, l_q, head_dim = q.shape
    n_kv_heads, l_kv = k.shape[1], k.shape[2]
    shapes = {"BLOCK_D": _padded_head_dim(head_dim), "HEAD_DIM": head_dim}
    flags = {"IS_CAUSAL": is_causal, "IEEE": q.dtype == torch.float32} | shapes
    delta = torch.empty((n_batch, n_heads, l_q), device=q.device, dtype=torch.float32)  # (N, h, L_q)
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)  # (N, h, L_q, d)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)  # (N, g, L_kv, d)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)  # (N, g, L_kv, d)

    rows = INTERPRETER_TILES["backward_q"].block_m if is_interpreted() else PREPROCESS_ROWS
    _backward_preprocess_kernel[(triton.cdiv(l_q, rows), n_batch * n_heads)](
        out, grad_out, delta, *_strides(out), *_strides(grad_out), n_heads, l_q, BLOCK_M=rows, **shapes)
    common = (n_heads, l_q, l_kv, scale, scale * LOG2_E, _tune_len(l_q), _tune_len(l_kv))
    kv_args = (q, k, v, grad_out, lse, delta, dk, dv, *_strides(q), *_strides(k), *_strides(v),
               *_strides(grad_out), *_strides(dk), *_strides(dv), n_kv_heads, n_heads // n_kv_heads, *common)
    kv_grid = lambda meta: (triton.cdiv(l_kv, meta["BLOCK_N"]), n_batch * n_kv_heads)  # noqa: E731
    _launch("backward_kv", kv_grid, kv_args, q.dtype, **flags)
    q_args = (q, k, v, grad_out, lse, delta, dq, *_strides(q), *_strides(k), *_strides(v), *_strides(grad_out),
              *_strides(dq), n_heads // n_kv_heads, *common)
    q_grid = lambda meta: (triton.cdiv(l_q, meta["BLOCK_M"]), n_batch * n_heads)  # noqa: E731
    _launch("backward_q", q_grid, q_args, q.dtype, **flags)
    return dq, dk, dv


class FlashAttentionFunction(torch.autograd.Function):
    """``softmax(scale q k^T) v`` with the Triton forward and backward; saves q, k, v, out and the LSE only.

    Book: part II, "From the recurrence to a kernel".
    """

    @staticmethod
    def forward(ctx, q, k, v, is_causal: bool, scale: float):
        out, lse = _forward(q, k, v, is_causal, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal, ctx.scale = is_causal, scale
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward(q, k, v, out, lse, grad_out, ctx.is_causal, ctx.scale)
        return dq, dk, dv, None, None


def flash_attention(q, k, v, is_causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """Exact attention ``softmax(scale q k^T) v`` by FlashAttention tiles, differentiable in q, k and v.

    q ``(N, h, L_q, d)``; k and v ``(N, g, L_kv, d)`` with g dividing h (g = h: MHA, g = 1: MQA, between: GQA;
    query head j reads key/value head j // (h/g), nothing is copied). ``is_causal``: bottom-right aligned, query i
    sees key j iff j <= L_kv - L_q + i; a query row with no allowed key gets a zero output and zero gradient.
    ``scale`` defaults to 1/sqrt(d). head_dim d <= 128; float32 anywhere, float16/bfloat16 on CUDA. CPU tensors
    need Triton's interpreter (``TRITON_INTERPRET=1`` set before this module is imported). Returns
    ``(N, h, L_q, d)`` in the inputs' dtype.

    Book: part II, "From the recurrence to a kernel".
    """
    is_causal, scale = check_attention_inputs(q, k, v, is_causal, scale, interpreted=is_interpreted())
    return FlashAttentionFunction.apply(q, k, v, is_causal, scale)


def flash_attention_forward(q, k, v, is_causal: bool = False, scale: float | None = None):
    """The forward kernel alone (no autograd): ``(out (N, h, L_q, d), lse (N, h, L_q) float32)``.

    ``lse[b, j, i] = log sum_k exp(s_ik)`` over the keys query i may see (base e, the book's L_i = m_i + log l_i);
    ``+inf`` for a row with no allowed key. Arguments as :func:`flash_attention`.

    Book: part II, "From the recurrence to a kernel".
    """
    is_causal, scale = check_attention_inputs(q, k, v, is_causal, scale, interpreted=is_interpreted())
    with torch.no_grad():
        return _forward(q, k, v, is_causal, scale)


def flash_attention_backward(q, k, v, out, lse, grad_out, is_causal: bool = False, scale: float | None = None):
    """The backward kernels alone: ``(dq, dk, dv)`` of ``sum(out * grad_out)`` from q, k, v, the forward's
    ``out`` and ``lse``, and ``grad_out`` (same shape as ``out``). The weights are recomputed, never stored.

    Book: part II, "From the recurrence to a kernel".
    """
    is_causal, scale = check_attention_inputs(q, k, v, is_causal, scale, interpreted=is_interpreted())
    check_backward_inputs(q, out, lse, grad_out)
    with torch.no_grad():
        return _backward(q, k, v, out, lse, grad_out, is_causal, scale)
