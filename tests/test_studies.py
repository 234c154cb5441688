"""mha.experiments.studies and .probes: each study computed directly, compared with independent computations (a
plain training run, the definitions of the probes), and the files it writes; and the results lookup."""

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mha.experiments import results
from mha.experiments.config import DynamicsRun, HeadsRun, ShakespeareRun, TrainRun
from mha.experiments.machine import cpu_model
from mha.experiments.probes import count_spikes, split_losses
from mha.experiments.analysis import top_key_score
from mha.experiments.studies import run_dynamics, run_heads, run_shakespeare, run_study, run_train
from mha.experiments.train import train

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[1]


def test_run_train_writes_its_metrics_and_records_the_machine(tmp_path):
    config = TrainRun.from_dict(dict(steps=6, eval_interval=3, warmup_steps=1, measure_decode=True, decode_len=16))
    run = run_train(config, out_dir=tmp_path / "runs" / "abc")
    metrics = run["metrics"]
    written = json.loads((tmp_path / "runs" / "abc" / "metrics.json").read_text())
    assert written["val_loss"] == metrics["val_loss"] and written["params"] == metrics["params"]
    assert metrics["device_name"] == cpu_model() and metrics["num_threads"] == 1 and metrics["threads"] == 1
    assert metrics["decode_s_per_token"] > 0 and metrics["decode_kv_cache_bytes"] == 2 * 16 * 1 * 4 * 8 * 4
    # the same training as the trainer alone
    plain = train(config.model_config(run["task"]), config.make_task(), config.train, progress=False)
    assert plain["val_loss"] == metrics["val_loss"] and plain["history"] == metrics["history"]
    kept = json.loads((tmp_path / "artifacts" / "abc" / "history.json").read_text())  # the history, rounded
    assert [r["step"] for r in kept] == [3, 6]
    assert [r["val_loss"] for r in kept] == pytest.approx([r["val_loss"] for r in plain["history"]], rel=1e-3)
    assert run_study("train", {"steps": 6, "eval_interval": 3, "warmup_steps": 1})["val_loss"] == metrics["val_loss"]


@pytest.fixture(scope="module")
def dynamics(tmp_path_factory):
    out = tmp_path_factory.mktemp("dyn") / "runs" / "r1"
    config = DynamicsRun.from_dict(dict(
        task="induction_varying", task_kwargs={"vocab_size": 16, "seq_len": 6, "min_period": 4}, n_layers=2,
        d_model=16, n_heads=2, steps=12, eval_interval=4, warmup_steps=2, batch_size=8, spike_window=3,
        save_attention=True))
    return config, out, run_dynamics(config, out_dir=out)


def test_dynamics_probes_do_not_change_training(dynamics):
    """The hooks only observe: the final loss equals a plain run's, and each interval's train_loss is the mean of
    the step losses the probe saw."""
    config, _, run = dynamics
    task = config.make_task()
    plain = train(config.model_config(task), task, config.train, progress=False)
    assert run["metrics"]["val_loss"] == plain["val_loss"]
    history = run["history"]
    assert [h["step"] for h in history] == [0, 4, 8, 12] and history[0]["train_loss"] is None
    assert len(run["grad_norms"]) == 12 and run["metrics"]["steps_done"] == 12
    assert history[2]["train_loss"] == statistics.fmean(run["step_losses"][4:8])  # Python floats, one by one
    assert history[2]["grad_norm_max"] == max(run["grad_norms"][4:8])


