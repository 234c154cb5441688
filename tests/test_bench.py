"""Tests for mha.experiments.bench: the timer's bookkeeping (mha.experiments.timing, with a fake clock), the memory
and backend probes, the contenders' equivalence, the machine's record, and one seconds-long ``--quick`` smoke run of
the CLI (its JSON schema). No test asserts a time."""

import json
import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mha.attention import MultiHeadAttention
from mha.convert import copy_to_torch_mha
from mha.experiments.bench import (SECTIONS, ScriptedClock, TorchTransformer, compare, peak_memory_bytes,
                                   sdpa_backend_used, sdpa_backends_runnable)
from mha.experiments.machine import machine_info, machine_record
from mha.experiments.model import TinyTransformer, TransformerConfig, expand_kv_heads
from mha.experiments.timing import TimingConfig, paired_times, ratio_summary, summary

torch.set_num_threads(1)


class FakeClock(ScriptedClock):
    """The package's scripted clock with the contender's name first (as these tests were written)."""

    def contender(self, name, costs):
        return super().contender(costs, name)


def test_compare_alternates_and_reports_median_per_pair_ratio():
    clock = FakeClock()
    # warmup (1 call each), then 5 timed pairs; b always costs 1, a drifts: per-pair ratios 2, 4, 3, 10, 1
    fn_a = clock.contender("a", [7.0, 2.0, 4.0, 3.0, 10.0, 1.0])
    fn_b = clock.contender("b", [1.0] * 6)
    result = compare(fn_a, fn_b, repeats=5, warmup=1, clock=clock)
    assert clock.log == ["a", "b", "a", "b", "b", "a", "a", "b", "b", "a", "a", "b"]  # warmup, then alternated
    assert result["pairs_a_s"] == [2.0, 4.0, 3.0, 10.0, 1.0] and result["pairs_b_s"] == [1.0] * 5
    assert result["ratio"] == 3.0  # median of the per-pair ratios, not a ratio of medians or means
    assert result["ratio_q1"] == 2.0 and result["ratio_q3"] == 4.0 and result["ratio_iqr"] == 2.0
    assert result["a_s"] == 3.0 and result["b_s"] == 1.0
    assert result["calls_a"] == result["calls_b"] == 1 and result["repeats"] == 5 and result["warmup"] == 1


def test_compare_per_pair_ratio_differs_from_ratio_of_medians():
    clock = FakeClock()
    # timed pairs (1, 1), (2, 4), (9, 3): per-pair ratios 1, 0.5, 3 -> median 1; the ratio of medians is 2 / 3
    fn_a = clock.contender("a", [1.0, 1.0, 2.0, 9.0])
    fn_b = clock.contender("b", [1.0, 1.0, 4.0, 3.0])
    result = compare(fn_a, fn_b, repeats=3, warmup=1, clock=clock)
    assert result["ratio"] == 1.0
    assert result["a_s"] / result["b_s"] == pytest.approx(2 / 3)


def test_compare_batches_short_calls_to_min_time():
    clock = FakeClock()
    fn_a = clock.contender("a", [0.01] * 100)
    fn_b = clock.contender("b", [0.05] * 100)  # the slower: 0.1 / 0.05 = 2 calls per timing, for both
    result = compare(fn_a, fn_b, repeats=2, warmup=1, min_time_s=0.1, clock=clock)
    assert result["calls_a"] == result["calls_b"] == 2
    assert clock.log.count("a") == clock.log.count("b") == 1 + 2 * 2
    assert result["a_s"] == pytest.approx(0.01) and result["b_s"] == pytest.approx(0.05)  # per call
    assert result["ratio"] == pytest.approx(0.2)


@pytest.mark.parametrize("kwargs, error", [(dict(repeats=0), ValueError), (dict(warmup=0), ValueError),
                                           (dict(repeats=2.5), TypeError), (dict(min_time_s=-1), ValueError)])
def test_compare_rejects_bad_arguments(kwargs, error):
    args = dict(repeats=2, warmup=1) | kwargs
    with pytest.raises(error, match=next(iter(kwargs))):
        compare(lambda: None, lambda: None, **args)


def test_paired_times_rotates_the_order_of_three_contenders():
    clock = FakeClock()
    fns = {name: clock.contender(name, [1.0] * 5) for name in "abc"}
    result = paired_times(fns, repeats=4, warmup=1, clock=clock)
    assert clock.log == list("abc" "abc" "bca" "cab" "abc")  # warmup, then each round starts one later
    assert result["calls"] == 1 and result["times"] == {name: [1.0] * 4 for name in "abc"}
    with pytest.raises(ValueError, match="at least one contender"):
        paired_times({}, repeats=1)


