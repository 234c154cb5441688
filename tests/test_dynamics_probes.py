"""The dynamics study's per-layer W_Q / W_K gradient norms (recorded before clipping) and its mean ablations, each
against an independent computation: a training step done by hand with autograd, a forward pass written out here."""

import math
import statistics

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mha.experiments.config import DynamicsRun
from mha.experiments.machine import seed_everything
from mha.experiments.model import ModernTransformerConfig, TinyTransformer, TransformerConfig
from mha.experiments.probes import DynamicsProbe, attention_probe, head_ablations, head_means, head_outputs
from mha.experiments.studies import run_dynamics
from mha.experiments.tasks import RepeatedSequence
from mha.experiments.train import configure_optimizer, get_lr, train

torch.set_num_threads(1)


def _config(grad_clip: float, steps: int = 3) -> DynamicsRun:
    return DynamicsRun.from_dict(dict(
        task="induction", task_kwargs={"vocab_size": 16, "seq_len": 6, "score": "all"}, n_layers=2, d_model=16,
        n_heads=2, attention_only=False, steps=steps, eval_interval=steps, warmup_steps=1, batch_size=8,
        grad_clip=grad_clip, seed=3))


def _frobenius(grad: torch.Tensor, rows: slice) -> float:
    """||G[rows]||_F in float64, summed by hand: W^T is stored, so a projection's output units are rows."""
    block = grad[rows].double()
    return math.sqrt(float((block * block).sum()))


def _by_hand(config: DynamicsRun, steps: int):
    """The trainer's first ``steps`` steps redone here: for each step, per layer, the W_Q and W_K gradient norms
    right after backward (before clipping), read by slicing the query rows and the key rows of the layer's
    projections, and the global norm before clipping."""
    cfg, task = config.train, config.make_task()
    seed_everything(cfg.seed)
    model_config = config.model_config(task)
    model = TinyTransformer(model_config)
    optimizer = configure_optimizer(model, cfg, torch.device("cpu"))
    hd, h, g = model.head_dim, config.model.n_heads, model.n_kv_heads
    q_norms, k_norms, global_norms = [], [], []
    model.train()
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = get_lr(step, cfg)
        x, y = task.get_batch("train", cfg.batch_size)  # the task's train stream is its own generator
        _, loss, _ = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        q_norms.append([_frobenius(b.attn.q_proj.weight.grad, slice(0, h * hd)) for b in model.blocks])
        k_norms.append([_frobenius(b.attn.k_proj.weight.grad, slice(0, g * hd)) for b in model.blocks])
        global_norms.append(math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in model.parameters())))
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
    return q_norms, k_norms, global_norms


@pytest.mark.parametrize("grad_clip", [100.0, 1e-3])
def test_qk_gradient_norms_are_the_pre_clip_norms(grad_clip):
    """The probe's per-layer norms equal those of a training step done by hand, read right after backward; with a
    clip small enough to scale every step's gradients, they are the unclipped norms (the gradients the trained model
    is left with, clipped in place, are far smaller)."""
    steps = 3
    config = _config(grad_clip, steps)
    task = config.make_task()
    probe = DynamicsProbe()
    result = train(config.model_config(task), task, config.train, progress=False, hooks=[probe])
    probe.close()
    q_hand, k_hand, global_hand = _by_hand(config, steps)
    assert np.array(probe.q_grad_norms).shape == (steps, 2) == np.array(probe.k_grad_norms).shape
    np.testing.assert_allclose(probe.q_grad_norms, q_hand, rtol=1e-5)
    np.testing.assert_allclose(probe.k_grad_norms, k_hand, rtol=1e-5)
    np.testing.assert_allclose(probe.grad_norms, global_hand, rtol=1e-5)  # the same steps as the trainer's
    if grad_clip < 1:
        assert min(probe.grad_norms) > 100 * grad_clip  # every step was clipped, by a factor above 100
        # The trained model holds the last step's gradients as clipping left them: the recorded norm times the
        # clip coefficient, not the recorded norm.
        coefficient = grad_clip / (probe.grad_norms[-1] + 1e-6)
        for layer, block in enumerate(result.model.blocks):
            clipped = block.attn.q_proj.weight.grad.norm().item()
            assert clipped == pytest.approx(probe.q_grad_norms[-1][layer] * coefficient, rel=1e-4)
            assert clipped < probe.q_grad_norms[-1][layer] / 100
    else:
        assert max(probe.grad_norms) < grad_clip  # nothing clipped: recorded norms equal the left gradients
        last = result.model.blocks[1].attn.k_proj.weight.grad.norm().item()
        assert last == pytest.approx(probe.k_grad_norms[-1][1], rel=1e-5)


