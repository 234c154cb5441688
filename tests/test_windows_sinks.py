"""The attention options of today's models in the experiments' model (book part IV, "Windows and sinks, measured"):
ModernModelConfig's fields, TinyTransformer with windows, local/global layers, sink logits and RoPE, the first-token
probe, and the paired sign-flip interval. Every check compares with an independent computation: the NumPy float64
reference run layer by layer with explicit masks, a model built the old way, brute force over a grid."""

import csv
import itertools
import json
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mha import reference
from mha.experiments import analysis, stats
from mha.experiments.config import ModelConfig, ModernModelConfig, ShakespeareRun, TrainRun, layer_windows
from mha.experiments.model import ModernTransformerConfig, TinyTransformer, TransformerConfig
from mha.experiments.probes import first_token_attention
from mha.experiments.results import Results, plan
from mha.experiments.sweep_file import load_sweep

torch.set_num_threads(1)
F64 = torch.float64
REPO = Path(__file__).resolve().parents[1]
# ModernModelConfig's own fields
NEW = ("window", "global_every", "sinks", "rope_base", "gate", "kv_rank", "qk_rope_head_dim")


def make(seed=0, **options):
    kwargs = dict(vocab_size=13, block_size=16, n_layers=4, d_model=16, n_heads=4, bias=True)
    kwargs.update(options)
    torch.manual_seed(seed)
    return TinyTransformer(ModernTransformerConfig(**kwargs)).to(F64).eval()


def ids(n, length, vocab=13, seed=1):
    return torch.randint(vocab, (n, length), generator=torch.Generator().manual_seed(seed))


def reference_forward(model, idx):
    """The model's logits and every layer's attention weights computed independently: the attention of each block by
    ``mha.reference.multi_head_attention`` (NumPy float64) with an explicit mask, causal for a global layer and
    ``sliding_window_mask`` for a local one, its sink logits and RoPE from the block's exported parameters; the
    position-wise parts (embeddings, LayerNorms, MLPs, head) by the model's own modules."""
    cfg = model.config
    length = idx.shape[1]
    with torch.no_grad():
        x = model.tok_emb(idx)
        if model.pos_emb is not None:
            x = x + model.pos_emb(torch.arange(length))
        weights = []
        for i, block in enumerate(model.blocks):
            window = cfg.window if (cfg.window is not None and (cfg.global_every is None
                                                                  or (i + 1) % cfg.global_every)) else None
            mask = (reference.causal_mask(length, length) if window is None
                    else reference.sliding_window_mask(length, length, window))
            out, w = reference.multi_head_attention(block.ln_1(x).numpy(), None, block.attn.export_params(),
                                                    cfg.n_heads, mask=mask, rope_base=cfg.rope_base)
            weights.append(w)
            x = x + torch.from_numpy(out)
            x = x + block.mlp(block.ln_2(x))
        return model.lm_head(model.ln_f(x)), weights


# ------------------------------------------------------------------------------------------------ the configuration
def test_defaults_build_the_old_model_exactly():
    """With the options at their defaults the model is the ModelConfig model: same parameters, same initialisation,
    same logits bit for bit."""
    plain = dict(vocab_size=13, block_size=16, n_layers=3, d_model=16, n_heads=4, n_kv_heads=2, bias=False)
    torch.manual_seed(3)
    old = TinyTransformer(TransformerConfig(**plain))
    torch.manual_seed(3)
    new = TinyTransformer(ModernTransformerConfig(**plain))
    assert list(old.state_dict()) == list(new.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(old.state_dict().values(), new.state_dict().values()))
    x = ids(2, 16)
    assert torch.equal(old(x)[0], new(x)[0])
    assert old.num_params() == new.num_params() and old.kv_cache_bytes(2, 16) == new.kv_cache_bytes(2, 16)
    assert new.windows == [None] * 3 and all(b.attn.sinks is None and b.attn.rope_base is None for b in new.blocks)


