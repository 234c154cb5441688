"""Measurements taken while a model trains: score statistics, attention entropy, the loss on each half of a repeated
sequence, induction and previous-token scores, head ablations and loss spikes; after training, the attention each head
gives the first token and its sink logit.

Book: part III, "Induction heads" (the loss on the first copy and on the repeat, induction scores over training,
head ablations) and "The scaling ablation" (per-step gradient norms, loss spikes, pre-softmax score statistics
against part I's variance prediction, attention entropy); part IV, "Windows and sinks, measured"
(:func:`first_token_attention`).

:class:`DynamicsProbe` is a :class:`~mha.experiments.train.Hook`: it records every step's loss and gradient norm
(and, per layer, the gradient norms of the query and key projections, before clipping) and probes the model at step
0 and at every evaluation. :func:`head_ablations` removes heads by zero and by mean ablation.
"""

from __future__ import annotations

import math
import statistics
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from mha._checks import check_int, check_type
from mha.attention import MultiHeadAttention, causal_mask
from mha.experiments.analysis import induction_score, previous_token_score
from mha.experiments.model import TinyTransformer
from mha.experiments.tasks import RepeatedSequence
from mha.experiments.train import Hook

__all__ = ["split_losses", "attention_probe", "ScoreStepProbe", "head_outputs", "head_means", "head_ablations",
           "count_spikes", "DynamicsProbe", "first_token_attention", "PLACEBO_ANCHORS"]


@torch.no_grad()
def split_losses(model: TinyTransformer, batches) -> dict:
    """Mean loss and accuracy on the first copy and on the repeat of ``(x, y, repeat_mask)`` batches.

    Returns loss_first, acc_first, loss_repeat, acc_repeat (means over positions, pooled across batches).
    """
    sums = {"first": [0.0, 0.0, 0], "repeat": [0.0, 0.0, 0]}  # loss sum, correct count, positions
    was_training = model.training
    model.eval()
    for x, y, rep in batches:
        logits, _, _ = model(x)  # (N, L, V)
        losses = F.cross_entropy(logits.transpose(1, 2), y, reduction="none")  # (N, L)
        correct = logits.argmax(dim=-1) == y  # (N, L)
        for part, mask in (("first", ~rep), ("repeat", rep)):
            sums[part][0] += losses[mask].sum().item()
            sums[part][1] += correct[mask].sum().item()
            sums[part][2] += int(mask.sum())
    model.train(was_training)
    return {f"{stat}_{part}": s[i] / s[2] for part, s in sums.items() for i, stat in ((0, "loss"), (1, "acc"))}


class LayerScores(NamedTuple):
    """One layer's scores as :func:`_layer_scores` recomputes them."""

    q: torch.Tensor  # (N, h, L, head_dim), the queries
    k: torch.Tensor  # (N, h, L, head_dim), the keys (a key-value group's keys repeated for each of its heads)
    scores: torch.Tensor  # (N, h, L, L), the pre-softmax scores scale * q . k
    weights: torch.Tensor  # (N, h, L, L), the model's own attention weights
    inputs: torch.Tensor  # (N, L, d_model), the layer's attention input ln_1(x)
    causal: torch.Tensor  # (L, L), True where a query may attend to a key


def _projected_scores(attn: MultiHeadAttention, x_in: torch.Tensor, q_weight, q_bias, k_weight, k_bias):
    """(q, k, scores) of ``attn`` for the attention input ``x_in`` (N, L, d_model) with the given query and key
    projections (so that a probe can pair one step's weights with another step's inputs)."""
    n, length, _ = x_in.shape
    q = F.linear(x_in, q_weight, q_bias).view(n, length, attn.n_heads, attn.head_dim).transpose(1, 2)  # (N,h,L,hd)
    k = F.linear(x_in, k_weight, k_bias).view(n, length, attn.n_kv_heads, attn.head_dim).transpose(1, 2)  # (N,g,L,hd)
    k = k.repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=1)  # (N, h, L, hd)
    return q, k, attn.scale * q @ k.transpose(-2, -1)  # scores: (N, h, L, L)


def _projections(attn: MultiHeadAttention) -> tuple:
    """The query and key projections' weights and biases (None without bias), as :func:`_projected_scores` takes
    them."""
    return attn.q_proj.weight, attn.q_proj.bias, attn.k_proj.weight, attn.k_proj.bias