def test_gradient_hooks_do_not_change_training_and_are_removed():
    """Every parameter of a run with the probe equals, bit for bit, those of a run without it; close() removes the
    hooks."""
    config = _config(1e-3, steps=4)
    task = config.make_task()
    plain = train(config.model_config(task), task, config.train, progress=False).model
    probe = DynamicsProbe()
    probed = train(config.model_config(config.make_task()), config.make_task(), config.train, progress=False,
                   hooks=[probe]).model
    for (name, a), b in zip(plain.named_parameters(), probed.parameters()):
        assert torch.equal(a, b), name
    probe.close()
    probed.zero_grad()
    probed(*config.make_task().get_batch("train", 2))[1].backward()  # no hook left: nothing recorded
    assert len(probe.q_grad_norms) == 4 and probe._pending == {}  # the hooks would have filled it


def test_probe_refuses_latent_attention():
    model = TinyTransformer(ModernTransformerConfig(vocab_size=8, block_size=8, n_layers=1, d_model=16, n_heads=2,
                                                    kv_rank=6, rope_base=10000.0))
    with pytest.raises(ValueError, match="layer 0 has MultiHeadLatentAttention"):
        DynamicsProbe().on_start(model, [], torch.device("cpu"))


@pytest.fixture(scope="module")
def dynamics_run():
    config = DynamicsRun.from_dict(dict(
        task="induction_varying", task_kwargs={"vocab_size": 16, "seq_len": 6, "min_period": 4}, n_layers=2,
        d_model=16, n_heads=2, steps=12, eval_interval=4, warmup_steps=2, batch_size=8, spike_window=3))
    return config, run_dynamics(config)


def test_run_dynamics_summarises_qk_gradient_norms(dynamics_run):
    config, run = dynamics_run
    metrics, history = run["metrics"], run["history"]
    q, k = np.array(run["q_grad_norms"]), np.array(run["k_grad_norms"])  # (steps, layers)
    assert q.shape == k.shape == (12, 2)
    for layer in range(2):
        for kind, norms in (("q", q), ("k", k)):
            median, largest = metrics[f"{kind}_grad_norm_median_L{layer}"], metrics[f"{kind}_grad_norm_max_L{layer}"]
            assert math.isfinite(median) and 0 < median <= largest
            assert median == float(np.median(norms[2:, layer])) and largest == float(norms[2:, layer].max())
    assert history[0]["qk_grad_norms"] is None
    assert history[2]["qk_grad_norms"] == [{"q": statistics.fmean(q[4:8, i]), "k": statistics.fmean(k[4:8, i])}
                                          for i in range(2)]
    # the global norm bounds each block's: sqrt(sum of squares over every parameter) >= any one of them
    assert all(run["grad_norms"][s] >= max(q[s].max(), k[s].max()) * (1 - 1e-6) for s in range(12))


