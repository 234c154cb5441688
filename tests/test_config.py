"""mha.experiments.config: every setting typed and checked, and the defaults the committed results were made with."""

import csv
import json
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest
import yaml

from mha.experiments.config import (STUDY_CONFIGS, DynamicsRun, HeadsRun, RunConfig, ShakespeareRun, TrainRun,
                                    make_config)
from mha.experiments.sweep import load_sweep

REPO = Path(__file__).resolve().parents[1]


def committed_rows():
    """(study, sweep parameters, results row) for every committed run of every chapter's sweeps."""
    for path in sorted(REPO.glob("experiments/*/*.yaml")):
        spec = yaml.safe_load(path.read_text())
        results = path.parent / spec["name"] / "results.csv"
        if not results.is_file():
            continue
        runs = {run.run_id: run.parameters for run in load_sweep(path).runs()}
        with open(results, newline="") as f:
            for row in csv.DictReader(f):
                if row["run_id"] in runs:
                    yield spec["study"], runs[row["run_id"]], row


def as_cell(value) -> str:
    """How results.csv writes a value."""
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def test_defaults_reproduce_every_committed_row():
    """The configuration's effective settings of each committed run equal what the notebooks that made it recorded
    (the notebooks' own defaults where the sweep set nothing): same settings, so the same runs and run_ids."""
    rows = list(committed_rows())
    assert len(rows) >= 150
    settings = {"n_layers", "d_model", "n_heads", "mlp_ratio", "attention_only", "scale_scores", "dropout", "bias",
                "attn_impl", "steps", "batch_size", "lr", "min_lr", "warmup_steps", "weight_decay", "beta2",
                "grad_clip", "eval_interval", "eval_batches", "seed", "task", "task_kwargs", "block_size",
                "analysis_batch_size", "importance_batches", "prune_eval_batches", "random_orders", "spike_window",
                "spike_sigmas", "save_attention", "final_eval_batches", "sample_chars", "sample_top_k",
                "measure_decode", "decode_len", "decode_batch_size"}
    compared = 0
    for study, parameters, row in rows:
        effective = make_config(study, parameters).to_dict()
        for key in settings & set(row) & set(effective):
            if key in ("n_kv_heads", "head_dim") or (key == "task" and row[key] == ""):
                continue  # the model's resolved values; the Shakespeare notebook had no task parameter
            expected, got = row[key], as_cell(effective[key])
            if key in ("lr", "min_lr", "weight_decay", "grad_clip", "dropout", "spike_sigmas", "beta2"):
                assert float(expected) == float(got), (row["sweep"], row["run_id"], key)
            elif key == "task_kwargs":
                assert json.loads(expected or "{}") == effective[key], (row["sweep"], row["run_id"], key)
            else:
                assert expected == got, (row["sweep"], row["run_id"], key, expected, got)
            compared += 1
    assert compared > 2000


def test_each_study_has_its_own_settings_and_defaults():
    assert set(STUDY_CONFIGS) == {"train", "heads", "dynamics", "shakespeare"}
    assert TrainRun().task == "two_offset" and TrainRun().n_layers == 1 and not TrainRun().attention_only
    assert DynamicsRun().attention_only and DynamicsRun().task_kwargs == {"vocab_size": 32, "seq_len": 16}
    assert HeadsRun().task == "induction" and HeadsRun().n_layers == 2
    assert ShakespeareRun().bias is False and ShakespeareRun().beta2 == 0.99 and ShakespeareRun().block_size == 32
    with pytest.raises(ValueError, match="'spike_window' is not a setting of TrainRun"):
        make_config("train", {"spike_window": 10})
    with pytest.raises(ValueError, match="'measure_decode' is not a setting of HeadsRun"):
        make_config("heads", {"measure_decode": True})