def _layer_scores(model: TinyTransformer, x: torch.Tensor) -> list[LayerScores]:
    """Per layer, the queries, keys and pre-softmax scores recomputed from the layer's input, beside the model's
    attention weights, with the scores checked to give those weights (a probe measures what the model computes). No
    gradients; the caller sets eval mode."""
    inputs = []  # each layer's attention input ln_1(x), captured by a pre-hook
    handles = [block.attn.register_forward_pre_hook(lambda module, args: inputs.append(args[0]))
               for block in model.blocks]
    try:
        _, _, weights = model(x, need_weights=True)  # n_layers x (N, h, L, L)
    finally:
        for handle in handles:
            handle.remove()
    causal = causal_mask(x.shape[1], x.shape[1], device=x.device)  # (L, L), True = may attend
    found = []
    for block, x_in, w in zip(model.blocks, inputs, weights):
        q, k, scores = _projected_scores(block.attn, x_in, *_projections(block.attn))
        recomputed = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)  # (N, h, L, L)
        torch.testing.assert_close(recomputed, w, rtol=1e-3, atol=1e-4)
        found.append(LayerScores(q, k, scores, w, x_in, causal))
    return found


@torch.no_grad()
def attention_probe(model: TinyTransformer, x: torch.Tensor, probe_x: torch.Tensor | None = None,
                    period: int | None = None) -> list[dict]:
    """Per layer: statistics of the pre-softmax scores, the attention entropy and, with ``probe_x`` (a batch of
    sequences repeating with ``period``), each head's induction and previous-token scores.

    Scores s = scale * q . k over the causal entries: their standard deviation and largest magnitude, and the
    variance part I predicts from the measured component variances, scale^2 * head_dim * Var(q_i) * Var(k_i)
    (book: part I, "Why divide by sqrt(d_k)"). Entropy: the mean over rows t >= 1 of H(row) / ln(t + 1) (1 is
    uniform, 0 one-hot). The scores are recomputed from the layer's input and must reproduce the model's weights.

    Per head (lists of h values), what a score is made of, s_tj = scale * |q_t| |k_j| cos(q_t, k_j):
    ``q_norm`` and ``k_norm``, the mean length of the queries and of the keys; ``cos_attended``, the attention-
    weighted cosine sum_j a_tj cos(q_t, k_j) (how well a query points at the keys it attends to), and ``cos_mean``,
    the unweighted mean cosine over the keys it may attend to (the same queries and keys, no selection), each
    averaged over rows t >= 1; and ``score_attended``, the attention-weighted score sum_j a_tj s_tj over the same rows.
    """
    was_training = model.training
    model.eval()
    length = x.shape[1]
    layers = []
    for block, (q, k, scores, w, _, causal) in zip(model.blocks, _layer_scores(model, x)):
        attn = block.attn
        allowed = scores[:, :, causal]  # (N, h, L (L + 1) / 2)
        q_var, k_var = q.var().item(), k.var().item()
        plogp = torch.where(w > 0, w * torch.log(w.clamp_min(1e-30)), 0.0)  # (N, h, L, L)
        entropy = -plogp.sum(dim=-1)[:, :, 1:] / torch.log(torch.arange(2, length + 1, device=x.device))  # (N,h,L-1)
        cos = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)  # (N, h, L, L)
        n_allowed = causal.sum(dim=-1)[1:]  # (L - 1,): keys a query t >= 1 may attend to
        cos_mean = cos.masked_fill(~causal, 0.0).sum(dim=-1)[:, :, 1:] / n_allowed  # (N, h, L - 1)
        layers.append(dict(score_std=allowed.std().item(), score_absmax=allowed.abs().max().item(),
                           score_var_pred=attn.scale ** 2 * attn.head_dim * q_var * k_var, q_var=q_var,
                           k_var=k_var, entropy=entropy.mean().item(),
                           max_weight=w[:, :, 1:, :].max(dim=-1).values.mean().item(),
                           q_norm=q.norm(dim=-1).mean(dim=(0, 2)).tolist(),  # (h,)
                           k_norm=k.norm(dim=-1).mean(dim=(0, 2)).tolist(),  # (h,)
                           cos_attended=(w * cos).sum(dim=-1)[:, :, 1:].mean(dim=(0, 2)).tolist(),  # (h,)
                           cos_mean=cos_mean.mean(dim=(0, 2)).tolist(),  # (h,)
                           score_attended=(w * scores.masked_fill(~causal, 0.0)).sum(dim=-1)[:, :, 1:]
                           .mean(dim=(0, 2)).tolist()))  # (h,)
    if probe_x is not None:
        _, _, probe_weights = model(probe_x, need_weights=True)
        for layer, w in zip(layers, probe_weights):
            layer["induction"] = induction_score(w, period).tolist()  # (h,)
            layer["previous_token"] = previous_token_score(w).tolist()  # (h,)
    model.train(was_training)
    return layers


