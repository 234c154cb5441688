"""Tests for mha.analysis: every check compares with an independent computation (hand-built attention patterns,
explicit loops, closed forms, an eigenvalue formula for principal angles, finite differences of the loss)."""

import copy
import itertools
import math

import numpy as np
import pytest
import torch

from mha.experiments import analysis, stats
from mha.experiments.model import TinyTransformer, TransformerConfig
from mha.experiments.tasks import make_task
from mha.experiments.train import evaluate

torch.set_num_threads(1)


# ------------------------------------------------------------------------------------------------ helpers
def causal_softmax(scores):
    """Row-wise softmax of (..., L, L) scores over the keys j <= t (NumPy)."""
    length = scores.shape[-1]
    allowed = np.tril(np.ones((length, length), dtype=bool))
    z = np.where(allowed, scores, -np.inf)
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def pattern(length, key_of_query):
    """(L, L) one-hot rows: query t attends only to key_of_query(t) (which must be <= t)."""
    w = np.zeros((length, length))
    for t in range(length):
        w[t, key_of_query(t)] = 1.0
    return w


def uniform_causal(length):
    return np.tril(np.ones((length, length))) / np.arange(1, length + 1)[:, None]


def js_by_hand(p, q):
    """Jensen-Shannon divergence of two 1-D distributions, term by term with math.log."""
    total = 0.0
    for a, b in zip(p, q):
        m = (a + b) / 2
        if a > 0:
            total += 0.5 * a * math.log(a / m)
        if b > 0:
            total += 0.5 * b * math.log(b / m)
    return total


def make_model(seed=0, dtype=torch.float64, **overrides):
    kwargs = dict(vocab_size=11, block_size=9, n_layers=2, d_model=12, n_heads=3)
    kwargs.update(overrides)
    torch.manual_seed(seed)
    return TinyTransformer(TransformerConfig(**kwargs)).to(dtype).eval()


def random_batches(model, n_batches=2, n=3, length=9, seed=1):
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    return [(torch.randint(vocab, (n, length), generator=g), torch.randint(vocab, (n, length), generator=g))
            for _ in range(n_batches)]


# ------------------------------------------------------------------------------------------------ scores
def test_previous_token_head_scores_one():
    w = pattern(10, lambda t: max(t - 1, 0))[None, None]  # (1, 1, L, L)
    np.testing.assert_allclose(analysis.previous_token_score(w), [1.0])
    np.testing.assert_allclose(analysis.diffuse_score(w), [0.0], atol=1e-12)


def test_uniform_head_scores():
    length = 10
    w = np.stack([uniform_causal(length)] * 2)[:, None]  # (2, 1, L, L)
    expected_prev = np.mean([1 / (t + 1) for t in range(1, length)])  # row t gives 1/(t+1) to key t-1
    np.testing.assert_allclose(analysis.previous_token_score(w), [expected_prev])
    np.testing.assert_allclose(analysis.diffuse_score(w), [1.0])
    np.testing.assert_allclose(analysis.positional_score(w), [1.0])  # the same rows on both sequences


def test_offset_profile_matches_loops():
    rng = np.random.default_rng(0)
    w = causal_softmax(rng.normal(size=(3, 2, 7, 7)))
    profile = analysis.offset_profile(w)
    for head in range(2):
        for k in range(7):
            values = [w[n, head, t, t - k] for n in range(3) for t in range(k, 7)]
            assert profile[head, k] == pytest.approx(np.mean(values))


def test_induction_score_on_hand_built_heads():
    period, length = 5, 9  # x[t] = x[t - 5]: the induction target of query t >= 5 is key t - 4
    induction = pattern(length, lambda t: t - period + 1 if t >= period else 0)
    shifted = pattern(length, lambda t: t - period if t >= period else 0)  # the previous occurrence itself
    w = np.stack([induction, shifted])[None]  # (1, 2, L, L)
    np.testing.assert_allclose(analysis.induction_score(w, period), [1.0, 0.0])