def test_run_dynamics_records_mean_ablations(dynamics_run):
    _, run = dynamics_run
    metrics, ablations = run["metrics"], run["artifacts"]["ablations"]
    final = run["history"][-1]["layers"]
    for kind, short in (("induction", "induction"), ("previous_token", "prev")):
        expected = [[layer, head] for layer, record in enumerate(final) for head, s in enumerate(record[kind])
                    if s >= 0.5]
        assert metrics[f"n_{kind}_heads"] == len(expected)
        entry = next((a for a in ablations if a["ablated"] == f"mean:{kind}"), None)
        if expected:
            assert entry["heads"] == expected and entry["ablation"] == "mean"
            assert metrics[f"loss_repeat_probe_mean_ablate_{short}"] == pytest.approx(entry["loss_repeat"], abs=1e-3)
        else:
            assert entry is None and metrics[f"loss_repeat_probe_mean_ablate_{short}"] is None
    layer0 = next(a for a in ablations if a["ablated"] == "mean:L0")
    assert metrics["loss_repeat_probe_mean_ablate_layer0"] == pytest.approx(layer0["loss_repeat"], abs=1e-3)  # rounded
    assert math.isfinite(metrics["loss_repeat_probe_mean_ablate_layer0"])


# ----------------------------------------------------------------------------------------------- mean ablation
PERIOD = 5


def _model_and_probe(seed: int = 0):
    torch.manual_seed(seed)
    model = TinyTransformer(TransformerConfig(vocab_size=12, block_size=2 * PERIOD - 1, n_layers=2, d_model=16,
                                              n_heads=2, bias=True)).eval()
    with torch.no_grad():  # larger weights than the initialisation's, so that every head matters
        for p in model.parameters():
            p.mul_(10.0 if p.dim() == 2 else 1.0)
    x, y = RepeatedSequence(vocab_size=12, seq_len=PERIOD, score="all", seed=1).get_batch("val", 16)
    return model, x, y


def _forward_by_hand(model: TinyTransformer, x: torch.Tensor, substitute: dict | None = None,
                     trace: list | None = None):
    """The model's forward pass written out (pre-LayerNorm blocks, causal softmax attention, tied head), each head's
    output (before o_proj) replaced by ``substitute[(layer, head)]`` (a (head_dim,) vector) where given. Returns the
    logits and every layer's head outputs as computed (before any substitution), (N, L, h, head_dim). With ``trace``
    (a list), appends each layer's (q, k, scores, weights): (N, L, h, hd) twice, then (N, h, L, L) twice."""
    substitute = substitute or {}
    n, length = x.shape
    d = model.config.d_model
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    hidden = model.tok_emb.weight[x] + model.pos_emb.weight[:length]  # (N, L, d)
    outputs = []
    for i, block in enumerate(model.blocks):
        attn = block.attn
        h, hd = attn.n_heads, attn.head_dim
        z = F.layer_norm(hidden, (d,), block.ln_1.weight, block.ln_1.bias)
        q, k, v = (F.linear(z, proj.weight, proj.bias).view(n, length, h, hd)
                   for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
        scores = torch.einsum("nqhe,nkhe->nhqk", q, k) / math.sqrt(hd)
        weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)  # (N, h, L, L)
        heads = torch.einsum("nhqk,nkhe->nqhe", weights, v)  # (N, L, h, hd)
        if trace is not None:
            trace.append((q, k, scores, weights))
        outputs.append(heads.clone())
        for (layer, head), vector in substitute.items():
            if layer == i:
                heads[:, :, head] = vector
        hidden = hidden + F.linear(heads.reshape(n, length, h * hd), attn.o_proj.weight, attn.o_proj.bias)
        hidden = hidden + block.mlp(F.layer_norm(hidden, (d,), block.ln_2.weight, block.ln_2.bias))
    logits = F.linear(F.layer_norm(hidden, (d,), model.ln_f.weight, model.ln_f.bias), model.lm_head.weight)
    return logits, outputs


def _repeat_loss(logits, y):
    return F.cross_entropy(logits[:, PERIOD:].transpose(1, 2), y[:, PERIOD:]).item()


def _correct_token_by_hand(logits, y):
    """(mean probability of the correct token, count ranked first, positions) on the first copy and on the repeat,
    in float64 NumPy: softmax written out, ranks by sorting."""
    z = logits.double().numpy()
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    probs = z / z.sum(axis=-1, keepdims=True)
    target = y.numpy()
    p = np.take_along_axis(probs, target[..., None], axis=-1)[..., 0]  # (N, L)
    first = np.argsort(-probs, axis=-1, kind="stable")[..., 0] == target  # (N, L)
    return {part: (p[:, cols].mean(), int(first[:, cols].sum()), first[:, cols].size)
            for part, cols in (("first", slice(None, PERIOD)), ("repeat", slice(PERIOD, None)))}