class ScoreStepProbe(Hook):
    """How far one optimizer step moves the pre-softmax scores, at chosen steps, on a fixed batch, and how much of
    that comes from the layer's own query and key projections and how much from its input.

    For each k in ``steps`` (k = 1 is the first update), the scores of every layer after update k minus those after
    update k - 1 (at initialisation for k = 1), on the batch ``x``, over the causal entries: ``records[k]`` holds per
    layer ``change_rms`` (the root mean square of that difference over heads and entries), ``head_change_rms`` (the
    same per head, (h,)) and ``spread`` (the root mean square of the scores themselves before the step). The change
    splits by what moved: ``own_change_rms`` is that of the scores with the new query and key projections applied to
    the old input (the layer's attention input ln_1(x) before the step) minus the old scores, ``input_change_rms``
    that of the old projections applied to the new input minus the old scores (an earlier layer, the embeddings or
    the layer norm moved), each per head too (``head_own_change_rms``, ``head_input_change_rms``); the rest of the
    change, ``rest_change_rms`` (total - own - input), is second order in the step: S(W', x') - S(W', x) - S(W, x') +
    S(W, x), a product of the two changes. Layers are listed from the first. With ``stop_after``, training stops after
    that update. Book: part III, "Head count" (the premise of the Adam/scale heuristic: a wider head's scores move
    further per step at fixed width, through its own projections).
    """

    def __init__(self, x: torch.Tensor, steps, stop_after: int | None = None):
        check_type("x", x, torch.Tensor, "a (N, L) batch of token ids")
        self.steps = sorted({check_int(f"steps[{i}]", k, minimum=1) for i, k in enumerate(steps)})
        if not self.steps:
            raise ValueError("steps must hold at least one step (1 is the first update)")
        self.stop_after = None if stop_after is None else check_int("stop_after", stop_after, minimum=1)
        self.x, self.model, self._before, self.records = x, None, None, {}

    def _state(self) -> list[dict]:
        """Per layer: the scores over the causal entries (N, h, E) in float64, the attention input and copies of the
        query and key projections."""
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad():
            found = [dict(scores=layer.scores[:, :, layer.causal].double(), inputs=layer.inputs, causal=layer.causal,
                          projections=tuple(None if p is None else p.detach().clone()
                                            for p in _projections(block.attn)))
                     for block, layer in zip(self.model.blocks,
                                             _layer_scores(self.model, self.x.to(self.model.lm_head.weight.device)))]
        self.model.train(was_training)
        return found

    def on_start(self, model: TinyTransformer, eval_set: list, device: torch.device) -> None:
        self.model = model
        self._before = self._state() if 1 in self.steps else None

    def on_step(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> bool:
        k = step + 1  # the update just made
        after = self._state() if (k in self.steps or k + 1 in self.steps) else None
        if k in self.steps:
            self.records[k] = [self._record(block.attn, a, b) for block, a, b in zip(self.model.blocks, after,
                                                                                     self._before)]
        self._before = after if k + 1 in self.steps else None
        return self.stop_after is not None and k >= self.stop_after

    @staticmethod
    def _record(attn: MultiHeadAttention, after: dict, before: dict) -> dict:
        def mixed(inputs, projections):  # (N, h, E): the scores of these inputs under these projections
            with torch.no_grad():
                return _projected_scores(attn, inputs, *projections)[2][:, :, before["causal"]].double()

        old = before["scores"]
        total = after["scores"] - old  # (N, h, E)
        own = mixed(before["inputs"], after["projections"]) - old  # new projections, old input
        moved_input = mixed(after["inputs"], before["projections"]) - old  # old projections, new input
        return dict(change_rms=float(total.pow(2).mean().sqrt()),
                    head_change_rms=total.pow(2).mean(dim=(0, 2)).sqrt().tolist(),
                    spread=float(old.pow(2).mean().sqrt()),
                    own_change_rms=float(own.pow(2).mean().sqrt()),
                    head_own_change_rms=own.pow(2).mean(dim=(0, 2)).sqrt().tolist(),
                    input_change_rms=float(moved_input.pow(2).mean().sqrt()),
                    head_input_change_rms=moved_input.pow(2).mean(dim=(0, 2)).sqrt().tolist(),
                    rest_change_rms=float((total - own - moved_input).pow(2).mean().sqrt()))


def _attention_modules(model: TinyTransformer, what: str) -> list[MultiHeadAttention]:
    """Every block's :class:`MultiHeadAttention`; a clear error for attention that has no separate query and key
    projections and per-head outputs read by one o_proj (latent attention, kv_rank)."""
    modules = [block.attn for block in model.blocks]
    for i, attn in enumerate(modules):
        if not isinstance(attn, MultiHeadAttention):
            raise ValueError(f"{what} needs MultiHeadAttention (separate q_proj and k_proj, heads merged before "
                             f"o_proj) in every layer; layer {i} has {type(attn).__name__} (latent attention, kv_rank, "
                             f"builds its keys from a shared latent: no key projection per head to measure or ablate)")
    return modules


@torch.no_grad()
def head_outputs(model: TinyTransformer, x: torch.Tensor) -> list[torch.Tensor]:
    """Per layer, (N, L, h, head_dim): each head's output as the layer's output projection reads it (after the
    attention, the output gate and ``head_mask``; before o_proj), from a forward pass in eval mode."""
    modules = _attention_modules(model, "head_outputs")
    captured = []
    handles = [attn.o_proj.register_forward_pre_hook(
        lambda module, args, attn=attn: captured.append(
            args[0].detach().unflatten(-1, (attn.n_heads, attn.head_dim))))  # (N, L, h, head_dim)
        for attn in modules]
    was_training = model.training
    model.eval()
    try:
        model(x)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return captured


def head_means(model: TinyTransformer, x: torch.Tensor) -> list[torch.Tensor]:
    """Per layer, (L, h, head_dim): each head's mean output (:func:`head_outputs`) at each position, over the
    sequences of ``x``, in the model's dtype (accumulated in float64, so a head whose output is constant has that
    constant as its mean, exactly). One mean per position, not one pooled over positions: on a repeat task a
    pooled mean would carry the head's first-copy behaviour into the repeat positions."""
    return [out.double().mean(dim=0).to(out.dtype) for out in head_outputs(model, x)]  # (L, h, head_dim) each


@torch.no_grad()
def _mean_ablated_forward(model: TinyTransformer, x: torch.Tensor, heads, means: list[torch.Tensor]):
    """``model(x, need_weights=True)`` with the output of each (layer, head) of ``heads`` replaced, at each position,
    by that head's mean output there, ``means[layer][:, head]`` ((L, h, head_dim) per layer, L the length of ``x``),
    through forward pre-hooks on o_proj."""
    by_layer = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)

    def replace(layer, selected):
        def hook(module, args):
            out = args[0].unflatten(-1, means[layer].shape[-2:]).clone()  # (N, L, h, head_dim)
            out[:, :, selected] = means[layer][:, selected].to(out.dtype)  # (L, k, head_dim), in every sequence
            return (out.flatten(-2),)  # (N, L, h * head_dim)
        return hook

    handles = [model.blocks[layer].attn.o_proj.register_forward_pre_hook(replace(layer, selected))
               for layer, selected in by_layer.items()]
    try:
        return model(x, need_weights=True)
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def head_ablations(model: TinyTransformer, probe_x: torch.Tensor, probe_y: torch.Tensor, period: int,
                   head_sets: dict | None = None, mean: bool = True) -> list[dict]:
    """The loss on the first copy and on the repeat of fixed-period probe sequences with heads ablated.

    Zero ablation (``"ablation": "zero"``, through the model's ``head_mask``: the head's output multiplied by 0):
    each head in turn, then every head of a layer, in that order after a first entry ("none") that removes
    nothing; then each set of ``head_sets`` (name -> list of (layer, head), e.g. the heads identified as induction
    heads), skipping empty sets.

    Mean ablation (``"ablation": "mean"``, with ``mean``): the same single heads, layers and sets, each head's
    output replaced by its mean output (:func:`head_means`): at each position, the head's output averaged over the
    sequences of ``probe_x``, measured in the intact model (so a mean-ablated set uses every member's unablated
    mean). The ablated head then carries no information about the particular sequence and still adds its average
    at that position to the residual stream, which zero ablation also removes (a shift the later layers never saw
    in training, which is why zeroing a whole layer can push the loss above uniform guessing). The mean is taken
    per position, not pooled over positions, because on a repeat task a pooled mean would carry the head's
    first-copy behaviour into the repeat positions (as in Wang et al. 2022, the mean over a reference
    distribution of inputs of the same form). Mean entries are named ``"mean:<name>"`` (e.g. "mean:L1H2"), so that
    the zero entries keep their names, unique across the list.

    Each entry: ``ablated`` (its name), ``ablation`` ("zero" or "mean"; the "none" entry is "zero" of no head),
    ``heads`` ([layer, head] pairs), ``loss_first``, ``loss_repeat``, the mean probability of the correct next token
    (``p_correct_first``, ``p_correct_repeat``), how many predictions rank it first out of how many
    (``correct_first`` of ``n_first``, ``correct_repeat`` of ``n_repeat``), and every layer's induction scores under
    that ablation. The probability and the counts show copying that a mean loss can hide: a model can copy at some
    repeat positions and be confidently wrong at others.
    """
    n_layers, n_heads = model.config.n_layers, model.config.n_heads
    device = probe_x.device
    on_repeat = torch.arange(probe_x.shape[1], device=device) >= period  # (L,): the repeat
    targets = [("none", [])]
    for layer in range(n_layers):
        targets += [(f"L{layer}H{head}", [(layer, head)]) for head in range(n_heads)]
        targets.append((f"L{layer}", [(layer, head) for head in range(n_heads)]))
    for name, heads in (head_sets or {}).items():
        heads = [(int(layer), int(head)) for layer, head in heads]
        if any(not (0 <= layer < n_layers and 0 <= head < n_heads) for layer, head in heads):
            raise ValueError(f"head_sets[{name!r}] = {heads} names a head outside {n_layers} layers x {n_heads} heads")
        if heads:
            targets.append((name, heads))
    was_training = model.training
    model.eval()

    def entry(name, ablation, heads, logits, weights):
        losses = F.cross_entropy(logits.transpose(1, 2), probe_y, reduction="none")  # (N, L)
        p_correct = logits.softmax(dim=-1).gather(-1, probe_y.unsqueeze(-1)).squeeze(-1)  # (N, L)
        correct = logits.argmax(dim=-1) == probe_y  # (N, L): the correct token ranked first
        return dict(ablated=name, ablation=ablation, heads=[list(pair) for pair in heads],
                    loss_first=losses[:, ~on_repeat].mean().item(), loss_repeat=losses[:, on_repeat].mean().item(),
                    p_correct_first=p_correct[:, ~on_repeat].mean().item(),
                    p_correct_repeat=p_correct[:, on_repeat].mean().item(),
                    correct_first=int(correct[:, ~on_repeat].sum()), n_first=int(correct[:, ~on_repeat].numel()),
                    correct_repeat=int(correct[:, on_repeat].sum()), n_repeat=int(correct[:, on_repeat].numel()),
                    induction=[induction_score(w, period).tolist() for w in weights])

    ablations = []
    try:
        for name, heads in targets:
            head_mask = torch.ones(n_layers, n_heads, device=device)
            for layer, head in heads:
                head_mask[layer, head] = 0.0
            logits, _, weights = model(probe_x, head_mask=head_mask, need_weights=True)  # (N, L, V)
            ablations.append(entry(name, "zero", heads, logits, weights))
        if mean:
            means = head_means(model, probe_x)  # per layer (L, h, head_dim), the intact model's
            for name, heads in targets[1:]:
                logits, _, weights = _mean_ablated_forward(model, probe_x, heads, means)
                ablations.append(entry(f"mean:{name}", "mean", heads, logits, weights))
    finally:
        model.train(was_training)
    return ablations