def test_repeat_induction_scores_separate_content_from_offset():
    """A model's head scores per period; a head attending at a fixed offset passes at one period only (by hand)."""
    model = make_model(block_size=17)
    scores = analysis.repeat_induction_scores(model, [3, 5, 9], batch_size=4)
    assert scores.shape == (3, 2, 3)
    # The same number from the attention maps of the same sequences, taken by hand.
    task = make_task("induction", vocab_size=11, seq_len=5, seed=0)
    x, _ = task.get_batch("val", 4)
    with torch.no_grad():
        weights = model(x, need_weights=True)[2][1].numpy()  # layer 1, (4, 3, 9, 9)
    by_hand = [np.mean([weights[n, j, t, t - 4] for n in range(4) for t in range(5, 9)]) for j in range(3)]
    np.testing.assert_allclose(scores[1, 1], by_hand)


def test_positional_score_of_content_heads():
    """Sequence A attends to key 0, sequence B to key t: rows differ by TV 1 from each other, 0.5 from the mean."""
    length = 6
    a, b = pattern(length, lambda t: 0), pattern(length, lambda t: t)
    w = np.stack([a, b])[:, None]  # (2, 1, L, L)
    np.testing.assert_allclose(analysis.positional_score(w), [0.5])


def test_classify_hand_built_heads():
    period, length = 6, 11
    heads = [pattern(length, lambda t: t - period + 1 if t >= period else t),  # induction (and offset 5)
             pattern(length, lambda t: max(t - 1, 0)),  # previous token
             uniform_causal(length),  # diffuse
             pattern(length, lambda t: max(t - 2, 0))]  # a fixed offset of 2: positional
    w = np.stack([np.stack(heads)] * 3)  # (3, 4, L, L), the same on every sequence
    scores = analysis.head_scores(w, w, period)
    assert analysis.classify_heads(scores) == ["induction", "previous-token", "diffuse", "positional"]
    content = np.stack([pattern(length, lambda t: 0), pattern(length, lambda t: t)])  # (2, L, L)
    w2 = np.concatenate([w[:2], content[:, None]], axis=1)  # (2, 5, L, L): add a content head
    assert analysis.classify_heads(analysis.head_scores(w2))[-1] == "other"
    assert analysis.classify_heads(analysis.head_scores(w2))[0] == "positional"  # no induction score without repeats
    assert analysis.classify_heads(scores, {"induction": 1.1})[0] == "positional"