def _check_correct_token(entry, logits, y):
    for part, (p, count, n) in _correct_token_by_hand(logits, y).items():
        assert entry[f"p_correct_{part}"] == pytest.approx(p, rel=1e-5), (entry["ablated"], part)
        assert (entry[f"correct_{part}"], entry[f"n_{part}"]) == (count, n), (entry["ablated"], part)


@torch.no_grad()
def test_mean_ablation_against_a_forward_pass_written_out():
    model, x, y = _model_and_probe()
    logits, outputs = _forward_by_hand(model, x)
    torch.testing.assert_close(logits, model(x)[0], rtol=1e-4, atol=1e-4)  # the written-out pass is the model's
    for ours, theirs in zip(outputs, head_outputs(model, x)):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
    means = {(layer, head): out[:, :, head].double().mean(dim=0).float()  # (L, head_dim): over the sequences
             for layer, out in enumerate(outputs) for head in range(2)}
    for layer, mean in enumerate(head_means(model, x)):  # (L, h, head_dim)
        torch.testing.assert_close(mean, torch.stack([means[layer, 0], means[layer, 1]], dim=1), rtol=1e-4,
                                   atol=1e-5)
    # The means differ between positions, so a mean pooled over positions would fail the comparisons below.
    assert all((m[0] - m[-1]).abs().max() > 1e-2 for m in means.values())
    ablations = head_ablations(model, x, y, PERIOD, head_sets={"pair": [(0, 1), (1, 0)]})
    by_name = {a["ablated"]: a for a in ablations}
    assert by_name["none"]["loss_repeat"] == pytest.approx(_repeat_loss(logits, y), rel=1e-5)
    _check_correct_token(by_name["none"], logits, y)
    cases = {"L0H1": [(0, 1)], "L1H0": [(1, 0)], "L1": [(1, 0), (1, 1)], "pair": [(0, 1), (1, 0)]}
    for name, heads in cases.items():
        mean_logits, _ = _forward_by_hand(model, x, {head: means[head] for head in heads})
        zero_logits, _ = _forward_by_hand(model, x, {head: torch.zeros(model.head_dim) for head in heads})
        mean_entry, zero_entry = by_name[f"mean:{name}"], by_name[name]
        assert mean_entry["ablation"] == "mean" and zero_entry["ablation"] == "zero"
        assert mean_entry["heads"] == zero_entry["heads"] == [list(h) for h in heads]
        assert mean_entry["loss_repeat"] == pytest.approx(_repeat_loss(mean_logits, y), rel=1e-5)
        assert zero_entry["loss_repeat"] == pytest.approx(_repeat_loss(zero_logits, y), rel=1e-5)
        _check_correct_token(mean_entry, mean_logits, y)
        _check_correct_token(zero_entry, zero_logits, y)
        # the two ablations differ measurably here (else the comparison above could not tell them apart)
        assert abs(mean_entry["loss_repeat"] - zero_entry["loss_repeat"]) > 1e-3