def test_new_settings_are_recorded_only_when_set():
    """Committed runs recorded no window, global_every, sinks, rope_base or sink_probe_batches: a configuration at
    their defaults records none of them (so it is still the text the committed rows hold), one that sets them
    records them, and from_dict rebuilds either."""
    default = ShakespeareRun()
    assert not set(NEW + ("sink_probe_batches",)) & set(default.to_dict())
    assert set(NEW + ("sink_probe_batches",)) <= set(ShakespeareRun.settings())
    later = NEW + ("sink_probe_batches", "patience")  # patience: the trainer's early stopping, added later too
    assert list(default.to_dict()) == [k for k in ShakespeareRun.settings() if k not in later]
    # the other studies have none of the attention settings; they share the trainer's later one
    assert list(TrainRun().to_dict()) == [k for k in TrainRun.settings() if k != "patience"]
    run = ShakespeareRun.from_dict(dict(n_layers=4, window=8, global_every=2, sinks=True, rope_base=10000,
                                        sink_probe_batches=3))
    recorded = run.to_dict()
    assert (recorded["window"], recorded["global_every"], recorded["sinks"], recorded["rope_base"],
            recorded["sink_probe_batches"]) == (8, 2, True, 10000.0, 3)
    assert isinstance(recorded["rope_base"], float) and run.window == run.model.window == 8
    assert ShakespeareRun.from_dict(recorded) == run and ShakespeareRun.from_dict(default.to_dict()) == default
    assert type(run.model) is ModernModelConfig and type(TrainRun().model) is ModelConfig
    # an explicit value equal to the default is the default: recorded as nothing, the same run
    assert ShakespeareRun.from_dict({"sinks": False, "window": None}).to_dict() == default.to_dict()


def test_every_committed_row_is_still_trusted():
    """The runner's own check (results.plan) on every committed sweep: no finished row is reported changed."""
    checked = 0
    for path in sorted(REPO.glob("experiments/*/*.yaml")):
        if path.parent.name == "gpu":
            continue
        sweep = load_sweep(path)
        folder = path.parent / sweep.name
        if not (folder / "results.csv").is_file():
            continue
        state = plan(sweep, Results(folder / "results.csv", folder / "runs" / ".lock"), sweep.runs())
        assert state["changed"] == [] and state["bad"] == [], path
        checked += len(state["finished"])
    assert checked >= 800


@pytest.mark.parametrize("values, error, pattern", [
    ({"global_every": 2}, ValueError, r"ShakespeareRun.global_every \(2\) needs a window"),
    ({"n_layers": 4, "window": 4, "global_every": 1}, ValueError, r"global_every must be between 2 and n_layers"),
    ({"n_layers": 2, "window": 4, "global_every": 3}, ValueError, r"global_every must be between 2 and n_layers"),
    ({"window": 0}, ValueError, r"ShakespeareRun.window must be an integer >= 1"),
    ({"rope_base": 0.0}, ValueError, r"ShakespeareRun.rope_base must be a finite real number > 0"),
    ({"d_model": 12, "n_heads": 4, "rope_base": 100.0}, ValueError, r"rope_base needs an even head size"),
    ({"sinks": 1}, TypeError, r"ShakespeareRun.sinks must be True or False"),
    ({"sink_probe_batches": -1}, ValueError, r"sink_probe_batches must be an integer >= 0"),
])
def test_bad_options_name_the_field(values, error, pattern):
    with pytest.raises(error, match=pattern):
        ShakespeareRun.from_dict(values)


def test_layer_patterns():
    """global_every = k makes layers k - 1, 2k - 1, ... global: gpt-oss's alternation (k = 2) and Gemma 3's five
    local layers per global one (k = 6)."""
    def pattern(n_layers, window, every):
        return ["G" if w is None else "L" for w in layer_windows(ModernModelConfig(n_layers=n_layers, window=window,
                                                                                   global_every=every))]
    assert pattern(4, 8, 2) == list("LGLG")
    assert pattern(12, 8, 6) == list("LLLLLGLLLLLG")
    assert pattern(3, 8, None) == list("LLL") and pattern(3, None, None) == list("GGG")
    assert layer_windows(ModelConfig(n_layers=2)) == [None, None]
    model = make(window=3, global_every=2)
    assert [b.attn.window for b in model.blocks] == [3, None, 3, None] == model.windows