def test_top_key_score_against_loops():
    """(top-k mass - k/(t+1)) / (1 - k/(t+1)) row by row with Python's sorted, then averaged."""
    rng = np.random.default_rng(4)
    w = causal_softmax(rng.normal(size=(3, 2, 7, 7)) * 3)  # (N, h, L, L)
    for k in (1, 3):
        expected = np.zeros(2)
        for j in range(2):
            rows = [(sum(sorted(w[n, j, t, :t + 1], reverse=True)[:k]) - k / (t + 1)) / (1 - k / (t + 1))
                    for n in range(3) for t in range(k, 7)]
            expected[j] = np.mean(rows)
        np.testing.assert_allclose(analysis.top_key_score(w, k), expected, rtol=1e-12)
    one_hot = pattern(8, lambda t: t // 2)[None, None]
    np.testing.assert_allclose(analysis.top_key_score(one_hot, 1), [1.0])
    np.testing.assert_allclose(analysis.top_key_score(uniform_causal(8)[None, None], 3), [0.0], atol=1e-12)


def test_selective_class_takes_content_heads_before_diffuse():
    """A head that puts 60% of its weight on three keys chosen by content and spreads the rest: diffuse by default,
    selective with the option; a uniform head stays diffuse and a fixed-offset head positional."""
    rng = np.random.default_rng(0)
    length, n = 32, 6
    content = 0.4 * np.broadcast_to(uniform_causal(length), (n, length, length)).copy()  # a uniform background
    for seq in range(n):
        for t in range(length):
            keys = rng.choice(t + 1, size=min(3, t + 1), replace=False)  # and three keys picked by "content"
            content[seq, t, keys] += 0.6 / len(keys)
    fixed = np.broadcast_to(pattern(length, lambda t: max(t - 2, 0)), (n, length, length))
    uniform = np.broadcast_to(uniform_causal(length), (n, length, length))
    w = np.stack([content, uniform, fixed], axis=1)  # (N, 3, L, L)
    scores = analysis.head_scores(w)
    assert scores["diffuse"][0] >= analysis.THRESHOLDS["diffuse"]  # spread enough to pass the lax cutoff
    assert analysis.classify_heads(scores) == ["diffuse", "diffuse", "positional"]
    assert analysis.classify_heads(scores, selective=analysis.SELECTIVE_THRESHOLD) == [
        "selective", "diffuse", "positional"]
    with pytest.raises(ValueError, match="top3"):
        analysis.classify_heads({"diffuse": np.ones(2)}, selective=0.5)


# ------------------------------------------------------------------------------------------------ JS
def test_js_known_values():
    p = np.array([0.2, 0.3, 0.5])
    assert analysis.js_divergence(p, p) == pytest.approx(0.0, abs=1e-15)
    assert analysis.js_divergence(np.array([0.5, 0.5, 0, 0]), np.array([0, 0, 0.5, 0.5])) == pytest.approx(
        math.log(2))
    q = np.array([0.6, 0.1, 0.3])
    assert analysis.js_divergence(p, q) == pytest.approx(js_by_hand(p, q))
    assert analysis.js_divergence(p, q) == pytest.approx(analysis.js_divergence(q, p))


def test_pairwise_head_js_matches_loops():
    rng = np.random.default_rng(1)
    w = causal_softmax(2 * rng.normal(size=(2, 3, 6, 6)))
    js = analysis.pairwise_head_js(w)
    for a in range(3):
        for b in range(3):
            values = [js_by_hand(w[n, a, t, :t + 1], w[n, b, t, :t + 1]) for n in range(2) for t in range(1, 6)]
            assert js[a, b] == pytest.approx(np.mean(values), abs=1e-12)
    assert np.all(np.diag(js) == 0)


# ------------------------------------------------------------------------------------------------ subspaces
def test_principal_angles_known_subspaces():
    e = np.eye(6)
    np.testing.assert_allclose(analysis.principal_angles(e[:, :2], e[:, 2:5]), [0.0, 0.0], atol=1e-12)
    mixed = e[:, :3] @ np.array([[1.0, 2.0, 0.0], [0.5, -1.0, 3.0], [1.0, 0.0, 1.0]])  # same span, other basis
    np.testing.assert_allclose(analysis.principal_angles(e[:, :3], mixed), [1.0, 1.0, 1.0])
    theta = 0.3
    rotated = np.column_stack([e[:, 0], math.cos(theta) * e[:, 1] + math.sin(theta) * e[:, 4]])
    np.testing.assert_allclose(analysis.principal_angles(e[:, :2], rotated), [1.0, math.cos(theta)])


def test_principal_angles_match_eigenvalue_formula():
    """cos^2 of the principal angles = eigenvalues of (A^T A)^-1 A^T B (B^T B)^-1 B^T A (no orthonormalisation)."""
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=(10, 3)), rng.normal(size=(10, 4))
    m = np.linalg.solve(a.T @ a, a.T @ b) @ np.linalg.solve(b.T @ b, b.T @ a)  # (3, 3)
    expected = np.sort(np.sqrt(np.clip(np.linalg.eigvals(m).real, 0, 1)))[::-1]
    np.testing.assert_allclose(analysis.principal_angles(a, b), expected, atol=1e-10)
    assert analysis.subspace_overlap(a, b) == pytest.approx(np.mean(expected ** 2))


def test_random_subspaces_overlap_about_p_over_d():
    rng = np.random.default_rng(3)
    d, p = 32, 4
    overlaps = [analysis.subspace_overlap(rng.normal(size=(d, p)), rng.normal(size=(d, p))) for _ in range(400)]
    assert np.mean(overlaps) == pytest.approx(p / d, rel=0.1)


