"""mha.experiments.config: every setting typed and checked once, the flat settings of a run composed of its model's
and its training's parts, and the defaults the committed results were made with."""

import csv
import json
from dataclasses import FrozenInstanceError, fields
from pathlib import Path

import pytest
import yaml

from mha.experiments import model as model_module
from mha.experiments import train as train_module
from mha.experiments.config import (DynamicsRun, HeadsRun, ModelConfig, RunConfig, ShakespeareRun, TrainConfig,
                                    TrainRun, attn_impls)
from mha.experiments.studies import STUDIES, make_config
from mha.experiments.sweep_file import load_sweep

REPO = Path(__file__).resolve().parents[1]


def committed_rows():
    """(study, sweep parameters, results row) for every committed run of every chapter's sweeps."""
    for path in sorted(REPO.glob("experiments/*/*.yaml")):
        if path.parent.name == "gpu":  # the GPU program's queue (experiments/gpu/queue.yaml), not a sweep file
            continue
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
    assert set(STUDIES) == {"train", "heads", "dynamics", "shakespeare"}
    assert all(study.config.study == name for name, study in STUDIES.items())
    assert TrainRun().task == "two_offset" and TrainRun().n_layers == 1 and not TrainRun().attention_only
    assert DynamicsRun().attention_only and DynamicsRun().task_kwargs == {"vocab_size": 32, "seq_len": 16}
    assert HeadsRun().task == "induction" and HeadsRun().n_layers == 2
    assert ShakespeareRun().bias is False and ShakespeareRun().beta2 == 0.99 and ShakespeareRun().block_size == 32
    assert (ShakespeareRun().steps, ShakespeareRun().lr, ShakespeareRun().n_heads) == (30, 1e-3, 2)
    # a flat setting changes one setting of a part; the study's other defaults stay
    assert ShakespeareRun.from_dict({"lr": 3e-3}).train == TrainConfig(
        steps=30, batch_size=8, lr=3e-3, min_lr=1e-4, warmup_steps=5, beta2=0.99, eval_interval=10, eval_batches=2)
    assert HeadsRun.from_dict({"d_model": 16}).model == ModelConfig(n_layers=2, d_model=16)
    with pytest.raises(ValueError, match="'spike_window' is not a setting of TrainRun"):
        make_config("train", {"spike_window": 10})
    with pytest.raises(ValueError, match="'measure_decode' is not a setting of HeadsRun"):
        make_config("heads", {"measure_decode": True})
    with pytest.raises(ValueError, match="'model' is not a setting of TrainRun"):  # flat names only
        make_config("train", {"model": {"n_heads": 2}})
    with pytest.raises(ValueError, match="study must be one of"):
        make_config("nope", {})


def test_one_definition_and_one_default_per_setting():
    """The run's flat settings are its own fields and its parts' fields, each once, in the order results rows record
    them; the model's and the trainer's configurations are those parts (same fields, same defaults)."""
    layout = TrainRun.settings()
    model_names, train_names = [f.name for f in fields(ModelConfig)], [f.name for f in fields(TrainConfig)]
    assert [k for k, where in layout.items() if where == "model"] == model_names
    assert [k for k, where in layout.items() if where == "train"] == train_names
    assert list(layout)[:2] == ["task", "task_kwargs"] and list(layout)[2:2 + len(model_names)] == model_names
    # to_dict leaves out a setting added later (config.since) while it has the value earlier runs had without it
    added_later = {f.name for part in (ModelConfig, TrainConfig) for f in fields(part) if "unrecorded" in f.metadata}
    assert added_later == {"patience"}
    assert list(TrainRun().to_dict()) == [k for k in layout if k not in added_later]
    assert list(TrainRun.from_dict({"patience": 3}).to_dict()) == list(layout)
    assert train_module.TrainConfig is TrainConfig and issubclass(model_module.TransformerConfig, ModelConfig)
    assert [f.name for f in fields(model_module.TransformerConfig)] == model_names + ["vocab_size", "block_size"]
    assert TrainRun().model == ModelConfig() and TrainRun().train == TrainConfig()
    assert TrainConfig().steps == TrainRun().steps == 60 and TrainConfig().lr == TrainRun().lr == 3e-3
    assert model_module.TransformerConfig().d_model == ModelConfig().d_model == RunConfig().d_model