# ------------------------------------------------------------------------------------------------------- the model
@pytest.mark.parametrize("options", [
    dict(window=3),
    dict(window=3, global_every=2),
    dict(window=5, global_every=2, sinks=True),
    dict(window=4, rope_base=10000.0),
    dict(window=2, global_every=4, rope_base=100.0, sinks=True, n_kv_heads=2),
    dict(sinks=True, rope_base=10000.0),
    dict(sinks=True, attn_impl="naive"),
])
def test_logits_and_weights_equal_the_reference_with_explicit_masks(options):
    model = make(**options)
    if model.blocks[0].attn.sinks is not None:  # sink logits away from their 0 start, so that they matter
        with torch.no_grad():
            for block in model.blocks:
                block.attn.sinks.copy_(torch.randn(block.attn.n_heads, dtype=F64))
    x = ids(3, 16)
    logits, _, weights = model(x, need_weights=True)
    expected, expected_weights = reference_forward(model, x)
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-10)
    torch.testing.assert_close(model(x)[0], expected, rtol=0, atol=1e-10)  # the fast path too (no weights)
    for w, e in zip(weights, expected_weights):
        np.testing.assert_allclose(w.detach().numpy(), e, atol=1e-12)


def test_receptive_field_of_local_and_global_stacks():
    """Changing token j changes the logits at i > j only when i - j <= n_layers (W - 1) in an all-local stack
    (book part IV, the reach of stacked windows), and at every i >= j once one layer is global."""
    W, n_layers, L = 3, 2, 16
    for options, reach in ((dict(window=W, n_layers=n_layers), n_layers * (W - 1)),
                           (dict(window=W, n_layers=n_layers, global_every=2), L)):
        model = make(**options, rope_base=10000.0)
        x = ids(1, L)
        changed = x.clone()
        changed[0, 0] = (changed[0, 0] + 1) % 13
        moved = (model(x)[0] - model(changed)[0]).abs().amax(dim=-1)[0]  # (L,)
        assert torch.all(moved[:reach + 1] > 1e-9) and torch.all(moved[reach + 1:] == 0)


@pytest.mark.parametrize("options", [dict(window=4, global_every=2, sinks=True, rope_base=10000.0),
                                     dict(window=3), dict(sinks=True)])
def test_decoding_through_the_caches_equals_the_full_forward(options):
    """Prefill then one token at a time (ring buffers for the local layers) gives the logits of one pass over the
    whole sequence."""
    model = make(**options)
    x = ids(2, 16)
    full = model(x)[0]
    caches = model.make_kv_caches(2)
    assert [c.window for c in caches] == model.windows
    steps = [model(x[:, :5], kv_caches=caches)[0]] + [model(x[:, t:t + 1], kv_caches=caches)[0] for t in range(5, 16)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-10)
    out = model.generate(x[:, :3], 20, greedy=True)  # past block_size: recomputation takes over
    assert out.shape == (2, 23)


def test_rope_model_has_no_position_table_and_counts_windowed_caches():
    model = make(window=4, global_every=2, rope_base=10000.0)
    assert model.pos_emb is None and model.num_params() == model.num_params(non_embedding=True)
    per_position = 2 * model.n_kv_heads * model.head_dim * 8  # K and V of one position in one layer, float64 here
    assert model.kv_cache_bytes(1, 16) == per_position * (2 * 16 + 2 * 4)  # 2 global layers, 2 local ones (W = 4)