def test_pairwise_subspace_overlap_blocks():
    rng = np.random.default_rng(4)
    basis = np.linalg.qr(rng.normal(size=(8, 8)))[0]
    w = basis[:, :6]  # three heads of 2 orthonormal columns each: mutually orthogonal
    np.testing.assert_allclose(analysis.pairwise_subspace_overlap(w, 3), np.eye(3), atol=1e-12)
    same = np.column_stack([basis[:, :2], basis[:, :2] @ np.array([[2.0, 1.0], [0.0, 1.0]])])  # two heads, one span
    np.testing.assert_allclose(analysis.pairwise_subspace_overlap(same, 2, "max_cos"), np.ones((2, 2)))
    blocks = analysis.head_blocks(np.arange(12.0).reshape(2, 6), 3)
    np.testing.assert_array_equal(blocks[1], [[2.0, 3.0], [8.0, 9.0]])


# ------------------------------------------------------------------------------------------------ importance
def loss_of(model, x, y, mask):
    with torch.no_grad():
        return model(x, y, head_mask=mask)[1].item()


@pytest.mark.parametrize("pruned", [None, (1, 2)])
def test_head_importance_matches_finite_differences(pruned):
    model = make_model()
    batches = random_batches(model)
    mask = torch.ones(2, 3, dtype=torch.float64)
    if pruned is not None:
        mask[pruned] = 0.0
    eps = 1e-6
    expected = np.zeros((2, 3))
    count = 0
    for x, y in batches:
        for n in range(x.shape[0]):
            count += 1
            for layer in range(2):
                for head in range(3):
                    plus, minus = mask.clone(), mask.clone()
                    plus[layer, head] += eps
                    minus[layer, head] -= eps
                    diff = loss_of(model, x[n:n + 1], y[n:n + 1], plus) - loss_of(model, x[n:n + 1], y[n:n + 1], minus)
                    expected[layer, head] += abs(diff / (2 * eps))
    expected /= count
    if pruned is not None:
        expected[pruned] = 0.0  # pruned heads get importance 0 by definition
    raw = analysis.head_importance(model, batches, head_mask=None if pruned is None else mask, normalize=False)
    np.testing.assert_allclose(raw, expected, rtol=1e-5, atol=1e-9)
    normalized = analysis.head_importance(model, batches, head_mask=None if pruned is None else mask)
    np.testing.assert_allclose(normalized, expected / np.linalg.norm(expected, axis=1, keepdims=True), rtol=1e-5)


def test_signed_importance_matches_finite_differences():
    """E_x[dL(x)/dxi] by central differences of the loss, sequence by sequence, signs kept."""
    model = make_model()
    batches = random_batches(model)
    eps = 1e-6
    expected, count = np.zeros((2, 3)), 0
    for x, y in batches:
        for n in range(x.shape[0]):
            count += 1
            for layer, head in itertools.product(range(2), range(3)):
                plus, minus = torch.ones(2, 3, dtype=torch.float64), torch.ones(2, 3, dtype=torch.float64)
                plus[layer, head] += eps
                minus[layer, head] -= eps
                seq = (x[n:n + 1], y[n:n + 1])
                expected[layer, head] += (loss_of(model, *seq, plus) - loss_of(model, *seq, minus)) / (2 * eps)
    signed = analysis.head_importance(model, batches, normalize=False, signed=True)
    np.testing.assert_allclose(signed, expected / count, rtol=1e-5, atol=1e-9)
    assert np.any(signed < 0)  # signs are kept (this model has heads whose removal lowers the loss on average)


def test_per_sequence_absolute_value_differs_from_batch_gradient():
    """E_x |dL(x)/dxi| >= |dE_x L(x)/dxi| (triangle inequality), so per-sequence and per-batch are not the same."""
    model = make_model()
    batches = random_batches(model, n_batches=1, n=4)
    x, y = batches[0]
    xi = torch.ones(2, 3, dtype=torch.float64, requires_grad=True)
    model(x, y, head_mask=xi)[1].backward()
    per_sequence = analysis.head_importance(model, batches, normalize=False)
    assert np.all(per_sequence >= xi.grad.abs().numpy() - 1e-12)