#: The placebo's anchors (book part IV, "Windows and sinks, measured"): generic positions put in position 0's role by
#: :func:`first_token_attention`. The sink sweep's pre-registered placebo is the mean over 8 and 16 (far enough from the
#: start to have a prefix of their own); 1, 2 and 4 are recorded beside them, to be described only.
PLACEBO_ANCHORS = (1, 2, 4, 8, 16)


@torch.no_grad()
def first_token_attention(model: TinyTransformer, batches, min_position: int | None = None,
                          anchors=None) -> dict:
    """Where each head's attention goes from queries far from the start of the text: per layer and head, the mean
    weight on position 0 (the first token's attention mass) and, in a model with sink logits, the mean sink
    probability ``p_sink = 1 - sum_j a_ij`` (book part IV, eq. ``sink-softmax``), both over every query at a position
    ``>= min_position`` of every sequence of ``batches``; and, beside it, a baseline matched for distance.

    The matched baseline answers "is the first token special, or only far away?": a query at position p sees the
    first token at distance p, and every later query q > p sees the token at position q - p >= 1 at that same
    distance. For each probed position p <= L - 2, ``first_token_matched`` averages the weight on position 0 and
    ``matched`` the mean weight on the tokens at distance p from the queries after p (the diagonal of the weights p
    below the main one, without its first entry); p = L - 1 has no such token and is left out of both.

    That pair is biased by row length: the later queries' rows have more keys, so larger softmax denominators, and a
    head that attends by distance alone gives position 0 more than its matched keys (uniform causal attention: about
    1.2 times, at L = 64 from position 32). The within-row comparison has no such bias: in one row, log a_pj -
    log a_pk = s_pj - s_pk whatever the denominator (and a sink logit cancels too). ``first_token_logodds``
    averages log a_p0 - log a_p1 (position 0 against its neighbour, at distances p and p - 1), ``matched_logodds``
    the same for the keys at distance p of the later queries, log a_q,q-p - log a_q,q-p+1, over the same p; a head
    whose scores depend on distance alone gives the two the same value, so their difference is what position 0
    gets beyond its distance.

    The difference can still come from the queries rather than from position 0: the position-0 side uses query p
    only, the matched side the later queries, which may score more sharply. The placebo puts a generic position j
    (an *anchor*) in position 0's role, over the same queries p: ``anchor_logodds`` averages log a_pj - log a_p,j+1
    (distances p - j and p - j - 1) and ``anchor_matched_logodds`` the same contrast at those distances from the
    later queries q > p, log a_q,q-p+j - log a_q,q-p+j+1. Anchor 0 would be ``first_token_logodds`` and
    ``matched_logodds`` again; a query-side confound shows in every anchor, a first-token effect in anchor 0 alone.

    ``batches``: token ids (N, L), or ``(x, y)`` pairs as a task's ``get_batch`` gives them (y is not read), all of
    one length L. ``min_position`` defaults to L // 2 (the second half of the context). ``anchors``: the placebo's
    positions, each in 1..min_position - 1; by default those of :data:`PLACEBO_ANCHORS` below ``min_position``.

    Returns a dict: ``first_token`` (n_layers, h) and ``sink`` (n_layers, h) or None (no sink logits), as nested
    lists; ``sink_logits`` (n_layers, h), the learned logits z, or None; ``uniform``, the first-token mass that
    uniform causal attention would give over the same queries (the mean of 1 / (p + 1)); ``first_token_matched`` and
    ``matched`` (n_layers, h), the distance-matched pair above; ``first_token_logodds`` and ``matched_logodds``
    (n_layers, h), the within-row comparison above, or None where a weight it needs is 0 (a key outside a window);
    ``anchors``, and ``anchor_logodds`` and ``anchor_matched_logodds`` (n_anchors, n_layers, h), the placebo above,
    or None where the log-odds are; ``min_position``; ``length`` (L); ``queries`` (how many query rows each
    ``first_token`` number averages).
    """
    check_type("model", model, TinyTransformer, "a TinyTransformer")
    xs = [batch[0] if isinstance(batch, (tuple, list)) else batch for batch in batches]
    if not xs or not all(isinstance(x, torch.Tensor) and x.ndim == 2 for x in xs):
        raise ValueError("batches must be a non-empty list of (N, L) token-id tensors or (x, y) pairs")
    length = xs[0].shape[1]
    if any(x.shape[1] != length for x in xs):
        raise ValueError(f"every batch must have the same length L, got {sorted({x.shape[1] for x in xs})}")
    min_position = length // 2 if min_position is None else check_int("min_position", min_position, minimum=1,
                                                                        maximum=length - 1)
    if anchors is None:
        anchors = tuple(j for j in PLACEBO_ANCHORS if j < min_position)
    else:
        if not isinstance(anchors, (tuple, list)):
            raise TypeError(f"anchors must be a tuple or list of positions, got {type(anchors).__name__}")
        anchors = tuple(check_int("anchors", j, minimum=1, maximum=min_position - 1) for j in anchors)
    n_layers, n_heads = model.config.n_layers, model.config.n_heads
    keys = (0, *anchors)  # position 0, then the anchors: the within-row log-odds of each, and their matched twins
    logodds_first = torch.zeros(len(keys), n_layers, n_heads, dtype=torch.float64)
    logodds_matched = torch.zeros(len(keys), n_layers, n_heads, dtype=torch.float64)
    first = torch.zeros(n_layers, n_heads, dtype=torch.float64)
    sink = torch.zeros(n_layers, n_heads, dtype=torch.float64)
    first_matched = torch.zeros(n_layers, n_heads, dtype=torch.float64)
    matched = torch.zeros(n_layers, n_heads, dtype=torch.float64)
    distances = range(min_position, length - 1)  # p = L - 1: no later query sees a token at that distance
    rows = 0
    was_training = model.training
    model.eval()
    try:
        for x in xs:
            _, _, weights = model(x, need_weights=True)  # n_layers x (N, h, L, L)
            for layer, w in enumerate(weights):
                wd = w.double()  # (N, h, L, L)
                far = wd[:, :, min_position:, :]  # (N, h, L - min_position, L)
                first[layer] += far[..., 0].sum(dim=(0, 2)).cpu()  # (h,)
                sink[layer] += (1.0 - far.sum(dim=-1)).sum(dim=(0, 2)).cpu()  # (h,): p_sink = 1 - row sum
                for p in distances:
                    diagonal = torch.diagonal(wd, offset=-p, dim1=-2, dim2=-1)  # (N, h, L - p): w[p+i, i]
                    first_matched[layer] += diagonal[..., 0].sum(dim=0).cpu()  # (h,): w[p, 0]
                    matched[layer] += diagonal[..., 1:].mean(dim=-1).sum(dim=0).cpu()  # (h,): mean of w[q, q-p]
                    # key j against key j + 1 from query p (j = 0: position 0 itself; j > 0: the placebo's anchors),
                    # beside the same contrast at distances p - j and p - j - 1 from the later queries q > p
                    for k, j in enumerate(keys):
                        at = diagonal if j == 0 else torch.diagonal(wd, offset=-(p - j), dim1=-2, dim2=-1)
                        near = torch.diagonal(wd, offset=-(p - j - 1), dim1=-2, dim2=-1)  # one key nearer
                        # entry j of `at` is w[p, j], entry j + 1 of `near` is w[p, j+1]; later ones: q > p
                        ratio = at[..., j:].log() - near[..., j + 1:].log()  # (N, h, L - p); -inf where a weight is 0
                        logodds_first[k, layer] += ratio[..., 0].sum(dim=0).cpu()  # (h,): q = p, key j
                        logodds_matched[k, layer] += ratio[..., 1:].mean(dim=-1).sum(dim=0).cpu()  # (h,): q > p
            rows += x.shape[0] * (length - min_position)
    finally:
        model.train(was_training)
    has_sinks = getattr(model.blocks[0].attn, "sinks", None) is not None  # (latent attention has none)
    logits = [block.attn.sinks.detach().double().cpu().tolist() for block in model.blocks] if has_sinks else None
    positions = torch.arange(min_position, length, dtype=torch.float64)
    rows_matched = sum(x.shape[0] for x in xs) * len(distances)  # one w[p, 0] per sequence and probed distance
    # a weight of 0 (a key outside a window, or underflow) makes a log-odds infinite: none then
    finite = [bool(torch.isfinite(logodds_first[k]).all() and torch.isfinite(logodds_matched[k]).all())
              for k in range(len(keys))]
    logodds_defined = bool(rows_matched) and finite[0]
    anchors_defined = logodds_defined and all(finite[1:])
    return dict(first_token=(first / rows).tolist(), sink=(sink / rows).tolist() if has_sinks else None,
                sink_logits=logits, uniform=float((1.0 / (positions + 1)).mean()),
                first_token_matched=(first_matched / rows_matched).tolist() if rows_matched else None,
                matched=(matched / rows_matched).tolist() if rows_matched else None,
                first_token_logodds=(logodds_first[0] / rows_matched).tolist() if logodds_defined else None,
                matched_logodds=(logodds_matched[0] / rows_matched).tolist() if logodds_defined else None,
                anchors=list(anchors),
                anchor_logodds=(logodds_first[1:] / rows_matched).tolist() if anchors_defined else None,
                anchor_matched_logodds=(logodds_matched[1:] / rows_matched).tolist() if anchors_defined else None,
                min_position=min_position, length=length, queries=rows)