def test_dynamics_records_probes_and_artifacts(dynamics):
    config, out, run = dynamics
    history, metrics = run["history"], run["metrics"]
    for record in history:
        assert len(record["layers"]) == 2 and {"loss_first", "loss_repeat", "acc_first", "acc_repeat"} <= set(record)
        for layer in record["layers"]:
            assert len(layer["induction"]) == 2 and len(layer["previous_token"]) == 2
            assert 0 <= layer["entropy"] <= 1 + 1e-6 and layer["score_std"] > 0
    assert history[1]["grad_norm_max"] >= history[1]["grad_norm_mean"] > 0 and history[0]["grad_norm_max"] is None
    assert metrics["score_std_init"] == max(layer["score_std"] for layer in history[0]["layers"])
    artifacts = out.parent.parent / "artifacts" / "r1"
    assert sorted(p.name for p in artifacts.iterdir()) == ["ablations.json", "attention.json", "history.json"]
    ablations = json.loads((artifacts / "ablations.json").read_text())
    zero = ["none", "L0H0", "L0H1", "L0", "L1H0", "L1H1", "L1"]  # first, under the names they always had
    sets = [name for name in ("induction", "previous_token") if metrics[f"n_{name}_heads"]]
    assert [a["ablated"] for a in ablations] == zero + sets + [f"mean:{name}" for name in zero[1:] + sets]
    n_zero, n_mean = len(zero) + len(sets), len(zero) - 1 + len(sets)
    assert [a["ablation"] for a in ablations] == ["zero"] * n_zero + ["mean"] * n_mean
    assert json.loads((artifacts / "attention.json").read_text())["period"] == 4
    assert json.loads((out / "metrics.json").read_text())["loss_repeat"] == metrics["loss_repeat"]


def test_split_losses_against_the_definition():
    """Loss and accuracy on each half, pooled over positions, recomputed position by position."""
    torch.manual_seed(0)
    from mha.experiments.model import TinyTransformer, TransformerConfig

    model = TinyTransformer(TransformerConfig(vocab_size=7, block_size=6, n_layers=1, d_model=8, n_heads=2))
    x, y = torch.randint(7, (3, 6)), torch.randint(7, (3, 6))
    rep = torch.arange(6)[None, :].expand(3, -1) >= torch.tensor([[2], [3], [5]])
    got = split_losses(model, [(x, y, rep)])
    logits = model.eval()(x)[0]
    first, repeat = [], []
    for i in range(3):
        for t in range(6):
            loss = F.cross_entropy(logits[i, t][None], y[i, t][None]).item()
            correct = float(logits[i, t].argmax() == y[i, t])
            (repeat if rep[i, t] else first).append((loss, correct))
    assert got["loss_first"] == pytest.approx(statistics.fmean(l for l, _ in first), rel=1e-6)
    assert got["acc_repeat"] == pytest.approx(statistics.fmean(c for _, c in repeat))


def test_count_spikes():
    losses = [1.0, 1.1, 0.9, 1.0, 1.05, 5.0, 1.0, 0.95]
    # window 4: step 5's 5.0 is far above the previous four (mean 1.0125, std ~0.074); nothing else is
    assert count_spikes(losses, start=0, window=4, sigmas=5.0) == 1
    assert count_spikes(losses, start=6, window=4, sigmas=5.0) == 0


def test_run_heads_details(tmp_path):
    config = HeadsRun.from_dict(dict(task_kwargs={"vocab_size": 8, "seq_len": 5}, d_model=16, n_heads=2, steps=6,
                                     eval_interval=3, warmup_steps=1, analysis_batch_size=4, random_orders=1))
    run = run_heads(config, out_dir=tmp_path / "runs" / "h")
    details, metrics = run["details"], run["metrics"]
    assert np.array(details["js"]).shape == (2, 2, 2) and len(details["classes"]) == 2
    assert metrics["overlap_random"] == 8 / 16 and metrics["n_other"] + metrics["n_induction"] + metrics[
        "n_previous_token"] + metrics["n_diffuse"] + metrics["n_positional"] == 4
    with np.load(tmp_path / "artifacts" / "h" / "attention.npz") as saved:
        np.testing.assert_allclose(saved["example"], np.stack([w[0] for w in run["weights"]]), atol=1e-3)
    # The follow-up's records: the raw importance normalised per layer is the normalised importance; the selective
    # classes differ from the committed ones only where a head became "selective"; the top-3 score is recomputed
    # from the returned weights.
    raw, normalised = np.array(details["importance_raw"]), np.array(details["importance"])
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), normalised, rtol=1e-10)
    assert np.all(np.abs(details["derivative"]) <= raw + 1e-12)  # |E[d]| <= E|d|
    for old, new in zip(sum(details["classes"], []), sum(details["classes_selective"], [])):
        assert new == old or new == "selective"
    np.testing.assert_allclose([s["top3"] for s in details["scores"]],
                               [top_key_score(w, 3) for w in run["weights"]], rtol=1e-12)
    for curve in ("prune_raw", "prune_ablation"):
        assert [p["n_pruned"] for p in details[curve]] == [p["n_pruned"] for p in details["prune_importance"]]
    assert 0 <= metrics["prunable_raw"] <= 1 and 0 <= metrics["prunable_ablation"] <= 1