# ------------------------------------------------------------------------------------------------ pruning
def test_prune_curve_endpoints():
    model = make_model()
    eval_batches = random_batches(model, seed=5)
    importance_batches = random_batches(model, seed=6)
    curve = analysis.prune_curve(model, eval_batches, importance_batches, has_accuracy=True)
    assert [p["n_pruned"] for p in curve] == [0, 1, 1, 2, 2, 3, 4, 4, 5, 5, 6]  # round half up of 10% of 6 heads
    base_loss, base_acc = evaluate(model, eval_batches, has_accuracy=True)
    assert curve[0]["val_loss"] == pytest.approx(base_loss) and curve[0]["val_acc"] == pytest.approx(base_acc)
    # Every head pruned = a model whose attention outputs are only o_proj's bias: zero the o_proj weights.
    headless = copy.deepcopy(model)
    for block in headless.blocks:
        torch.nn.init.zeros_(block.attn.o_proj.weight)
    assert curve[-1]["val_loss"] == pytest.approx(evaluate(headless, eval_batches, has_accuracy=False)[0])
    assert curve[-1]["mask"] == [[0, 0, 0], [0, 0, 0]]


def test_prune_curve_removes_least_important_first():
    model = make_model()
    eval_batches, importance_batches = random_batches(model, seed=5), random_batches(model, seed=6)
    importance = analysis.head_importance(model, importance_batches)
    for recompute in (True, False):
        curve = analysis.prune_curve(model, eval_batches, importance_batches, fractions=[0, 1 / 6, 0.5],
                                     recompute=recompute, has_accuracy=False)
        first = np.argwhere(np.array(curve[1]["mask"]) == 0).tolist()
        assert first == [list(np.unravel_index(np.argmin(importance), importance.shape))]
        assert curve[1]["val_acc"] is None
    fixed = analysis.prune_curve(model, eval_batches, importance_batches, fractions=[0, 0.5], recompute=False,
                                 has_accuracy=False)
    np.testing.assert_array_equal(fixed[1]["mask"], analysis.pruning_masks(importance, [0, 0.5])[1])
    # The same loss as evaluating by hand with that mask.
    mask = torch.tensor(fixed[1]["mask"], dtype=torch.float64)
    by_hand = np.mean([loss_of(model, x, y, mask) for x, y in eval_batches])
    assert fixed[1]["val_loss"] == pytest.approx(by_hand)


def test_prune_curve_by_ablation_is_greedy_on_measured_losses():
    """Each step removes the unpruned head whose removal (on top of the pruned ones) gives the lowest loss on the
    importance batches: the same choice made by evaluating every candidate mask by hand."""
    model = make_model()
    eval_batches, importance_batches = random_batches(model, seed=5), random_batches(model, seed=6)
    curve = analysis.prune_curve(model, eval_batches, importance_batches, fractions=[k / 6 for k in range(7)],
                                 order="ablation", has_accuracy=False)
    mask = torch.ones(2, 3, dtype=torch.float64)
    for point in curve[1:]:
        candidates = [i for i in range(6) if mask.view(-1)[i] != 0]
        losses = []
        for i in candidates:
            trial = mask.clone()
            trial.view(-1)[i] = 0.0
            losses.append(np.mean([loss_of(model, x, y, trial) for x, y in importance_batches]))
        mask.view(-1)[candidates[int(np.argmin(losses))]] = 0.0
        np.testing.assert_array_equal(point["mask"], mask.numpy().astype(int))


def test_prune_curve_by_raw_importance_ranks_unnormalised():
    model = make_model()
    eval_batches, importance_batches = random_batches(model, seed=5), random_batches(model, seed=6)
    raw = analysis.head_importance(model, importance_batches, normalize=False)
    curve = analysis.prune_curve(model, eval_batches, importance_batches, fractions=[0, 1 / 6], order="raw_importance",
                                 has_accuracy=False)
    assert np.argwhere(np.array(curve[1]["mask"]) == 0).tolist() == [list(np.unravel_index(np.argmin(raw), raw.shape))]


