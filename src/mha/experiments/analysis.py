"""What trained heads do: attention-pattern scores, redundancy between heads, importance and pruning.

Book: part III, "What heads learn".

Three groups of functions, one per question of the chapter:

* **Patterns.** From a layer's attention weights ``(N, h, L, L)`` (causal self-attention, rows summing to 1):
  :func:`offset_profile`, :func:`previous_token_score`, :func:`induction_score`, :func:`positional_score`,
  :func:`diffuse_score`, gathered by :func:`head_scores` and turned into a class per head by
  :func:`classify_heads` (thresholds in :data:`THRESHOLDS`). :func:`attention_maps` runs a model and returns
  every layer's weights as NumPy arrays; :func:`repeat_induction_scores` measures the induction score of a
  model's heads on repeated random sequences of several lengths.
* **Redundancy.** :func:`js_divergence` and :func:`pairwise_head_js` (how differently two heads distribute their
  attention over the same input); :func:`principal_angles`, :func:`subspace_overlap` and
  :func:`pairwise_subspace_overlap` (how much the subspaces that two heads read from, or write to, share).
* **Importance and pruning** (Michel, Levy and Neubig 2019): :func:`head_importance` (I_h = E_x |dL(x)/d xi_h|
  through the model's ``head_mask``, normalised per layer), :func:`single_head_ablation` (the measured effect of
  removing one head), :func:`pruning_masks` and :func:`prune_curve`
  (quality against the fraction of heads removed, by importance or at random), :func:`prunable_fraction`.


Pattern and redundancy functions take NumPy arrays or torch tensors and compute in float64 NumPy; importance and
pruning run the torch model.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch
from torch import nn

from mha._checks import check_bool, check_float, check_int, check_shape, check_type
from mha.experiments.model import TinyTransformer
from mha.experiments.tasks import RepeatedSequence
from mha.experiments.train import evaluate

__all__ = ["HEAD_CLASSES", "THRESHOLDS", "SELECTIVE_THRESHOLD", "attention_maps", "offset_profile",
           "previous_token_score", "induction_score", "repeat_induction_scores", "positional_score", "diffuse_score",
           "top_key_score", "head_scores", "classify_heads", "js_divergence", "pairwise_head_js", "off_diagonal", "principal_angles", "subspace_overlap", "head_blocks",
           "pairwise_subspace_overlap", "head_importance", "single_head_ablation", "pruning_masks", "PRUNE_ORDERS",
           "prune_curve", "prunable_fraction"]

HEAD_CLASSES = ("induction", "previous-token", "diffuse", "positional", "other")
"""The classes of :func:`classify_heads`, in the order they are tried (the first whose score passes wins)."""

THRESHOLDS = {
    "induction": 0.5,  # more than half of the weight, on average, on the token after the previous occurrence
    "previous_token": 0.5,  # more than half of the weight, on average, on position t - 1
    "diffuse": 0.75,  # rows' entropy at least 75% of the uniform distribution's (ln of the number of keys)
    "positional": 0.8,  # rows differ from the position's mean row by at most 20% total variation
}
"""Default thresholds of :func:`classify_heads` (score >= threshold passes)."""

SELECTIVE_THRESHOLD = 0.5
"""The "selective" class's cutoff on the top-3 score (:func:`top_key_score`, k = 3) that :func:`mha.experiments.
studies.run_heads` records beside the committed classes: the three largest weights of a row hold, on average, at
least half of what they could hold beyond a uniform row's share. Chosen before any run recorded the score."""


# ------------------------------------------------------------------------------------------------ validation
def _as_float64(array, name: str) -> np.ndarray:
    if isinstance(array, torch.Tensor):
        array = array.detach().to("cpu", torch.float64).numpy()
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{name} must be a NumPy array or a torch tensor, got {type(array).__name__}")
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        raise TypeError(f"{name} must hold real numbers, got dtype {array.dtype}")
    return array.astype(np.float64, copy=False)


def _check_distributions(p: np.ndarray, name: str, atol: float = 1e-3) -> None:
    """Entries finite and >= 0, every row (last axis) summing to 1 within ``atol``."""
    if not np.all(np.isfinite(p)):
        raise ValueError(f"{name} holds non-finite values (NaN or inf); expected probabilities")
    if np.any(p < 0):
        raise ValueError(f"{name} holds negative values (min {p.min():.3g}); expected probabilities >= 0")
    sums = p.sum(axis=-1)
    worst = np.abs(sums - 1).max(initial=0.0)
    if worst > atol:
        raise ValueError(f"{name}'s rows (last axis) must sum to 1 (attention weights); a row sums to "
                         f"{sums.flat[np.abs(sums - 1).argmax()]:.6g}")


def _check_weights(weights, name: str = "weights", min_len: int = 2) -> np.ndarray:
    """A layer's causal self-attention weights as float64 (N, h, L, L), checked."""
    w = _as_float64(weights, name)
    if w.ndim != 4 or w.shape[-1] != w.shape[-2]:
        raise ValueError(f"{name} must be one layer's self-attention weights of shape (N, h, L, L), got shape "
                         f"{w.shape}")
    if w.shape[0] == 0 or w.shape[1] == 0:
        raise ValueError(f"{name} must have at least one sequence and one head, got shape {w.shape}")
    if w.shape[-1] < min_len:
        raise ValueError(f"{name} must have L >= {min_len} positions, got shape {w.shape}")
    _check_distributions(w, name)
    if np.any(np.triu(np.ones(w.shape[-2:], dtype=bool), k=1) & (w > 1e-6)):
        raise ValueError(f"{name} puts weight above the diagonal (on future keys); expected causal weights")
    return w


# ------------------------------------------------------------------------------------------------ patterns
@torch.no_grad()
def attention_maps(model: TinyTransformer, idx: torch.Tensor, head_mask: torch.Tensor | None = None
                   ) -> list[np.ndarray]:
    """Every layer's attention weights on ``idx`` (N, L), in eval mode: a list of n_layers float64 (N, h, L, L).

    Book: part III, "What heads learn".
    """
    if not isinstance(model, TinyTransformer):
        raise TypeError(f"model must be a mha.model.TinyTransformer, got {type(model).__name__}")
    was_training = model.training
    model.eval()
    try:
        _, _, weights = model(idx, need_weights=True, head_mask=head_mask)  # n_layers x (N, h, L, L)
    finally:
        model.train(was_training)
    return [w.to("cpu", torch.float64).numpy() for w in weights]


def offset_profile(weights) -> np.ndarray:
    """(h, L): entry [j, k] is head j's mean weight from query t to key t - k (k = 0 is the query itself).

    The mean runs over the N sequences and over the queries t >= k that have a key k positions back.
    Book: part III, "What heads learn".
    """
    w = _check_weights(weights, min_len=1)
    length = w.shape[-1]
    profile = np.empty((w.shape[1], length))
    for k in range(length):
        diagonal = np.diagonal(w, offset=-k, axis1=-2, axis2=-1)  # (N, h, L - k): w[..., t, t - k]
        profile[:, k] = diagonal.mean(axis=(0, 2))
    return profile


def previous_token_score(weights) -> np.ndarray:
    """(h,): each head's mean weight on the previous position, t - 1 (queries t >= 1). A pure previous-token head
    scores 1, a uniform causal head sum_{t>=1} 1/(t+1) / (L-1).

    Book: part III, "What heads learn".
    """
    return offset_profile(_check_weights(weights))[:, 1]


def induction_score(weights, period: int) -> np.ndarray:
    """(h,): mean weight from query t to key t - period + 1, over the queries of the repeat (t >= period).

    ``weights`` must come from sequences that repeat with ``period`` (x[t] = x[t - period] for t >= period, as
    :class:`mha.tasks.RepeatedSequence` with seq_len = period). Key t - period + 1 holds the token that followed
    the previous occurrence of the current token x[t]: an induction head (Olsson et al. 2022) attends there to
    copy it. A perfect induction head scores 1.

    Book: part III, "What heads learn"; "Induction heads".
    """
    w = _check_weights(weights)
    length = w.shape[-1]
    check_int("period (the repeat must start inside the sequence)", period, minimum=2, maximum=length - 1)
    # Query t attends to key t - (period - 1): the diagonal at offset period - 1, from query `period` on.
    diagonal = np.diagonal(w, offset=-(period - 1), axis1=-2, axis2=-1)  # (N, h, L - period + 1), t = period-1..
    return diagonal[:, :, 1:].mean(axis=(0, 2))  # queries t = period .. L - 1


def repeat_induction_scores(model: TinyTransformer, periods, batch_size: int = 32, seed: int = 0) -> np.ndarray:
    """(n_periods, n_layers, n_heads): :func:`induction_score` of every head on random sequences repeated once.

    For each period T, ``batch_size`` sequences from :class:`mha.tasks.RepeatedSequence` (seq_len=T, the model's
    vocabulary, length 2T - 1 <= block_size). Averaging over several periods separates an induction head, which
    finds the previous occurrence by content whatever T is, from a head that attends at the fixed offset T - 1
    (it scores high at one period only).

    Book: part III, "What heads learn".
    """
    if not isinstance(model, TinyTransformer):
        raise TypeError(f"model must be a mha.model.TinyTransformer, got {type(model).__name__}")
    periods = list(periods)
    block_size = model.config.block_size
    if not periods:
        raise ValueError("periods must hold at least one repeat length")
    for i, period in enumerate(periods):  # two copies of 2T - 1 tokens must fit in block_size
        check_int(f"periods[{i}] (with block_size={block_size})", period, minimum=2, maximum=(block_size + 1) // 2)
    device = model.lm_head.weight.device
    scores = []
    for period in periods:
        task = RepeatedSequence(vocab_size=model.config.vocab_size, seq_len=period, seed=seed)
        x, _ = task.get_batch("val", batch_size, device)  # (N, 2T - 1)
        scores.append([induction_score(w, period) for w in attention_maps(model, x)])
    return np.array(scores)  # (n_periods, n_layers, n_heads)


def positional_score(weights) -> np.ndarray:
    """(h,): how much each head's pattern depends on position only: 1 - mean_{n,t} TV(w[n, t], mean_n w[n, t]).

    TV is the total variation distance, half the L1 distance between two rows. A head whose rows are the same on
    every sequence (attends by position: a fixed offset, the first token, uniform) scores 1; a head that looks
    for content scores lower. Needs N >= 2 sequences. Queries t >= 1 (row 0 has a single key).

    Book: part III, "What heads learn".
    """
    w = _check_weights(weights)
    if w.shape[0] < 2:
        raise ValueError(f"positional_score needs N >= 2 sequences to compare, got weights of shape {w.shape}")
    mean_rows = w.mean(axis=0, keepdims=True)  # (1, h, L, L)
    tv = 0.5 * np.abs(w - mean_rows).sum(axis=-1)  # (N, h, L)
    return 1.0 - tv[:, :, 1:].mean(axis=(0, 2))


def diffuse_score(weights) -> np.ndarray:
    """(h,): mean normalised entropy of the rows, H(w[n, t]) / ln(t + 1), over queries t >= 1.

    Row t of a causal head has t + 1 keys, so ln(t + 1) is its largest entropy: a uniform head scores 1, a head
    putting all its weight on one key scores 0. Entropy uses 0 ln 0 = 0.

    Book: part III, "What heads learn".
    """
    w = _check_weights(weights)
    length = w.shape[-1]
    plogp = np.where(w > 0, w * np.log(np.where(w > 0, w, 1.0)), 0.0)  # (N, h, L, L)
    entropy = -plogp.sum(axis=-1)  # (N, h, L)
    max_entropy = np.log(np.arange(1, length + 1))  # (L,): ln(t + 1)
    return (entropy[:, :, 1:] / max_entropy[1:]).mean(axis=(0, 2))


def top_key_score(weights, k: int = 1) -> np.ndarray:
    """(h,): how much of each row's weight its ``k`` largest keys hold beyond what a uniform row gives them.

    For query t (t + 1 keys) with m the sum of its k largest weights, the row scores (m - k/(t+1)) / (1 - k/(t+1)):
    0 for a uniform row, 1 for a row whose weight sits on at most k keys. Mean over sequences and over the queries
    with more than k keys (t >= k). Unlike :func:`diffuse_score` it asks whether a few keys stand out, whichever
    keys they are: a head that picks the same few keys by content on every row scores high though its rows are
    far from one another across sequences (low :func:`positional_score`).

    Book: part III, "What heads learn".
    """
    w = _check_weights(weights)
    length = w.shape[-1]
    check_int(f"k (with L={length} positions)", k, minimum=1, maximum=length - 1)
    top = -np.sort(-w, axis=-1)[..., :k].sum(axis=-1)  # (N, h, L): the k largest weights of each row
    uniform = k / np.arange(1, length + 1)  # (L,): what a uniform row gives k keys, k / (t + 1)
    score = (top[:, :, k:] - uniform[k:]) / (1.0 - uniform[k:])  # queries t >= k
    return score.mean(axis=(0, 2))


def head_scores(weights, repeat_weights=None, period: int | None = None) -> dict[str, np.ndarray]:
    """The scores of one layer's heads: {"previous_token", "positional", "diffuse", "top1", "top3", "induction"},
    each (h,); "top1" and "top3" are :func:`top_key_score` with k = 1 and k = 3.

    ``weights`` (N, h, L, L) on the task's input give the first five; ``repeat_weights`` on sequences repeating
    with ``period`` give the induction score (they may be ``weights`` itself when the input repeats). Without
    ``repeat_weights`` the induction score is left out.

    Book: part III, "What heads learn".
    """
    scores = {"previous_token": previous_token_score(weights), "positional": positional_score(weights),
              "diffuse": diffuse_score(weights)}
    if np.shape(weights)[-1] > 3:  # top3 needs rows of more than three keys
        scores.update(top1=top_key_score(weights, 1), top3=top_key_score(weights, 3))
    if repeat_weights is not None:
        if period is None:
            raise ValueError("period must be given with repeat_weights (the repeat's length)")
        scores["induction"] = induction_score(repeat_weights, period)
    elif period is not None:
        raise ValueError("period was given without repeat_weights")
    return scores


def classify_heads(scores: dict[str, np.ndarray], thresholds: dict[str, float] | None = None,
                   selective: float | None = None) -> list[str]:
    """One class per head from :func:`head_scores`: the first of :data:`HEAD_CLASSES` whose score passes.

    Order and default thresholds (:data:`THRESHOLDS`, score >= threshold): "induction" (induction >= 0.5),
    "previous-token" (previous_token >= 0.5), "diffuse" (diffuse >= 0.75), "positional" (positional >= 0.8),
    else "other" (content-dependent or mixed). The order matters because the scores overlap: a previous-token
    head is also positional (it attends by position), a uniform head is also positional. A score missing from
    ``scores`` (induction without repeated input) never passes.

    With ``selective`` (a number in (0, 1]) a sixth class, "selective", is tested after "previous-token" and before
    "diffuse": a head whose three largest weights stand out (``scores["top3"]``, :func:`top_key_score` with k = 3,
    >= ``selective``) while its rows change with the input (positional score below its threshold), so a head that
    picks a few keys by content is no longer filed as diffuse or positional. Without it (the default) the classes
    are :data:`HEAD_CLASSES`, as the committed results were computed.

    Book: part III, "What heads learn".
    """
    thresholds = {**THRESHOLDS, **(thresholds or {})}
    if selective is not None:
        selective = check_float("selective", selective, minimum=0.0, maximum=1.0, min_inclusive=False)
        if "top3" not in scores or "positional" not in scores:
            raise ValueError(f"selective needs the scores 'top3' and 'positional' (head_scores on rows of more "
                             f"than three keys), got keys {sorted(scores)}")
    unknown = sorted(set(thresholds) - set(THRESHOLDS))
    if unknown:
        raise ValueError(f"thresholds has unknown keys {unknown}; expected keys among {sorted(THRESHOLDS)}")
    if not isinstance(scores, dict) or not scores:
        raise TypeError(f"scores must be the dict returned by head_scores, got {type(scores).__name__}")
    arrays = {key: np.asarray(value, dtype=np.float64) for key, value in scores.items()}
    sizes = {key: a.shape for key, a in arrays.items()}
    if len(set(sizes.values())) != 1 or next(iter(sizes.values())) == () or len(next(iter(sizes.values()))) != 1:
        raise ValueError(f"every score must be a 1-D array of one value per head, got shapes {sizes}")
    n_heads = next(iter(sizes.values()))[0]
    order = [("induction", "induction"), ("previous-token", "previous_token"), ("diffuse", "diffuse"),
             ("positional", "positional")]
    classes = []
    for j in range(n_heads):
        label = "other"
        for name, key in order:
            if (name == "diffuse" and selective is not None and arrays["top3"][j] >= selective
                    and arrays["positional"][j] < thresholds["positional"]):
                label = "selective"
                break
            if key in arrays and arrays[key][j] >= thresholds[key]:
                label = name
                break
        classes.append(label)
    return classes


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


# ------------------------------------------------------------------------------------------------ importance
def _check_model_and_batches(model, batches) -> list:
    if not isinstance(model, TinyTransformer):
        raise TypeError(f"model must be a mha.model.TinyTransformer, got {type(model).__name__}")
    if isinstance(batches, tuple) and len(batches) == 2 and isinstance(batches[0], torch.Tensor):
        batches = [batches]  # one (x, y) pair
    batches = list(batches)
    if not batches or not all(isinstance(b, (tuple, list)) and len(b) == 2 for b in batches):
        raise ValueError("batches must be a non-empty list of (x, y) pairs of (N, L) int64 tensors "
                         "(task.get_batch(...))")
    return batches


def _check_head_mask(model: TinyTransformer, head_mask) -> torch.Tensor:
    shape = (model.config.n_layers, model.config.n_heads)
    weight = model.lm_head.weight
    if head_mask is None:
        return torch.ones(shape, dtype=weight.dtype, device=weight.device)
    check_type("head_mask", head_mask, torch.Tensor, f"a tensor of shape (n_layers, n_heads) = {shape}")
    check_shape("head_mask", head_mask, shape, names="(n_layers, n_heads)")
    return head_mask.detach().to(device=weight.device, dtype=weight.dtype)


def head_importance(model: TinyTransformer, batches, head_mask: torch.Tensor | None = None,
                    normalize: bool = True, signed: bool = False) -> np.ndarray:
    """Head importance I_h = E_x |dL(x) / d xi_h| (Michel, Levy and Neubig 2019), (n_layers, n_heads).

    xi is the model's ``head_mask`` (ones, or the given mask of a partly pruned model), each head's output is
    multiplied by xi_h; x is one sequence of ``batches`` (a list of (x, y) batches) and L(x) its mean
    cross-entropy, so the absolute value is taken per sequence before averaging. With ``normalize`` each layer's
    row is divided by its L2 norm (as Michel et al.), which makes layers comparable for a global ranking. Heads
    already pruned (xi_h = 0) get importance 0 and are left out of their layer's norm. Runs in eval mode.

    With ``signed`` the derivative is averaged as it is, E_x[dL(x) / d xi_h], not its absolute value (then
    ``normalize`` must be False): minus it is the first-order estimate of how much the mean loss rises when the
    head is removed (xi_h: 1 -> 0), the quantity :func:`single_head_ablation` measures.

    Book: part III, "What heads learn".
    """
    batches = _check_model_and_batches(model, batches)
    mask = _check_head_mask(model, head_mask)
    check_bool("normalize", normalize)
    check_bool("signed", signed)
    if signed and normalize:
        raise ValueError("signed=True averages derivatives of both signs, which a per-layer L2 norm would not "
                         "rescale meaningfully: pass normalize=False with it")
    active = mask != 0  # (n_layers, n_heads)
    total = torch.zeros_like(mask)
    count = 0
    was_training = model.training
    model.eval()
    try:
        for x, y in batches:
            for n in range(x.shape[0]):
                xi = mask.clone().requires_grad_(True)  # (n_layers, n_heads)
                _, loss, _ = model(x[n:n + 1], y[n:n + 1], head_mask=xi)
                (grad,) = torch.autograd.grad(loss, xi)
                total += grad if signed else grad.abs()
                count += 1
    finally:
        model.train(was_training)
    importance = torch.where(active, total / count, 0.0).to("cpu", torch.float64).numpy()
    if normalize:
        norms = np.linalg.norm(importance, axis=1, keepdims=True)  # (n_layers, 1); pruned heads are 0
        importance = np.divide(importance, norms, out=np.zeros_like(importance), where=norms > 0)
    return importance


class _MaskedModel(nn.Module):
    """``model`` with a fixed head_mask, called as model(x, y): lets :func:`mha.train.evaluate` score it."""

    def __init__(self, model: TinyTransformer, head_mask: torch.Tensor):
        super().__init__()
        self.model = model
        self.head_mask = head_mask

    def forward(self, idx, targets=None):
        return self.model(idx, targets, head_mask=self.head_mask)


def single_head_ablation(model: TinyTransformer, eval_batches, has_accuracy: bool = True) -> dict[str, np.ndarray]:
    """The quality of the model with one head masked at a time: {"val_loss", "val_acc"}, each (n_layers, n_heads).

    Entry [i, j] evaluates (:func:`mha.train.evaluate`) the model whose head j of layer i has head_mask 0 and every
    other head 1 (Michel et al.'s ablation of a single head); val_acc is None unless ``has_accuracy``. The effect
    that :func:`head_importance` estimates to first order, measured.

    Book: part III, "What heads learn".
    """
    eval_batches = _check_model_and_batches(model, eval_batches)
    shape = (model.config.n_layers, model.config.n_heads)
    weight = model.lm_head.weight
    losses, accuracies = np.zeros(shape), np.zeros(shape)
    for layer in range(shape[0]):
        for head in range(shape[1]):
            mask = torch.ones(shape, dtype=weight.dtype, device=weight.device)
            mask[layer, head] = 0.0
            losses[layer, head], acc = evaluate(_MaskedModel(model, mask), eval_batches, has_accuracy)
            accuracies[layer, head] = np.nan if acc is None else acc
    return {"val_loss": losses, "val_acc": accuracies if has_accuracy else None}


def _fractions(fractions) -> list[float]:
    if fractions is None:
        return [k / 10 for k in range(11)]
    values = [float(f) for f in fractions]
    if not values or any(not 0 <= f <= 1 for f in values) or values != sorted(values):
        raise ValueError(f"fractions must be a non-empty increasing list of numbers in [0, 1], got {fractions!r}")
    return values


def _n_pruned(fraction: float, n_total: int) -> int:
    return int(math.floor(fraction * n_total + 0.5))  # round half up: 10% of 5 heads -> 1, of 4 heads -> 0


def pruning_masks(importance, fractions=None, order: str = "importance", seed: int = 0) -> list[np.ndarray]:
    """Head masks (n_layers, n_heads) of 0/1 for each fraction, pruning ``round(fraction * heads)`` heads.

    ``order="importance"``: the heads of lowest ``importance`` go first (ties: the lower layer, then the lower
    head index); ``"random"``: a random permutation drawn from ``np.random.default_rng(seed)``. The masks are
    nested (each fraction removes the previous fraction's heads and more). ``fractions`` default to 0, 0.1, ...,
    1. Importance fixed once; :func:`prune_curve` can re-estimate it after every step instead.

    Book: part III, "What heads learn".
    """
    imp = _as_float64(importance, "importance")
    if imp.ndim != 2 or imp.size == 0:
        raise ValueError(f"importance must be an (n_layers, n_heads) array, got shape {imp.shape}")
    if order not in ("importance", "random"):
        raise ValueError(f"order must be 'importance' or 'random', got {order!r}")
    fractions = _fractions(fractions)
    if order == "importance":
        ranking = np.argsort(imp.ravel(), kind="stable")  # flat indices, least important first
    else:
        ranking = np.random.default_rng(seed).permutation(imp.size)
    masks = []
    for f in fractions:
        mask = np.ones(imp.size)
        mask[ranking[:_n_pruned(f, imp.size)]] = 0.0
        masks.append(mask.reshape(imp.shape))
    return masks


PRUNE_ORDERS = ("importance", "raw_importance", "ablation", "random")
"""The orders of :func:`prune_curve`."""


def _ranking_scores(model: TinyTransformer, batches, mask: torch.Tensor, order: str) -> np.ndarray:
    """(n_layers, n_heads), lowest first pruned: the importance (normalised or raw), or the measured loss increase
    of removing each unpruned head as well (already pruned heads: +inf, never chosen again)."""
    if order != "ablation":
        return head_importance(model, batches, head_mask=mask, normalize=order == "importance")
    scores = np.full(tuple(mask.shape), np.inf)
    for i in (mask.view(-1) != 0).nonzero().flatten().tolist():
        trial = mask.clone()
        trial.view(-1)[i] = 0.0
        scores.flat[i], _ = evaluate(_MaskedModel(model, trial), batches, False)
    return scores


def prune_curve(model: TinyTransformer, eval_batches, importance_batches=None, fractions=None,
                order: str = "importance", seed: int = 0, recompute: bool = True,
                has_accuracy: bool = True) -> list[dict]:
    """Quality against the fraction of heads pruned: a list of {fraction, n_pruned, val_loss, val_acc, mask}.

    Heads are removed by setting their ``head_mask`` entry to 0 (no retraining), ``round(fraction * heads)`` of
    them for each of ``fractions`` (default 0, 0.1, ..., 1: 10% more at a time), and the model is evaluated on
    ``eval_batches`` with :func:`mha.train.evaluate` (val_acc None unless ``has_accuracy``). ``fraction`` in the
    result is the fraction actually pruned, n_pruned / heads.

    ``order="importance"``: :func:`head_importance` on ``importance_batches`` (held-out batches, better not the
    evaluation batches), normalised per layer; the least important unpruned heads go next. With ``recompute`` the
    importance is re-estimated on the pruned model before each step; without, it is ranked once (as
    :func:`pruning_masks`). ``order="raw_importance"``: the same without the per-layer normalisation.
    ``order="ablation"``: the measured effect instead of its estimate: the mean loss on ``importance_batches`` of
    the model with each unpruned head removed as well, lowest first (greedy, on the loss whatever the metric).
    ``order="random"``: a random order from ``seed``.

    Book: part III, "What heads learn".
    """
    eval_batches = _check_model_and_batches(model, eval_batches)
    if order not in PRUNE_ORDERS:
        raise ValueError(f"order must be one of {PRUNE_ORDERS}, got {order!r}")
    if order != "random":
        if importance_batches is None:
            raise ValueError(f"order={order!r} needs importance_batches (held-out (x, y) batches)")
        importance_batches = _check_model_and_batches(model, importance_batches)
    fractions = _fractions(fractions)
    shape = (model.config.n_layers, model.config.n_heads)
    n_total = shape[0] * shape[1]
    weight = model.lm_head.weight
    mask = torch.ones(shape, dtype=weight.dtype, device=weight.device)
    if order == "random":
        ranking = list(np.random.default_rng(seed).permutation(n_total))
    else:
        importance = None
    curve = []
    for f in fractions:
        target = _n_pruned(f, n_total)
        pruned = int((mask == 0).sum())
        if target > pruned:
            if order == "random":
                chosen = ranking[pruned:target]
            else:
                if importance is None or recompute:
                    importance = _ranking_scores(model, importance_batches, mask, order)
                candidates = [i for i in np.argsort(importance.ravel(), kind="stable")
                              if mask.view(-1)[i] != 0]  # flat indices of unpruned heads, least important first
                chosen = candidates[:target - pruned]
            flat = mask.view(-1)  # (n_layers * n_heads,), a view: writes go into mask
            for i in chosen:
                flat[int(i)] = 0.0
        val_loss, val_acc = evaluate(_MaskedModel(model, mask), eval_batches, has_accuracy)
        curve.append(dict(fraction=target / n_total, n_pruned=target, val_loss=val_loss, val_acc=val_acc,
                          mask=mask.to("cpu").numpy().astype(int).tolist()))
    return curve


def prunable_fraction(curve: list[dict], tolerance: float = 0.01, metric: str = "val_acc") -> float:
    """The largest fraction pruned, from the start of ``curve`` (:func:`prune_curve`), before quality drops.

    With ``metric="val_acc"``: every point up to it has accuracy >= (unpruned accuracy - ``tolerance``) (an
    absolute drop: 0.01 = one percentage point). With ``metric="val_loss"``: loss <= unpruned loss * (1 +
    ``tolerance``). The first point of ``curve`` must be the unpruned model (fraction 0).

    Book: part III, "What heads learn".
    """
    if metric not in ("val_acc", "val_loss"):
        raise ValueError(f"metric must be 'val_acc' or 'val_loss', got {metric!r}")
    if not curve or curve[0]["n_pruned"] != 0:
        raise ValueError("curve must start with the unpruned model (fraction 0)")
    if curve[0][metric] is None:
        raise ValueError(f"curve has no {metric} (a task without accuracy: use metric='val_loss')")
    tolerance = check_float("tolerance", tolerance, minimum=0.0)
    base = curve[0][metric]
    best = 0.0
    for point in curve:
        ok = (point[metric] >= base - tolerance) if metric == "val_acc" else (point[metric] <= base * (1 + tolerance))
        if not ok:
            break
        best = point["fraction"]
    return best