# ------------------------------------------------------------------------------------------------------- the probe
@pytest.mark.parametrize("options", [dict(sinks=True, rope_base=10000.0), dict(), dict(window=4, global_every=2)])
def test_first_token_attention_equals_the_reference(options):
    model = make(**options)
    if model.blocks[0].attn.sinks is not None:
        with torch.no_grad():
            for block in model.blocks:
                block.attn.sinks.copy_(torch.linspace(-1, 2, block.attn.n_heads, dtype=F64))
    batches = [ids(3, 16, seed=s) for s in (1, 2)]
    got = first_token_attention(model, [(b, b) for b in batches], min_position=10)
    rows = [reference_forward(model, b)[1] for b in batches]  # per batch: n_layers x (N, h, L, L)
    first = np.stack([np.concatenate([r[layer][:, :, 10:, 0] for r in rows]).transpose(1, 0, 2).reshape(4, -1)
                      .mean(axis=1) for layer in range(4)])
    sink = np.stack([1 - np.concatenate([r[layer][:, :, 10:, :].sum(-1) for r in rows]).transpose(1, 0, 2)
                     .reshape(4, -1).mean(axis=1) for layer in range(4)])
    np.testing.assert_allclose(got["first_token"], first, atol=1e-12)
    assert got["queries"] == 2 * 3 * 6 and got["length"] == 16 and got["min_position"] == 10
    assert got["uniform"] == pytest.approx(np.mean([1 / (p + 1) for p in range(10, 16)]))
    # the distance-matched baseline, spelled out query by query: w[p, 0] against the tokens at distance p after it
    first_m, other_m = np.zeros((4, 4)), np.zeros((4, 4))
    for r in rows:
        for layer in range(4):
            for n in range(3):
                for p in range(10, 15):
                    first_m[layer] += r[layer][n, :, p, 0]
                    other_m[layer] += np.mean([r[layer][n, :, q, q - p] for q in range(p + 1, 16)], axis=0)
    np.testing.assert_allclose(got["first_token_matched"], first_m / (2 * 3 * 5), atol=1e-12)
    np.testing.assert_allclose(got["matched"], other_m / (2 * 3 * 5), atol=1e-12)
    # the within-row log-odds, spelled out: position 0 against its neighbour, and keys at distance p against theirs
    first_l, other_l = np.zeros((4, 4)), np.zeros((4, 4))
    for r in rows if not options.get("window") else ():  # with a window some weights are 0: no log-odds
        for layer in range(4):
            a = r[layer]
            for n in range(3):
                for p in range(10, 15):
                    first_l[layer] += np.log(a[n, :, p, 0]) - np.log(a[n, :, p, 1])
                    other_l[layer] += np.mean([np.log(a[n, :, q, q - p]) - np.log(a[n, :, q, q - p + 1])
                                               for q in range(p + 1, 16)], axis=0)
    # the placebo, spelled out: anchor j in position 0's role for the same queries p, at distances p - j and p - j - 1
    anchors = (1, 3, 9)
    placebo = first_token_attention(model, batches, min_position=10, anchors=anchors)
    anchor_l, anchor_m = np.zeros((3, 4, 4)), np.zeros((3, 4, 4))
    for r in rows if not options.get("window") else ():
        for layer in range(4):
            a = r[layer]
            for k, j in enumerate(anchors):
                for n in range(3):
                    for p in range(10, 15):
                        d = p - j
                        anchor_l[k, layer] += np.log(a[n, :, p, j]) - np.log(a[n, :, p, j + 1])
                        anchor_m[k, layer] += np.mean([np.log(a[n, :, q, q - d]) - np.log(a[n, :, q, q - d + 1])
                                                       for q in range(p + 1, 16)], axis=0)
    if options.get("window"):  # position 0 is outside the local layers' windows: no log-odds
        assert got["first_token_logodds"] is None and got["matched_logodds"] is None
        assert placebo["anchor_logodds"] is None and placebo["anchor_matched_logodds"] is None
    else:
        np.testing.assert_allclose(got["first_token_logodds"], first_l / (2 * 3 * 5), atol=1e-9)
        np.testing.assert_allclose(got["matched_logodds"], other_l / (2 * 3 * 5), atol=1e-9)
        assert placebo["anchors"] == [1, 3, 9]
        np.testing.assert_allclose(placebo["anchor_logodds"], anchor_l / (2 * 3 * 5), atol=1e-9)
        np.testing.assert_allclose(placebo["anchor_matched_logodds"], anchor_m / (2 * 3 * 5), atol=1e-9)
        # the placebo's anchors change nothing else the probe returns
        assert {k: v for k, v in placebo.items() if not k.startswith("anchor")} == \
            {k: v for k, v in got.items() if not k.startswith("anchor")}
    assert got["anchors"] == [1, 2, 4, 8]  # the default anchors below min_position
    assert first_token_attention(model, batches, min_position=15)["matched"] is None  # no later query: no baseline
    if options.get("sinks"):
        np.testing.assert_allclose(got["sink"], sink, atol=1e-12)
        np.testing.assert_allclose(got["sink_logits"], [np.linspace(-1, 2, 4)] * 4, atol=1e-12)
        assert np.all(np.array(got["sink"]) > 0)
    else:
        assert got["sink"] is None and got["sink_logits"] is None
        np.testing.assert_allclose(sink, 0, atol=1e-12)
    if options.get("window"):  # position 0 is outside every local layer's window from position 4 on
        assert np.all(np.array(got["first_token"])[[0, 2]] == 0)
    assert first_token_attention(model, batches)["min_position"] == 8  # the second half by default
    with pytest.raises(ValueError, match="min_position"):
        first_token_attention(model, batches, min_position=16)
    with pytest.raises(ValueError, match="anchors"):  # an anchor must leave a key between it and the first query
        first_token_attention(model, batches, min_position=10, anchors=(10,))
    with pytest.raises(ValueError, match="anchors"):  # position 0 is the statistic itself, not a placebo
        first_token_attention(model, batches, min_position=10, anchors=(0,))
    with pytest.raises(TypeError, match="anchors"):
        first_token_attention(model, batches, min_position=10, anchors=8)