def test_single_head_ablation_matches_hand_masks():
    model = make_model()
    batches = random_batches(model, seed=7)
    ablation = analysis.single_head_ablation(model, batches, has_accuracy=False)
    assert ablation["val_acc"] is None
    for layer in range(2):
        for head in range(3):
            mask = torch.ones(2, 3, dtype=torch.float64)
            mask[layer, head] = 0.0
            by_hand = np.mean([loss_of(model, x, y, mask) for x, y in batches])
            assert ablation["val_loss"][layer, head] == pytest.approx(by_hand)


def test_random_pruning_masks_are_nested():
    importance = np.zeros((2, 5))
    masks = analysis.pruning_masks(importance, order="random", seed=3)
    counts = [int((m == 0).sum()) for m in masks]
    assert counts == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    for smaller, larger in zip(masks, masks[1:]):
        assert np.all(larger <= smaller)
    model = make_model()
    curve = analysis.prune_curve(model, random_batches(model), order="random", seed=3, has_accuracy=False)
    again = analysis.prune_curve(model, random_batches(model), order="random", seed=3, has_accuracy=False)
    assert [p["val_loss"] for p in curve] == [p["val_loss"] for p in again]


def test_prunable_fraction():
    curve = [dict(fraction=f, n_pruned=k, val_acc=a, val_loss=l) for k, (f, a, l) in
             enumerate([(0.0, 0.90, 1.00), (0.2, 0.895, 1.005), (0.4, 0.95, 1.2), (0.6, 0.5, 3.0), (0.8, 0.95, 1.0)])]
    assert analysis.prunable_fraction(curve) == 0.4  # stops at the first drop, later recoveries do not count
    assert analysis.prunable_fraction(curve, metric="val_loss") == 0.2
    assert analysis.prunable_fraction(curve, tolerance=0.0) == 0.0


