"""Head importance and pruning (Michel, Levy and Neubig 2019): the importance of each head through the model's
``head_mask``, the measured effect of removing one head, and pruning curves in several orders.

Book: part III, "What heads learn" and "Head importance and pruning".
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from mha._checks import check_bool, check_float, check_shape, check_type
from mha.experiments.analysis.patterns import _as_float64
from mha.experiments.model import TinyTransformer
from mha.experiments.train import evaluate

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