@torch.no_grad()
def test_attention_probe_score_parts_against_a_forward_pass_written_out():
    """Norms, cosines and the attended score per head, computed here in float64 NumPy from the written-out pass's
    queries and keys, one query row and one key at a time."""
    model, x, _ = _model_and_probe()
    trace = []
    _forward_by_hand(model, x, trace=trace)
    layers = attention_probe(model, x)
    length = x.shape[1]
    for layer, (q, k, scores, weights) in zip(layers, trace):
        q, k, scores, weights = (t.double().numpy() for t in (q, k, scores, weights))
        n_heads = q.shape[2]
        for head in range(n_heads):
            qh, kh = q[:, :, head], k[:, :, head]  # (N, L, hd)
            assert layer["q_norm"][head] == pytest.approx(np.sqrt((qh ** 2).sum(-1)).mean(), rel=1e-5)
            assert layer["k_norm"][head] == pytest.approx(np.sqrt((kh ** 2).sum(-1)).mean(), rel=1e-5)
            attended, unweighted, score = [], [], []
            for n in range(len(x)):
                for t in range(1, length):
                    cosines = [qh[n, t] @ kh[n, j] / np.linalg.norm(qh[n, t]) / np.linalg.norm(kh[n, j])
                               for j in range(t + 1)]
                    a = weights[n, head, t, :t + 1]
                    attended.append(a @ np.array(cosines))
                    unweighted.append(np.mean(cosines))
                    score.append(a @ scores[n, head, t, :t + 1])
            assert layer["cos_attended"][head] == pytest.approx(np.mean(attended), rel=1e-4, abs=1e-6)
            assert layer["cos_mean"][head] == pytest.approx(np.mean(unweighted), rel=1e-4, abs=1e-6)
            assert layer["score_attended"][head] == pytest.approx(np.mean(score), rel=1e-4, abs=1e-6)
        # attention selects: here the weighted cosine differs from the unweighted one (else the test could not tell)
        assert max(abs(a - b) for a, b in zip(layer["cos_attended"], layer["cos_mean"])) > 1e-2


@torch.no_grad()
def test_mean_ablating_a_constant_head_changes_nothing_zeroing_it_does():
    """A head whose value projection is a constant (weights 0, bias c) outputs c at every position (its weights sum
    to 1): replacing it by its mean leaves the loss as it was; setting it to zero does not."""
    model, x, y = _model_and_probe()
    attn, hd = model.blocks[0].attn, model.head_dim
    rows = slice(1 * hd, 2 * hd)  # head 1's value rows
    attn.v_proj.weight[rows] = 0.0
    attn.v_proj.bias[rows] = torch.linspace(-3.0, 3.0, hd)
    attn.o_proj.weight[:, rows] *= 10.0  # a constant that matters downstream
    out = head_outputs(model, x)[0][:, :, 1]  # (N, L, hd)
    torch.testing.assert_close(out, attn.v_proj.bias[rows].expand_as(out), rtol=1e-6, atol=1e-6)  # constant
    by_name = {a["ablated"]: a for a in head_ablations(model, x, y, PERIOD)}
    intact = by_name["none"]
    for part in ("loss_first", "loss_repeat"):
        assert by_name["mean:L0H1"][part] == pytest.approx(intact[part], rel=1e-6, abs=1e-7)
        assert abs(by_name["L0H1"][part] - intact[part]) > 1e-2


def test_score_step_probe_against_an_exact_rescaling():
    """Scaling layer 0's query projection (weight and bias) by (1 + eps) multiplies its scores by exactly (1 + eps),
    so the probe's change must be eps times the spread, per head too; the scores themselves are checked against the
    model's attention weights (log-weight differences along a row are score differences)."""
    from mha.experiments.probes import ScoreStepProbe, _layer_scores

    torch.manual_seed(0)
    model = TinyTransformer(TransformerConfig(vocab_size=11, block_size=8, n_layers=2, d_model=16, n_heads=4)).double()
    x = torch.randint(11, (3, 8), generator=torch.Generator().manual_seed(1))
    for _, _, scores, w, _, _ in _layer_scores(model.eval(), x):  # scores[..., t, j] - scores[..., t, 0] = log w_tj - log w_t0
        t = 5
        torch.testing.assert_close(scores[..., t, :t + 1] - scores[..., t, :1],
                                   w[..., t, :t + 1].log() - w[..., t, :1].log())
    probe = ScoreStepProbe(x, steps=[1, 2], stop_after=2)
    probe.on_start(model, [], torch.device("cpu"))
    eps = 0.01
    with torch.no_grad():
        model.blocks[0].attn.q_proj.weight.mul_(1 + eps)
        model.blocks[0].attn.q_proj.bias.mul_(1 + eps)
    assert probe.on_step(0, torch.tensor(0.0), torch.tensor(0.0)) is False
    layer0 = probe.records[1][0]
    assert layer0["change_rms"] == pytest.approx(eps * layer0["spread"], rel=1e-9)
    assert probe.records[1][1]["change_rms"] > 0  # the second layer sees a changed input
    # Update 2 changes no weight: no change recorded, and training stops after it (stop_after=2).
    assert probe.on_step(1, torch.tensor(0.0), torch.tensor(0.0)) is True
    assert [layer["change_rms"] for layer in probe.records[2]] == [0.0, 0.0]
    heads = np.array(layer0["head_change_rms"])
    assert heads.shape == (4,) and np.all(heads > 0)
    # The split: layer 0's input did not move, so its change is all its own projections'; layer 1's projections did
    # not move, so its change is all its input's (and their interaction is 0 in both)
    layer1 = probe.records[1][1]
    assert layer0["own_change_rms"] == pytest.approx(layer0["change_rms"], rel=1e-12) and layer0["input_change_rms"] == 0
    assert layer1["own_change_rms"] == 0 and layer1["input_change_rms"] == pytest.approx(layer1["change_rms"], rel=1e-12)
    np.testing.assert_allclose(layer0["head_own_change_rms"], heads, rtol=1e-12)
    assert layer1["head_own_change_rms"] == [0.0] * 4