def test_shakespeare_run_with_the_options_and_the_probe(tmp_path):
    try:
        config = ShakespeareRun.from_dict(dict(n_layers=2, d_model=16, block_size=16, steps=3, eval_interval=3,
                                               warmup_steps=1, final_eval_batches=2, sample_chars=5, window=4,
                                               global_every=2, sinks=True, rope_base=10000.0, sink_probe_batches=2))
        from mha.experiments.studies import run_shakespeare

        run = run_shakespeare(config, out_dir=tmp_path / "runs" / "s")
    except FileNotFoundError:
        pytest.skip("Tiny Shakespeare not available (set MHA_DATA_DIR)")
    metrics = run["metrics"]
    saved = json.loads((tmp_path / "artifacts" / "s" / "sinks.json").read_text())
    assert np.array(saved["first_token"]).shape == (2, 2) and np.array(saved["sink"]).shape == (2, 2)
    assert metrics["first_token_mass_max"] == pytest.approx(np.max(saved["first_token"]))
    assert metrics["sink_probability_mean"] == pytest.approx(np.mean(saved["sink"]))
    assert metrics["config"]["window"] == 4 and run["model"].windows == [4, None]


# ---------------------------------------------------------------------------------------------- the paired interval
def _p_brute(d, delta):
    e = np.asarray(d) - delta
    flips = np.array(list(itertools.product((1.0, -1.0), repeat=e.size)))
    return np.mean(np.abs(flips @ e) >= abs(e.sum()) - 1e-12)