def test_summary_and_ratio_summary_are_medians_and_quartiles():
    assert summary([4.0, 1.0, 3.0, 2.0, 5.0]) == dict(median=3.0, q1=2.0, q3=4.0, iqr=2.0)
    assert ratio_summary([2.0, 8.0, 3.0], [1.0, 2.0, 3.0])["median"] == 2.0  # per-pair ratios 2, 4, 1
    with pytest.raises(ValueError):
        ratio_summary([1.0, 2.0], [1.0])  # unpaired lists are an error, not a silent truncation


def test_bench_config_takes_the_timer_settings_from_timing_config():
    from mha.experiments.bench import QUICK, BenchConfig
    assert isinstance(QUICK, TimingConfig) and BenchConfig().timing_kwargs() == TimingConfig().timing_kwargs()
    assert list(BenchConfig.__dataclass_fields__)[:3] == ["repeats", "warmup", "min_time_s"]  # the JSON's order
    for kwargs, error in [(dict(repeats=0), ValueError), (dict(warmup=1.5), TypeError),
                          (dict(min_time_s=-1), ValueError)]:
        with pytest.raises(error, match=next(iter(kwargs))):
            BenchConfig(**kwargs)


def test_machine_record_holds_machine_info_under_the_benchmark_names():
    cpu = torch.device("cpu")
    info, record = machine_info(cpu), machine_record(cpu)
    assert (record["type"], record["name"], record["cpu"], record["cpu_id"]) == (
        info["device"], info["device_name"], info["cpu_model"], info["cpu_id"])
    assert record["num_threads"] == torch.get_num_threads() and record["torch_version"] == torch.__version__
    assert record["cpu_count"] >= 1 and record["cuda"] is None and record["slug"].startswith("cpu-")


def test_peak_memory_bytes_counts_simultaneous_allocations():
    size = 1_000_000  # float32 elements: 4 MB each

    def two_at_once():
        a = torch.empty(size)
        b = torch.empty(size)
        del a, b
        c = torch.empty(size)  # after a and b are freed: does not raise the peak
        return c.shape

    peak = peak_memory_bytes(two_at_once, "cpu")
    assert peak is not None
    assert 2 * 4 * size <= peak < 2 * 4 * size + 65536
    assert peak_memory_bytes(lambda: None, "cpu") == 0


def test_sdpa_backend_probes_on_cpu():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q = torch.randn(1, 2, 8, 4)

    def attend():
        return F.scaled_dot_product_attention(q, q, q)

    with sdpa_kernel([SDPBackend.MATH]):
        assert sdpa_backend_used(attend) == "math"
    assert sdpa_backend_used(lambda: q @ q.transpose(-1, -2)) is None
    runnable = sdpa_backends_runnable(attend)
    assert "math" in runnable and "efficient" not in runnable and "cudnn" not in runnable  # CUDA-only kernels


def test_copy_to_torch_mha_gives_the_same_function():
    torch.manual_seed(0)
    ours = MultiHeadAttention(16, 4)
    theirs = nn.MultiheadAttention(16, 4, batch_first=True)
    copy_to_torch_mha(ours, theirs)
    x = torch.randn(2, 5, 16)
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    torch.testing.assert_close(ours(x, is_causal=True)[0], theirs(x, x, x, attn_mask=causal)[0])


def test_torch_transformer_matches_tiny_transformer():
    torch.manual_seed(0)
    tiny = TinyTransformer(TransformerConfig(vocab_size=11, block_size=9, n_layers=2, d_model=16, n_heads=4))
    theirs = TorchTransformer.from_tiny(tiny)
    idx = torch.randint(11, (3, 9))
    targets = torch.randint(11, (3, 9))
    logits, loss, _ = tiny(idx, targets)
    logits_theirs, loss_theirs = theirs(idx, targets)
    torch.testing.assert_close(logits, logits_theirs)
    torch.testing.assert_close(loss, loss_theirs)
    # causal: changing the last token changes no earlier logit in the torch model
    changed = idx.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 11
    torch.testing.assert_close(theirs(changed)[0][:, :-1], logits_theirs[:, :-1])
    with pytest.raises(ValueError, match="n_kv_heads"):
        TorchTransformer(TransformerConfig(n_heads=4, n_kv_heads=2))