@pytest.mark.parametrize("values, error, pattern", [
    ({"n_head": 4}, ValueError, r"'n_head' is not a setting of TrainRun .*did you mean 'n_heads'"),
    ({"n_heads": "4"}, TypeError, r"TrainRun.n_heads must be an integer >= 1, got '4' of type str"),
    ({"n_heads": 4.0}, TypeError, r"TrainRun.n_heads must be an integer"),
    ({"n_heads": 0}, ValueError, r"TrainRun.n_heads must be an integer >= 1, got 0"),
    ({"attention_only": 1}, TypeError, r"TrainRun.attention_only must be True or False"),
    ({"lr": "1e-3"}, TypeError, r"TrainRun.lr must be a finite real number >= 0"),
    ({"lr": -1.0}, ValueError, r"TrainRun.lr must be a finite real number >= 0"),
    ({"dropout": 1.0}, ValueError, r"dropout must be a finite real number in \[0, 1\)"),
    ({"task": "nope"}, ValueError, r"TrainRun.task must be one of"),
    ({"task_kwargs": [1]}, TypeError, r"TrainRun.task_kwargs must be a mapping"),
    ({"task_kwargs": {"seq_len": 3}}, ValueError, r"task 'two_offset' does not take"),
    ({"n_heads": 3}, ValueError, r"d_model \(32\) must be divisible by n_heads \(3\)"),
    ({"n_kv_heads": 3}, ValueError, r"n_heads \(4\) must be divisible by n_kv_heads \(3\)"),
    ({"attn_impl": "flash"}, ValueError, r"TrainRun.attn_impl must be one of 'sdpa', 'naive'"),
    ({"warmup_steps": 100, "steps": 10}, ValueError, r"warmup_steps \(100\) must be <= steps \(10\)"),
    ({"min_lr": 0.1, "lr": 0.01}, ValueError, r"min_lr"),
    ({"beta2": 1.0}, ValueError, r"beta2"),
    ({"n_kv_heads": None, "head_dim": None, "device": 3}, TypeError, r"TrainRun.device must be a string"),
    ({"decode_len": -1}, ValueError, r"decode_len must be an integer >= 0"),
])
def test_bad_settings_name_the_field(values, error, pattern):
    with pytest.raises(error, match=pattern):
        TrainRun.from_dict(values)


def test_study_specific_checks():
    with pytest.raises(ValueError, match="ShakespeareRun.task must be one of 'shakespeare'"):
        ShakespeareRun(task="two_offset")
    with pytest.raises(ValueError, match="set block_size, not task_kwargs"):
        ShakespeareRun(task_kwargs={"block_size": 8})
    with pytest.raises(TypeError, match=r"HeadsRun.induction_periods\[1\] must be an integer"):
        HeadsRun(induction_periods=[4, "8"])
    with pytest.raises(ValueError, match="spike_window must be an integer >= 1"):
        DynamicsRun(spike_window=0)


def test_configs_are_frozen_and_build_the_parts():
    config = TrainRun(n_layers=2, d_model=16, n_heads=2, n_kv_heads=1, lr=1e-2, min_lr=1e-3, beta2=0.9, seed=3,
                      task_kwargs={"vocab_size": 5, "block_size": 9})
    with pytest.raises(FrozenInstanceError):
        config.n_heads = 4
    task = config.make_task()
    assert (task.vocab_size, task.block_size, task.seed) == (5, 9, 3)
    model = config.model_config(task)
    assert (model.vocab_size, model.block_size, model.n_layers, model.n_kv_heads) == (5, 9, 2, 1)
    train = config.train_config()
    assert (train.lr, train.min_lr, train.beta2, train.seed) == (1e-2, 1e-3, 0.9, 3)
    assert TrainRun.from_dict(config.to_dict()) == config
    assert isinstance(config, RunConfig) and config.study == "train"
    assert TrainRun(grad_clip=1).grad_clip == 1.0 and isinstance(TrainRun(grad_clip=1).grad_clip, float)