def test_run_shakespeare(tmp_path):
    try:
        config = ShakespeareRun.from_dict(dict(steps=4, eval_interval=2, warmup_steps=1, final_eval_batches=2,
                                               sample_chars=10))
        run = run_shakespeare(config, out_dir=tmp_path / "runs" / "s")
    except FileNotFoundError:
        pytest.skip("Tiny Shakespeare not available (set MHA_DATA_DIR)")
    metrics = run["metrics"]
    assert len(run["samples"]["greedy"]) == 10 and math.isfinite(metrics["val_loss_final"])
    saved = json.loads((tmp_path / "artifacts" / "s" / "samples.json").read_text())
    assert saved["greedy"] == run["samples"]["greedy"] and saved["history"] == metrics["history"]


def test_results_lookup_finds_every_committed_sweep():
    names = results.sweep_names(REPO)
    assert {"head-count", "gqa", "heads", "induction", "scaling", "shakespeare-nanogpt-cpu"} <= set(names)
    head_count = results.load("head-count", REPO)
    assert head_count.sweep_file == REPO / "experiments" / "head_count" / "head-count.yaml"
    assert head_count.command == "python -m mha.sweep experiments/head_count/head-count.yaml --jobs 2"
    # A wall-time sweep runs one run at a time: its file sets no jobs, and its command adds none.
    assert (results.load("shakespeare-nanogpt-cpu", REPO).command
            == "python -m mha.sweep experiments/shakespeare/shakespeare-nanogpt-cpu.yaml")
    partial = head_count.table(complete=False)
    assert len(partial) >= 15 and set(partial.status) == {"ok"} and set(partial.run_id) <= set(head_count.run_ids)
    if len(partial) < len(head_count.run_ids):  # a sweep still running: table() says so, with the command
        with pytest.raises(FileNotFoundError, match="runs are missing or failed.*python -m mha.sweep"):
            head_count.table()
    assert head_count.machine()["device_name"]
    induction = results.load("induction", REPO)
    rid = induction.table(complete=False).run_id[0]
    assert induction.artifact(rid, "history.json")[0]["step"] == 0
    with pytest.raises(ValueError, match="no sweep named 'nope'"):
        results.load("nope", REPO)


def test_command_lines_and_no_old_module_names():
    """``python -m mha.sweep`` and ``python -m mha.bench`` run the harness's command lines; the harness's modules
    are imported by their names under ``mha.experiments`` (the earlier ``mha.model``, ``mha.tasks``, ... are gone)."""
    import importlib.util

    import mha
    import mha.experiments.sweep

    for old in ("model", "tasks", "train", "analysis", "viz"):
        assert importlib.util.find_spec(f"mha.{old}") is None, old
        with pytest.raises(AttributeError):
            getattr(mha, old)
    import mha.sweep

    assert mha.sweep.main is mha.experiments.sweep.main  # the entry point, nothing else
    for module, marker in (("mha.sweep", "--executor"), ("mha.bench", "--quick")):
        out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and marker in out.stdout and f"python -m {module}" in out.stdout, out.stderr