def test_score_step_probe_splits_a_change_in_a_later_layers_keys():
    """Moving only layer 1's key projection moves layer 1's scores through its own projections alone, by exactly the
    change of q . k computed here from the layer's input with the two key weights; layer 0 does not move."""
    from mha.experiments.probes import ScoreStepProbe

    torch.manual_seed(0)
    model = TinyTransformer(TransformerConfig(vocab_size=11, block_size=8, n_layers=2, d_model=16, n_heads=4)).double()
    x = torch.randint(11, (3, 8), generator=torch.Generator().manual_seed(2))
    inputs = []
    handle = model.blocks[1].attn.register_forward_pre_hook(lambda module, args: inputs.append(args[0]))
    model.eval()(x)
    handle.remove()
    probe = ScoreStepProbe(x, steps=[1], stop_after=1)
    probe.on_start(model, [], torch.device("cpu"))
    attn = model.blocks[1].attn
    delta = 0.05 * torch.randn(attn.k_proj.weight.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    old_k = attn.k_proj.weight.detach().clone()
    with torch.no_grad():
        attn.k_proj.weight.add_(delta)
    assert probe.on_step(0, torch.tensor(0.0), torch.tensor(0.0)) is True
    layer0, layer1 = probe.records[1]
    assert layer0["change_rms"] == layer0["own_change_rms"] == layer0["input_change_rms"] == 0
    # by hand, head by head: s = (x Wq_h^T + bq_h) . (x Wk_h^T + bk_h) / sqrt(head_dim) over the causal entries
    x_in, hd = inputs[0].detach(), attn.head_dim
    wq, bq, wk, bk = (p.detach() for p in (attn.q_proj.weight, attn.q_proj.bias, attn.k_proj.weight, attn.k_proj.bias))
    change = []
    for h in range(attn.n_heads):
        rows = slice(h * hd, (h + 1) * hd)
        q = x_in @ wq[rows].T + bq[rows]
        k_old = x_in @ old_k[rows].T + bk[rows]
        k_new = x_in @ wk[rows].T + bk[rows]
        d = ((q @ k_new.transpose(-2, -1)) - (q @ k_old.transpose(-2, -1))) / hd ** 0.5  # (N, L, L)
        change.append(d[:, torch.ones(8, 8).tril().bool()])
    change = torch.stack(change, dim=1)  # (N, h, E)
    assert layer1["own_change_rms"] == pytest.approx(float(change.pow(2).mean().sqrt()), rel=1e-9)
    assert layer1["change_rms"] == pytest.approx(layer1["own_change_rms"], rel=1e-12)
    assert layer1["input_change_rms"] == 0 and layer1["rest_change_rms"] == 0


def test_score_step_probe_splits_a_step_that_moves_both_projections_and_input():
    """Moving layer 1's query projection and its layer norm's gain together: own, input and the rest (their
    interaction) against S(W, x) computed by hand for the four pairings of old and new weights and inputs, per head."""
    from mha.experiments.probes import ScoreStepProbe

    torch.manual_seed(0)
    model = TinyTransformer(TransformerConfig(vocab_size=11, block_size=8, n_layers=2, d_model=16, n_heads=4)).double()
    x = torch.randint(11, (3, 8), generator=torch.Generator().manual_seed(4))
    block = model.blocks[1]
    inputs = []
    handle = block.attn.register_forward_pre_hook(lambda module, args: inputs.append(args[0].detach().clone()))
    model.eval()(x)
    probe = ScoreStepProbe(x, steps=[1], stop_after=1)
    probe.on_start(model, [], torch.device("cpu"))
    attn = block.attn
    old = [p.detach().clone() for p in (attn.q_proj.weight, attn.q_proj.bias, attn.k_proj.weight, attn.k_proj.bias)]
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        attn.q_proj.weight.add_(0.1 * torch.randn(attn.q_proj.weight.shape, generator=generator, dtype=torch.float64))
        block.ln_1.weight.mul_(1 + 0.2 * torch.rand(block.ln_1.weight.shape, generator=generator, dtype=torch.float64))
    model(x)
    handle.remove()
    new = [p.detach() for p in (attn.q_proj.weight, attn.q_proj.bias, attn.k_proj.weight, attn.k_proj.bias)]
    assert probe.on_step(0, torch.tensor(0.0), torch.tensor(0.0)) is True
    causal = torch.ones(8, 8).tril().bool()
    hd = attn.head_dim

    def scores(x_in, weights):  # (N, h, E): per head, (x Wq_h^T + bq_h) . (x Wk_h^T + bk_h) / sqrt(head_dim)
        wq, bq, wk, bk = weights
        out = []
        for h in range(attn.n_heads):
            rows = slice(h * hd, (h + 1) * hd)
            q, k = x_in @ wq[rows].T + bq[rows], x_in @ wk[rows].T + bk[rows]
            out.append((q @ k.transpose(-2, -1) / hd ** 0.5)[:, causal])
        return torch.stack(out, dim=1)

    x_old, x_new = inputs[0], inputs[-1]  # layer 1's attention input before and after the change
    s_oo, s_no, s_on, s_nn = scores(x_old, old), scores(x_old, new), scores(x_new, old), scores(x_new, new)
    rms = lambda d: float(d.pow(2).mean().sqrt())  # noqa: E731
    got = probe.records[1][1]
    assert got["change_rms"] == pytest.approx(rms(s_nn - s_oo), rel=1e-9)
    assert got["own_change_rms"] == pytest.approx(rms(s_no - s_oo), rel=1e-9)
    assert got["input_change_rms"] == pytest.approx(rms(s_on - s_oo), rel=1e-9)
    assert got["rest_change_rms"] == pytest.approx(rms(s_nn - s_no - s_on + s_oo), rel=1e-6)
    assert got["rest_change_rms"] > 0  # both moved: an interaction
    np.testing.assert_allclose(got["head_own_change_rms"], (s_no - s_oo).pow(2).mean(dim=(0, 2)).sqrt(), rtol=1e-9)
    np.testing.assert_allclose(got["head_input_change_rms"], (s_on - s_oo).pow(2).mean(dim=(0, 2)).sqrt(), rtol=1e-9)
    assert probe.records[1][0]["change_rms"] == 0  # layer 0 did not move


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(x=[[1, 2]], steps=[1]), TypeError, "x must be"),
    (dict(x=torch.zeros(1, 2, dtype=torch.long), steps=[]), ValueError, "at least one step"),
    (dict(x=torch.zeros(1, 2, dtype=torch.long), steps=[0]), ValueError, r"steps\[0\]"),
])
def test_score_step_probe_bad_input(kwargs, error, match):
    from mha.experiments.probes import ScoreStepProbe

    with pytest.raises(error, match=match):
        ScoreStepProbe(**kwargs)