@pytest.mark.parametrize("seed, n", [(0, 6), (1, 8), (2, 7), (3, 10)])
def test_sign_flip_interval_inverts_the_exact_test(seed, n):
    """The interval holds the shifts delta whose exact sign-flip test of d - delta does not reject: checked on a fine
    grid; the p-value is the package's (stats.paired_difference); 'real' is p <= 1 - confidence."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(0.3, 1, n), rng.normal(0, 1, n)
    got = stats.paired_difference(a, b)
    d = a - b
    assert got["mean"] == pytest.approx(d.mean()) and got["n"] == n
    assert got["p_value"] == pytest.approx(stats.paired_difference(a, b)["p_value"])
    grid = np.linspace(d.min() - 1, d.max() + 1, 4001)
    step = grid[1] - grid[0]
    accepted = grid[[_p_brute(d, delta) > 0.05 for delta in grid]]
    assert abs(accepted.min() - got["low"]) <= step and abs(accepted.max() - got["high"]) <= step
    assert got["real"] == (got["p_value"] <= 0.05) == (got["low"] > 0 or got["high"] < 0)


def test_sign_flip_interval_at_five_seeds_is_unbounded_and_covers():
    """At n = 5 the smallest p-value is 2/32 > 0.05: the interval is the whole line, never 'real'. At n = 8 normal
    differences are covered at least at the nominal rate (an exact test), in a simulation."""
    got = stats.paired_difference([1, 2, 3, 4, 5], [0, 0, 0, 0, 0])
    assert got["low"] == -np.inf and got["high"] == np.inf and not got["real"] and got["p_value"] == 0.0625
    rng = np.random.default_rng(0)
    covered = [(lambda r: r["low"] <= 0.5 <= r["high"])(stats.paired_difference(rng.normal(0.5, 1, 8), np.zeros(8)))
               for _ in range(300)]
    assert 0.93 <= np.mean(covered) <= 0.995
    with pytest.raises(ValueError, match="pair one to one"):
        stats.paired_difference([1, 2, 3], [1, 2])


def _max_t_by_loops(diffs):
    """Westfall-Young max-T written out pattern by pattern, with the statistic |mean| / rms: an independent spelling
    of analysis.max_t_adjusted (whose |s . d| / ||d|| is the same statistic times sqrt(n))."""
    names = list(diffs)
    n = len(diffs[names[0]])
    stats_by_pattern = []
    for signs in itertools.product((1, -1), repeat=n):
        row = {}
        for name in names:
            d = diffs[name]
            row[name] = abs(sum(s * x for s, x in zip(signs, d)) / n) / (sum(x * x for x in d) / n) ** 0.5
        stats_by_pattern.append(row)
    observed = stats_by_pattern[0]  # all signs +1
    out = {}
    for name in names:
        t = observed[name] * (1 - 1e-12)
        raw = sum(row[name] >= t for row in stats_by_pattern) / len(stats_by_pattern)
        adjusted = sum(max(row.values()) >= t for row in stats_by_pattern) / len(stats_by_pattern)
        out[name] = {"raw": raw, "adjusted": adjusted}
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_max_t_adjusted_against_loops_and_the_sign_flip_test(seed):
    rng = np.random.default_rng(seed)
    base = rng.standard_normal(6)
    diffs = {"a": base + 0.8, "b": 0.9 * base + rng.standard_normal(6) * 0.3 + 0.2, "c": rng.standard_normal(6)}
    got = stats.max_t_adjusted(diffs)
    expected = _max_t_by_loops({k: list(v) for k, v in diffs.items()})
    for name in diffs:
        assert got[name]["raw"] == pytest.approx(expected[name]["raw"], abs=1e-12)
        assert got[name]["adjusted"] == pytest.approx(expected[name]["adjusted"], abs=1e-12)
        assert got[name]["raw"] <= got[name]["adjusted"]  # a family never lowers a p-value
        # the raw p is the test's own exact sign-flip p
        assert got[name]["raw"] == pytest.approx(stats.paired_difference(diffs[name], np.zeros(6))["p_value"])
    one = stats.max_t_adjusted({"a": diffs["a"]})  # a family of one: nothing to adjust
    assert one["a"]["adjusted"] == one["a"]["raw"]
    with pytest.raises(ValueError, match="same number of paired differences"):
        stats.max_t_adjusted({"a": np.ones(6), "b": np.ones(5)})
