"""Redundancy between heads: how differently two heads spread their attention over the same input (Jensen-Shannon
divergence), and how much the subspaces two heads read from or write to share (principal angles).

Book: part III, "What heads learn".
"""

from __future__ import annotations

import numpy as np

from mha._checks import check_int
from mha.experiments.analysis.patterns import _as_float64, _check_distributions, _check_weights

# ------------------------------------------------------------------------------------------------ redundancy
def js_divergence(p, q) -> np.ndarray:
    """Jensen-Shannon divergence (natural log) between distributions along the last axis; broadcasts.

    JS(p, q) = KL(p || m) / 2 + KL(q || m) / 2 with m = (p + q) / 2, and 0 ln 0 = 0. It is symmetric, 0 iff
    p = q, and at most ln 2 (reached when p and q have disjoint supports).

    Book: part III, "What heads learn".
    """
    p, q = _as_float64(p, "p"), _as_float64(q, "q")
    if p.ndim == 0 or q.ndim == 0 or p.shape[-1] != q.shape[-1]:
        raise ValueError(f"p and q must be distributions over the same last axis, got shapes {p.shape} and "
                         f"{q.shape}")
    try:
        np.broadcast_shapes(p.shape, q.shape)
    except ValueError:
        raise ValueError(f"p and q must broadcast, got shapes {p.shape} and {q.shape}") from None
    _check_distributions(p, "p")
    _check_distributions(q, "q")
    m = 0.5 * (p + q)

    def kl_to_m(a):
        ratio = np.where(a > 0, a / np.where(m > 0, m, 1.0), 1.0)  # m > 0 wherever a > 0
        return np.where(a > 0, a * np.log(ratio), 0.0).sum(axis=-1)

    return np.maximum(0.5 * kl_to_m(p) + 0.5 * kl_to_m(q), 0.0)  # tiny negatives from rounding -> 0


def pairwise_head_js(weights, first_query: int = 1) -> np.ndarray:
    """(h, h): mean Jensen-Shannon divergence between the rows of every pair of heads on the same input.

    Entry [a, b] averages JS(w[n, a, t], w[n, b, t]) over sequences n and queries t >= ``first_query`` (default 1:
    row 0 of a causal map has one key, so every pair agrees there trivially). 0 on the diagonal; ln 2 for heads
    that never attend to the same key.

    Book: part III, "What heads learn".
    """
    w = _check_weights(weights)
    check_int("first_query", first_query, minimum=0, maximum=w.shape[-2] - 1)
    rows = w[:, :, first_query:, :]  # (N, h, L', L)
    n_heads = w.shape[1]
    out = np.zeros((n_heads, n_heads))
    for a in range(n_heads):  # one pair at a time: memory O(N L^2), not O(N h^2 L^2)
        for b in range(a + 1, n_heads):
            out[a, b] = out[b, a] = js_divergence(rows[:, a], rows[:, b]).mean()  # (N, L') -> mean
    return out


def off_diagonal(matrix) -> np.ndarray:
    """The entries of a square (h, h) matrix of head pairs that pair two different heads (i != j), row by row."""
    matrix = np.asarray(matrix)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"matrix must be square (h, h), got shape {matrix.shape}")
    return matrix[~np.eye(len(matrix), dtype=bool)]


def principal_angles(A, B) -> np.ndarray:
    """Cosines of the principal angles between the column spaces of A (d, p) and B (d, q), largest first.

    Orthonormal bases Q_A, Q_B from QR decompositions; the cosines are the singular values of Q_A^T Q_B
    (Bjorck and Golub 1973), min(p, q) of them, in [0, 1]. 1 means a shared direction, 0 an orthogonal one.
    A and B must have full column rank.

    Book: part III, "What heads learn".
    """
    a, b = _as_float64(A, "A"), _as_float64(B, "B")
    for name, m in (("A", a), ("B", b)):
        if m.ndim != 2 or m.shape[1] == 0 or m.shape[1] > m.shape[0]:
            raise ValueError(f"{name} must be a (d, p) matrix with 1 <= p <= d (p columns spanning a subspace of "
                             f"R^d), got shape {m.shape}")
        if not np.all(np.isfinite(m)):
            raise ValueError(f"{name} holds non-finite values")
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"A and B must have the same number of rows d, got shapes {a.shape} and {b.shape}")
    bases = []
    for name, m in (("A", a), ("B", b)):
        q, r = np.linalg.qr(m)  # m = q r, q (d, p) orthonormal columns
        diag = np.abs(np.diag(r))
        if diag.min() <= 1e-10 * max(diag.max(), np.finfo(float).tiny):
            raise ValueError(f"{name} (shape {m.shape}) does not have full column rank: its columns span fewer "
                             f"than {m.shape[1]} dimensions")
        bases.append(q)
    cosines = np.linalg.svd(bases[0].T @ bases[1], compute_uv=False)  # (min(p, q),), descending
    return np.clip(cosines, 0.0, 1.0)


def subspace_overlap(A, B) -> float:
    """Mean squared cosine of the principal angles of A and B: ||Q_A^T Q_B||_F^2 / min(p, q), in [0, 1].

    0 for orthogonal subspaces, 1 when one contains the other. Two independent uniformly random subspaces of
    dimensions p <= q in R^d overlap by q / d on average.

    Book: part III, "What heads learn".
    """
    cosines = principal_angles(A, B)
    return float(np.mean(cosines ** 2))


def head_blocks(W, n_heads: int) -> list[np.ndarray]:
    """Split W (d, n_heads * head_dim) into the heads' column blocks, a list of n_heads (d, head_dim) arrays.

    With the book's convention Y = X W, head j's queries are X W_q[:, j*head_dim:(j+1)*head_dim]: the block's
    column space is the subspace of the residual stream the head reads. For the output projection pass W_o.T:
    head j writes into the span of the rows j*head_dim:(j+1)*head_dim of W_o.

    Book: part III, "What heads learn"; part I, "From one head to h heads".
    """
    w = _as_float64(W, "W")
    check_int("n_heads", n_heads)
    if w.ndim != 2 or w.shape[1] % n_heads != 0:
        raise ValueError(f"W must be a (d, n_heads * head_dim) matrix with n_heads={n_heads} dividing its columns, "
                         f"got shape {w.shape}")
    head_dim = w.shape[1] // n_heads
    blocks = w.reshape(w.shape[0], n_heads, head_dim)  # (d, n_heads, head_dim)
    return [blocks[:, j, :] for j in range(n_heads)]


def pairwise_subspace_overlap(W, n_heads: int, statistic: str = "mean_cos2") -> np.ndarray:
    """(n_heads, n_heads): overlap between the column spaces of every pair of head blocks of W (:func:`head_blocks`).

    ``statistic``: "mean_cos2" (:func:`subspace_overlap`, the mean squared cosine of the principal angles) or
    "max_cos" (the cosine of the smallest principal angle: 0 only if the two subspaces are exactly orthogonal).
    The diagonal is 1.

    Book: part III, "What heads learn".
    """
    if statistic not in ("mean_cos2", "max_cos"):
        raise ValueError(f"statistic must be 'mean_cos2' or 'max_cos', got {statistic!r}")
    blocks = head_blocks(W, n_heads)
    out = np.ones((n_heads, n_heads))
    for a in range(n_heads):
        for b in range(a + 1, n_heads):
            cosines = principal_angles(blocks[a], blocks[b])
            out[a, b] = out[b, a] = np.mean(cosines ** 2) if statistic == "mean_cos2" else cosines[0]
    return out