@pytest.mark.parametrize("values, error, pattern", [
    ({"n_head": 4}, ValueError, r"'n_head' is not a setting of TrainRun .*did you mean 'n_heads'"),
    ({"n_heads": "4"}, TypeError, r"TrainRun.n_heads must be an integer >= 1, got '4' of type str"),
    ({"n_heads": 4.0}, TypeError, r"TrainRun.n_heads must be an integer"),
    ({"n_heads": 0}, ValueError, r"TrainRun.n_heads must be an integer >= 1, got 0"),
    ({"attention_only": 1}, TypeError, r"TrainRun.attention_only must be True or False"),
    ({"lr": "1e-3"}, TypeError, r"TrainRun.lr must be a finite real number >= 0"),
    ({"lr": -1.0}, ValueError, r"TrainRun.lr must be a finite real number >= 0"),
    ({"dropout": 1.0}, ValueError, r"TrainRun.dropout must be a finite real number in \[0, 1\)"),
    ({"task": "nope"}, ValueError, r"TrainRun.task must be one of"),
    ({"task_kwargs": [1]}, TypeError, r"TrainRun.task_kwargs must be a mapping"),
    ({"task_kwargs": {"seq_len": 3}}, ValueError, r"task 'two_offset' does not take"),
    ({"n_heads": 3}, ValueError, r"d_model \(32\) must be divisible by n_heads \(3\)"),
    ({"n_kv_heads": 3}, ValueError, r"n_heads \(4\) must be divisible by n_kv_heads \(3\)"),
    ({"attn_impl": "flash"}, ValueError, r"TrainRun.attn_impl must be one of 'sdpa', 'naive', got 'flash'"),
    ({"attn_impl": "triton"}, ValueError, r"TrainRun.attn_impl must be one of 'sdpa', 'naive', got 'triton'"),
    ({"warmup_steps": 100, "steps": 10}, ValueError, r"TrainRun.warmup_steps \(100\) must be <= steps \(10\)"),
    ({"min_lr": 0.1, "lr": 0.01}, ValueError, r"TrainRun.min_lr"),
    ({"beta2": 1.0}, ValueError, r"TrainRun.beta2"),
    ({"n_kv_heads": None, "head_dim": None, "device": 3}, TypeError, r"TrainRun.device must be a string"),
    ({"device": "gpu:x"}, ValueError, r"TrainRun.device: device must be 'auto' or a torch device string"),
    ({"precision": "float16"}, ValueError, r"TrainRun.precision must be one of 'float32', 'bfloat16'"),
    ({"decode_len": -1}, ValueError, r"decode_len must be an integer >= 0"),
    ({"threads": 0}, ValueError, r"TrainRun.threads must be an integer >= 1"),
])
def test_bad_settings_name_the_field(values, error, pattern):
    with pytest.raises(error, match=pattern):
        TrainRun.from_dict(values)


def test_each_part_checks_its_own_fields():
    """The checks live with the fields: a part made on its own names itself (in a run, the run's class)."""
    with pytest.raises(ValueError, match=r"ModelConfig.dropout must be a finite real number in \[0, 1\)"):
        ModelConfig(dropout=1.0)
    with pytest.raises(TypeError, match=r"TransformerConfig.dropout must be a finite real number"):
        model_module.TransformerConfig(dropout="0.1")
    with pytest.raises(ValueError, match=r"TrainConfig.warmup_steps \(100\) must be <= steps \(60\)"):
        TrainConfig(warmup_steps=100)
    with pytest.raises(TypeError, match=r"TrainRun.model must be a ModelConfig, got TransformerConfig"):
        TrainRun(model=model_module.TransformerConfig())
    with pytest.raises(TypeError, match=r"TrainRun.train must be a TrainConfig, got dict"):
        TrainRun(train={"lr": 1e-3})
    # attn_impl: the model's paths are the attention module's, but the Triton kernel (no weights, no dropout)
    import mha.attention

    assert attn_impls() == tuple(i for i in mha.attention.IMPLS if i != "triton") == ("sdpa", "naive")


def test_study_specific_checks():
    with pytest.raises(ValueError, match="ShakespeareRun.task must be one of 'shakespeare'"):
        ShakespeareRun(task="two_offset")
    with pytest.raises(ValueError, match="set block_size, not task_kwargs"):
        ShakespeareRun(task_kwargs={"block_size": 8})
    with pytest.raises(TypeError, match=r"HeadsRun.induction_periods\[1\] must be an integer"):
        HeadsRun(induction_periods=[4, "8"])
    with pytest.raises(ValueError, match="spike_window must be an integer >= 1"):
        DynamicsRun(spike_window=0)
    with pytest.raises(ValueError, match=r"DynamicsRun.spike_sigmas must be a finite real number > 0"):
        DynamicsRun(spike_sigmas=0.0)


def test_configs_are_frozen_and_build_the_parts():
    config = TrainRun.from_dict(dict(n_layers=2, d_model=16, n_heads=2, n_kv_heads=1, lr=1e-2, min_lr=1e-3, beta2=0.9,
                                     seed=3, task_kwargs={"vocab_size": 5, "block_size": 9}))
    with pytest.raises(FrozenInstanceError):
        config.n_heads = 4
    with pytest.raises(FrozenInstanceError):
        config.model.n_heads = 4
    task = config.make_task()
    assert (task.vocab_size, task.block_size, task.seed) == (5, 9, 3)
    model = config.model_config(task)
    assert (model.vocab_size, model.block_size, model.n_layers, model.n_kv_heads) == (5, 9, 2, 1)
    assert (config.train.lr, config.train.min_lr, config.train.beta2, config.train.seed) == (1e-2, 1e-3, 0.9, 3)
    assert (config.lr, config.n_heads) == (config.train.lr, config.model.n_heads)  # the flat names read through
    assert TrainRun.from_dict(config.to_dict()) == config
    assert isinstance(config, RunConfig) and config.study == "train"
    grad_clip = TrainRun.from_dict({"grad_clip": 1}).grad_clip
    assert grad_clip == 1.0 and isinstance(grad_clip, float)
