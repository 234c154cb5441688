"""Attention patterns: the scores of a layer's heads (previous-token, induction, positional, diffuse, top-k), the
classes they are sorted into, and the attention maps of a model. Also the input checks the redundancy functions share.

Book: part III, "What heads learn".
"""

from __future__ import annotations

import numpy as np
import torch

from mha._checks import check_float, check_int
from mha.experiments.model import TinyTransformer
from mha.experiments.tasks import RepeatedSequence

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