@pytest.mark.parametrize("n_kv_heads", [1, 2])
def test_expand_kv_heads_copies_each_group_and_keeps_the_function(n_kv_heads):
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=11, block_size=8, n_layers=2, d_model=16, n_heads=4, n_kv_heads=n_kv_heads)
    grouped = TinyTransformer(config)
    expanded = expand_kv_heads(grouped)
    assert expanded.n_kv_heads == 4 and expanded.blocks[0].attn.k_proj.weight.shape == (16, 16)
    hd, r = 4, 4 // n_kv_heads
    for block_g, block_e in zip(grouped.blocks, expanded.blocks):
        for name in ("k_proj", "v_proj"):
            w_g, w_e = getattr(block_g.attn, name).weight, getattr(block_e.attn, name).weight
            for j in range(4):  # query head j reads key/value head j // (h / g)
                torch.testing.assert_close(w_e[j * hd:(j + 1) * hd], w_g[(j // r) * hd:(j // r + 1) * hd])
    idx = torch.randint(11, (2, 8))
    torch.testing.assert_close(grouped(idx)[0], expanded(idx)[0])


def test_quick_cli_writes_the_json_schema(tmp_path):
    out = tmp_path / "bench.json"
    run = subprocess.run([sys.executable, "-m", "mha.bench", "--quick", "--no-progress", "--threads", "1",
                          "--out", str(out), "--note", "smoke"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    for key in ("device", "torch_version", "num_threads", "date", "git_commit", "config", "sections", "note"):
        assert key in result
    assert result["quick"] is True and result["note"] == "smoke" and result["num_threads"] == 1
    assert result["device"]["type"] in ("cpu", "cuda") and result["device"]["name"]
    assert result["torch_version"] == torch.__version__ and result["config"]["repeats"] == 2
    assert result["device"]["torch_version"] == result["torch_version"] and result["device"]["num_threads"] == 1
    assert set(result["sections"]) == set(SECTIONS) and result["complete"] is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json"]  # the partial file is gone

    def check(point, same_function=True):
        if same_function:  # the gflops section's contenders (attention, a matmul) compute different things
            assert point["outputs_match"] is True and point["max_abs_diff"] >= 0, point
        assert point["repeats"] == 2 and len(point["pairs_a_s"]) == len(point["pairs_b_s"]) == 2
        for key in ("ratio", "ratio_q1", "ratio_q3", "a_s", "b_s"):
            assert math.isfinite(point[key]) and point[key] > 0, (key, point)
        assert point["ratio_q1"] <= point["ratio"] <= point["ratio_q3"]

    sections = result["sections"]
    n_attention = len(result["config"]["d_models"]) * len(result["config"]["seq_lens"]) * 4
    assert len(sections["attention"]["points"]) == n_attention
    for point in sections["attention"]["points"]:
        check(point)
        assert isinstance(point["target_met"], bool) and point["sdpa_backend"]
    for point in sections["naive"]["points"]:
        check(point)
        assert point["peak_bytes_naive"] > 0 and point["peak_bytes_sdpa"] > 0
    decode = sections["decode"]
    for point in decode["cache_vs_recompute"]["points"] + decode["grouped_vs_mha"]["points"]:
        check(point)
    for point in decode["grouped_vs_mha"]["points"]:
        assert point["cache_bytes"] * (result["config"]["n_heads"] // point["n_kv_heads"]) == point["cache_bytes_mha"]
    (train,) = sections["train"]["points"]
    check(train)
    assert math.isfinite(train["throughput_ratio"]) and train["throughput_ratio"] > 0
    for point in sections["gflops"]["points"]:
        check(point, same_function=False)
        assert 0 < point["fraction"] and math.isfinite(point["fraction"])


def test_run_rejects_unknown_sections_and_names_the_device():
    from mha.experiments.bench import QUICK, device_info, run
    with pytest.raises(ValueError, match="unknown sections \\['attn'\\]"):
        run(QUICK, sections=["attn"], device="cpu", progress=False)
    info = device_info(torch.device("cpu"))
    assert info == machine_record(torch.device("cpu"))  # the one record of the machine
    assert info["type"] == "cpu" and info["name"] and info["slug"].startswith("cpu-")
    assert set(info["slug"]) <= set("abcdefghijklmnopqrstuvwxyz0123456789-")


def test_sections_are_kept_as_they_finish():
    """run() hands the results so far to on_section after each section but the last (a run cut short keeps them);
    the command line writes them to <out>.partial.json, never over a complete file."""
    from mha.experiments.bench import QUICK, run

    seen = []
    result = run(QUICK, sections=["train", "decode"], device="cpu", progress=False,
                 on_section=lambda partial: seen.append(json.loads(json.dumps(partial))))
    assert [(list(p["sections"]), p["complete"]) for p in seen] == [(["train"], False)]
    assert seen[0]["sections"]["train"]["points"][0]["tokens_per_step"] == (
        result["sections"]["train"]["points"][0]["tokens_per_step"])
    assert list(result["sections"]) == ["train", "decode"] and result["complete"] is True
    with pytest.raises(TypeError, match="on_section must be a function"):
        run(QUICK, sections=["train"], device="cpu", progress=False, on_section="bench.json")


def test_equal_cache_section_builds_the_trained_models_and_checks_each_step():
    """The equal_cache section's variants are the models the latent_gated sweeps trained: their parameter counts
    equal those the training runs recorded (experiments/latent_gated/*/results.csv, and the full-attention runs of
    attention-sinks.yaml), their caches hold what the architecture says per position and layer (2 g head_dim for
    g key/value heads; kv_rank + the shared rotary key for MLA), and each cached step equals recomputing the prefix."""
    import csv
    from pathlib import Path

    from mha.experiments.bench import QUICK, section_equal_cache
    from mha.experiments.bench_cache import EqualCacheShapes

    root = Path(__file__).resolve().parents[1] / "experiments"

    def recorded(path, **where):  # the params column of the runs matching ``where`` (all equal)
        with open(root / path) as f:
            values = {row["params"] for row in csv.DictReader(f) if all(row[k] == v for k, v in where.items())}
        assert len(values) == 1, (path, where, values)
        return int(values.pop())

    mha_params = recorded("windows_sinks/attention-sinks/results.csv", sinks="")
    trained = {"MHA": mha_params, "MHA (unfused)": mha_params,
               "GQA (2 key/value heads)": recorded("latent_gated/kv-sharing/results.csv", n_kv_heads="2"),
               "MQA": recorded("latent_gated/kv-sharing/results.csv", n_kv_heads="1"),
               "MLA (kv_rank 56)": recorded("latent_gated/latent/results.csv", kv_rank="56"),
               "MLA (kv_rank 24)": recorded("latent_gated/latent/results.csv", kv_rank="24")}
    shapes = EqualCacheShapes()
    head_dim = shapes.d_model // shapes.n_heads
    numbers = {"MHA": 2 * shapes.n_heads * head_dim, "MHA (unfused)": 2 * shapes.n_heads * head_dim,
               "GQA (2 key/value heads)": 2 * 2 * head_dim,
               "MQA": 2 * 1 * head_dim, "MLA (kv_rank 56)": 56 + shapes.qk_rope_head_dim,
               "MLA (kv_rank 24)": 24 + shapes.qk_rope_head_dim}
    result = section_equal_cache(QUICK, torch.device("cpu"), progress=False)
    assert [(p["batch"], p["context"]) for p in result["points"]] == [tuple(p) for p in QUICK.equal_cache_points]
    for point in result["points"]:
        assert set(point["variants"]) == set(trained)
        for name, variant in point["variants"].items():
            assert variant["outputs_match"], (name, point["context"], variant["max_abs_diff"])
            assert variant["params"] == trained[name], name
            assert variant["cache_numbers_per_position_layer"] == numbers[name], name
            assert len(variant["times_s"]) == QUICK.repeats and all(t > 0 for t in variant["times_s"])


def test_benchmark_runs_and_gpu_kernel_runs_select_what_their_files_say(tmp_path, monkeypatch):
    """The chapters' loaders, on a folder of hand-written runs: --quick left out, file names kept, and only a kernel
    section compiled on CUDA counts as a GPU kernel run."""
    import json as json_module

    from mha.experiments.results import benchmark_runs, gpu_kernel_runs

    folder = tmp_path / "experiments" / "benchmarks"
    folder.mkdir(parents=True)
    (tmp_path / "experiments" / "notebooks").mkdir()
    compiled = {"device": {"interpreted": False}, "rows": [{"seq_len": 128}]}
    files = {
        "a-cpu.json": {"device": {"type": "cpu"}, "sections": {"kernels": dict(compiled, device={"interpreted": True})}},
        "b-gpu.json": {"device": {"type": "cuda"}, "sections": {"kernels": compiled}},
        "c-gpu-quick.json": {"device": {"type": "cuda"}, "quick": True, "sections": {"kernels": compiled}},
        "d-gpu-no-kernels.json": {"device": {"type": "cuda"}, "sections": {"attention": {}}},
        "e-gpu-interpreted.json": {"device": {"type": "cuda"},
                                   "sections": {"kernels": dict(compiled, device={"interpreted": True})}},
    }
    for name, run in files.items():
        (folder / name).write_text(json_module.dumps(run))
    monkeypatch.delenv("MHA_EXPERIMENTS_DIR", raising=False)
    runs = benchmark_runs(tmp_path)
    assert [run["file"] for run in runs] == ["a-cpu.json", "b-gpu.json", "d-gpu-no-kernels.json",
                                             "e-gpu-interpreted.json"]
    gpu = gpu_kernel_runs(runs)
    assert [run["file"] for run in gpu] == ["b-gpu.json"] and gpu[0]["kernels"] == compiled