# ------------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("call, error, match", [
    (lambda: analysis.previous_token_score(np.ones((2, 3, 4))), ValueError, r"weights .*\(N, h, L, L\).*\(2, 3, 4\)"),
    (lambda: analysis.previous_token_score(np.ones((1, 1, 3, 3)) / 3), ValueError, "above the diagonal"),
    (lambda: analysis.previous_token_score(2 * uniform_causal(4)[None, None]), ValueError, "sum to 1"),
    (lambda: analysis.diffuse_score(np.full((1, 1, 2, 2), np.nan)), ValueError, "non-finite"),
    (lambda: analysis.induction_score(uniform_causal(6)[None, None], 6), ValueError, r"period .*\[2, 5\]"),
    (lambda: analysis.positional_score(uniform_causal(4)[None, None]), ValueError, "N >= 2"),
    (lambda: analysis.js_divergence(np.ones(3) / 3, np.ones(4) / 4), ValueError, "same last axis"),
    (lambda: analysis.js_divergence(np.array([1.5, -0.5]), np.array([0.5, 0.5])), ValueError, "negative"),
    (lambda: analysis.js_divergence([0.5, 0.5], np.array([0.5, 0.5])), TypeError, "p must be"),
    (lambda: analysis.principal_angles(np.ones((4, 2)), np.eye(4)[:, :2]), ValueError, "full column rank"),
    (lambda: analysis.principal_angles(np.eye(4)[:, :2], np.eye(5)[:, :2]), ValueError, "same number of rows"),
    (lambda: analysis.head_blocks(np.ones((4, 6)), 4), ValueError, "n_heads=4"),
    (lambda: analysis.classify_heads({"diffuse": np.ones(2)}, {"sharp": 0.5}), ValueError, "unknown keys"),
    (lambda: analysis.pruning_masks(np.ones((2, 2)), [0.5, 0.2]), ValueError, "increasing"),
    (lambda: analysis.pruning_masks(np.ones((2, 2)), order="worst"), ValueError, "order"),
    (lambda: analysis.head_importance(torch.nn.Linear(2, 2), []), TypeError, "TinyTransformer"),
    (lambda: analysis.prune_curve(make_model(), random_batches(make_model())), ValueError, "importance_batches"),
    (lambda: analysis.head_importance(make_model(), random_batches(make_model()), head_mask=torch.ones(3, 2)),
     ValueError, r"head_mask .*\(2, 3\)"),
    (lambda: analysis.repeat_induction_scores(make_model(), [6]), ValueError, r"periods\[0\] .* must be an integer in \[2, 5\]"),
    (lambda: analysis.top_key_score(uniform_causal(4)[None, None], 4), ValueError, r"k \(with L=4 positions\)"),
    (lambda: analysis.classify_heads({"top3": np.ones(1), "positional": np.ones(1)}, selective=0), ValueError,
     "selective"),
    (lambda: analysis.head_importance(make_model(), random_batches(make_model()), signed=True), ValueError,
     "normalize=False"),
    (lambda: analysis.head_importance(make_model(), random_batches(make_model()), signed="yes"), TypeError, "signed"),
    (lambda: analysis.prune_curve(make_model(), random_batches(make_model()), order="ablation"), ValueError,
     "importance_batches"),
    (lambda: analysis.prune_curve(make_model(), random_batches(make_model()), order="worst"), ValueError, "order"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ------------------------------------------------------------------------------------------------ multiple tests
def _step_down_by_loops(diffs):
    """Westfall-Young step-down max-T spelled out from its definition, without sorting: test i's adjusted p is the
    largest, over the tests j whose observed statistic is at least test i's, of the fraction of sign patterns in which
    the largest statistic among the tests whose observed statistic is at most test j's reaches test j's observed one.
    Statistic |mean| / rms (the package's |s . d| / ||d|| times 1 / sqrt(n): the same order)."""
    names = list(diffs)
    n = len(diffs[names[0]])
    patterns = list(itertools.product((1, -1), repeat=n))

    def stat(signs, d):
        return abs(sum(s * x for s, x in zip(signs, d)) / n) / math.sqrt(sum(x * x for x in d) / n)

    observed = {k: stat(patterns[0], diffs[k]) for k in names}

    def p_of(j):  # the unadjusted step-down p of test j: its max over the tests not above it
        rest = [k for k in names if observed[k] <= observed[j] * (1 + 1e-12)]
        hits = sum(max(stat(signs, diffs[k]) for k in rest) >= observed[j] * (1 - 1e-12) for signs in patterns)
        return hits / len(patterns)

    return {i: max(p_of(j) for j in names if observed[j] >= observed[i] * (1 - 1e-12)) for i in names}


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_step_down_max_t_against_loops(seed):
    rng = np.random.default_rng(seed)
    base = rng.standard_normal(7)
    diffs = {"a": base + 0.9, "b": 0.8 * base + 0.3 * rng.standard_normal(7) + 0.4, "c": rng.standard_normal(7),
             "d": rng.standard_normal(7) + 0.6}
    got = stats.max_t_adjusted(diffs, step_down=True)
    single = stats.max_t_adjusted(diffs)
    expected = _step_down_by_loops({k: list(v) for k, v in diffs.items()})
    for name in diffs:
        assert got[name]["adjusted"] == pytest.approx(expected[name], abs=1e-12)
        assert got[name]["raw"] == single[name]["raw"]
        # step-down is never above single-step, never below the raw p
        assert got[name]["raw"] - 1e-12 <= got[name]["adjusted"] <= single[name]["adjusted"] + 1e-12
    # the test with the largest statistic (the smallest raw p here) gets the single-step value
    top = max(diffs, key=lambda k: abs(diffs[k].sum()) / np.linalg.norm(diffs[k]))
    assert got[top]["adjusted"] == pytest.approx(single[top]["adjusted"])
    # adjusted p-values never decrease as the observed statistic falls
    by_stat = sorted(diffs, key=lambda k: -abs(diffs[k].sum()) / np.linalg.norm(diffs[k]))
    assert all(got[a]["adjusted"] <= got[b]["adjusted"] + 1e-15 for a, b in zip(by_stat, by_stat[1:]))


def test_step_down_max_t_by_hand():
    """Sign patterns counted by hand.

    Three seeds, a = (1, 1, 1), b = (2, 1, 0): T_a = |s . a| / ||a|| is sqrt 3 in the 2 patterns of equal signs,
    1/sqrt 3 in the 6 others; |s . b| = |2 s1 + s2| is 3 where s1 = s2 (4 patterns), 1 otherwise, so T_b = 3/sqrt 5 =
    1.342 or 1/sqrt 5. Observed: T_a = 1.732 > T_b = 1.342. Single-step a: max >= 1.732 in the 2 equal-sign patterns
    (T_b never reaches it): 2/8; b: max >= 1.342 where s1 = s2 (the equal-sign patterns are among them): 4/8. The raw
    p-values are the same, and so is step-down.

    Four seeds, a = (1, 1, 1, 1), b = (1, 1, 1, -1): T_a = |sum s| / 2 is 2 in 2 patterns, 1 in 8, 0 in 6; T_b the
    same with s4 flipped, 2 in (+ + + -) and (- - - +). Observed T_a = 2, T_b = 1. Raw: a 2/16, b 10/16. Single-step:
    a: max >= 2 in the 2 + 2 patterns where either is 2: 4/16; b: max >= 1 in every pattern (both below 1 needs
    sum s = 0 and sum s - 2 s4 = 0, so s4 = 0): 16/16. Step-down: a first, 4/16; then b alone: 10/16, already above
    4/16: 10/16, strictly below single-step's 1.
    """
    diffs = {"a": np.array([1.0, 1.0, 1.0]), "b": np.array([2.0, 1.0, 0.0])}
    single, down = stats.max_t_adjusted(diffs), stats.max_t_adjusted(diffs, step_down=True)
    assert single == {"a": {"raw": 0.25, "adjusted": 0.25}, "b": {"raw": 0.5, "adjusted": 0.5}}
    assert down == single
    diffs = {"a": np.array([1.0, 1.0, 1.0, 1.0]), "b": np.array([1.0, 1.0, 1.0, -1.0])}
    single, down = stats.max_t_adjusted(diffs), stats.max_t_adjusted(diffs, step_down=True)
    assert single == {"a": {"raw": 2 / 16, "adjusted": 4 / 16}, "b": {"raw": 10 / 16, "adjusted": 1.0}}
    assert down == {"a": {"raw": 2 / 16, "adjusted": 4 / 16}, "b": {"raw": 10 / 16, "adjusted": 10 / 16}}
    with pytest.raises(TypeError, match="step_down"):
        stats.max_t_adjusted(diffs, step_down="yes")


def test_holm_by_hand():
    """p = (0.01, 0.04, 0.03, 0.005): sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04;
    running maximum 0.02, 0.03, 0.06, 0.06; back in the input order 0.03, 0.06, 0.06, 0.02."""
    np.testing.assert_allclose(stats.holm_adjusted([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02])
    got = stats.holm_adjusted({"x": 0.5, "y": 0.6, "z": 0.001})  # 0.003; 0.5 x 2 = 1.0; max(1.0, 0.6) = 1
    assert got == pytest.approx({"x": 1.0, "y": 1.0, "z": 0.003})
    assert stats.holm_adjusted([0.2]) == pytest.approx([0.2])  # a family of one: nothing to adjust
    # never below Bonferroni's smallest, never above Bonferroni: min(1, k p) >= Holm >= p
    rng = np.random.default_rng(0)
    p = rng.uniform(0, 0.3, 9)
    holm = stats.holm_adjusted(p)
    assert np.all(holm >= p) and np.all(holm <= np.minimum(1, 9 * p) + 1e-15)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        stats.holm_adjusted([0.1, 1.2])