def count_spikes(losses, start: int, window: int, sigmas: float) -> int:
    """Steps t >= max(start, window) whose loss exceeds the mean of the previous ``window`` losses by more than
    ``sigmas`` of their standard deviations (book: part III, "The scaling ablation")."""
    losses = np.asarray(losses, dtype=float)
    spikes = 0
    for t in range(max(start, window), len(losses)):
        previous = losses[t - window:t]
        if losses[t] > previous.mean() + sigmas * previous.std():
            spikes += 1
    return spikes


class DynamicsProbe(Hook):
    """Records every step's loss, gradient norm and, per layer, the gradient norms of the query and key projection
    weights, and probes the model at step 0 and at each evaluation.

    Each evaluation record gets: ``grad_norm_max`` and ``grad_norm_mean`` over the steps since the previous one,
    ``qk_grad_norms`` (per layer, ``{"q": mean, "k": mean}`` of the interval's W_Q and W_K gradient norms; None at
    step 0), ``layers`` (:func:`attention_probe` on the first held-out batch, with induction scores on ``probe_x``
    when given) and, on a repeat task, :func:`split_losses` on the held-out batches. ``train_loss`` becomes the mean
    of the interval's step losses taken one by one as Python floats (the dynamics runs' convention since they
    began). A step whose loss or gradient norm is not finite stops the run.

    The W_Q and W_K gradient norms (Frobenius norms of ``q_proj.weight.grad`` and ``k_proj.weight.grad``, biases
    left out) are taken before clipping: the trainer calls :meth:`on_step` after ``clip_grad_norm_`` has scaled the
    gradients in place, so the norms are read by hooks on the two parameters
    (``register_post_accumulate_grad_hook``), which run inside ``loss.backward()`` once the gradient is complete.
    They only read the gradient (one norm each, no copies, no random draws): training computes exactly what it did
    without them. ``q_grad_norms`` and ``k_grad_norms`` hold, for every step, one norm per layer. The model's
    attention must be :class:`~mha.attention.MultiHeadAttention` in every layer (latent attention has no key
    projection per head: :meth:`on_start` refuses it). :meth:`close` removes the hooks (the study calls it after
    training).
    """

    eval_at_start = True

    def __init__(self, repeat_mask=None, probe_x: torch.Tensor | None = None, period: int | None = None,
                 has_accuracy: bool = True):
        self.repeat_mask = repeat_mask  # x -> (N, L) bool "position on the repeat", for repeat tasks; else None
        self.probe_x, self.period = probe_x, period
        self.step_losses, self.grad_norms = [], []  # every step
        self.q_grad_norms, self.k_grad_norms = [], []  # every step: per layer, |dL/dW_Q|_F and |dL/dW_K|_F
        self._interval_losses, self._interval_norms, self._interval_qk = [], [], []
        self._pending = {}  # ("q" or "k", layer) -> this step's gradient norm (a 0-d tensor), set during backward
        self._handles, self._n_layers = [], 0
        self.finite = True
        self.model = self.eval_set = self.eval_split = None

    def on_start(self, model, eval_set, device) -> None:
        self.model, self.eval_set = model, eval_set
        if self.repeat_mask is not None:
            self.eval_split = [(x, y, self.repeat_mask(x)) for x, y in eval_set]
        self._watch_qk_gradients(model)

    def _watch_qk_gradients(self, model) -> None:
        self.close()
        for layer, attn in enumerate(_attention_modules(model, "DynamicsProbe (per-layer W_Q / W_K gradient norms)")):
            for kind, weight in (("q", attn.q_proj.weight), ("k", attn.k_proj.weight)):
                self._handles.append(weight.register_post_accumulate_grad_hook(self._norm_hook(kind, layer)))
        self._n_layers = len(model.blocks)

    def _norm_hook(self, kind: str, layer: int):
        def hook(param):  # inside backward, after param.grad is complete and before any clipping
            self._pending[kind, layer] = torch.linalg.vector_norm(param.grad.detach())
        return hook

    def close(self) -> None:
        """Remove the gradient hooks from the model."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def on_step(self, step, loss, grad_norm) -> bool:
        self.step_losses.append(loss.item())
        self.grad_norms.append(grad_norm.item())
        self._interval_losses.append(self.step_losses[-1])
        self._interval_norms.append(self.grad_norms[-1])
        if self._handles:
            keys = [(kind, layer) for kind in "qk" for layer in range(self._n_layers)]
            missing = [f"{kind}_proj of layer {layer}" for kind, layer in keys if (kind, layer) not in self._pending]
            if missing:
                raise RuntimeError(f"step {step}: no gradient reached {', '.join(missing)} before on_step")
            norms = torch.stack([self._pending[key] for key in keys]).tolist()  # one transfer: q per layer, k per layer
            self._pending = {}  # a step's norms are never read at the next one
            self.q_grad_norms.append(norms[:self._n_layers])
            self.k_grad_norms.append(norms[self._n_layers:])
            self._interval_qk.append((self.q_grad_norms[-1], self.k_grad_norms[-1]))
        if not (math.isfinite(self.step_losses[-1]) and math.isfinite(self.grad_norms[-1])):
            self.finite = False  # diverged: the trainer evaluates once more and stops
        return not self.finite

    def on_eval(self, record) -> None:
        norms, qk = self._interval_norms, self._interval_qk
        if self._interval_losses:
            record["train_loss"] = statistics.fmean(self._interval_losses)
        record.update(grad_norm_max=max(norms) if norms else None,
                      grad_norm_mean=statistics.fmean(norms) if norms else None,
                      qk_grad_norms=[{"q": statistics.fmean(q[layer] for q, _ in qk),
                                      "k": statistics.fmean(k[layer] for _, k in qk)}
                                     for layer in range(len(qk[0][0]))] if qk else None,
                      layers=attention_probe(self.model, self.eval_set[0][0], self.probe_x, self.period))
        if self.eval_split is not None:
            record.update(split_losses(self.model, self.eval_split))
        self._interval_losses, self._interval_norms, self._interval_qk = [], [], []


def fixed_period_probe(task: RepeatedSequence, seed: int, batch_size: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) of ``batch_size`` sequences repeating with the fixed period ``task.seq_len``, from their own seed (the
    induction scores' and the head ablations' input)."""
    probe_task = RepeatedSequence(vocab_size=task.vocab_size, seq_len=task.seq_len, score="all", seed=seed)
    return probe_task.get_batch("val", batch_size, device)
