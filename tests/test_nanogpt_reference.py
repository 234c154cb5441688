"""TinyTransformer computes the same function as the independent nanoGPT re-implementation
(experiments/shakespeare/nanogpt_reference.py): the same weights in give the same logits, loss and gradients out, and both
optimizers and learning-rate schedules agree step by step. This is what lets the chapter "A nanoGPT-comparable
character model" put the two programs' losses side by side."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from mha.experiments.model import TinyTransformer, TransformerConfig
from mha.experiments.train import TrainConfig, configure_optimizer, get_lr

PATH = Path(__file__).resolve().parents[1] / "experiments" / "shakespeare" / "nanogpt_reference.py"
spec = importlib.util.spec_from_file_location("nanogpt_reference", PATH)
ref = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = ref  # dataclasses look their module up while the file executes
spec.loader.exec_module(ref)


def pair(bias: bool, seed: int = 0):
    """A reference GPT and a TinyTransformer holding the same weights (float64)."""
    torch.manual_seed(seed)
    cfg = ref.GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16, bias=bias)
    theirs = ref.GPT(cfg).double()
    with torch.no_grad():  # random biases and gains too, so that a mis-mapped one cannot hide behind zeros/ones
        for name, p in theirs.named_parameters():
            if p.dim() == 1:
                p.normal_(0.0 if name.endswith("bias") else 1.0, 0.3)
    ours = TinyTransformer(TransformerConfig(vocab_size=11, block_size=8, n_layers=2, d_model=16, n_heads=2,
                                             bias=bias)).double()
    c, every_row = cfg.n_embd, slice(None)
    # our parameter name -> (the reference's parameter, the rows of it that hold ours)
    mapping = {"tok_emb.weight": (theirs.transformer.wte.weight, every_row),
               "pos_emb.weight": (theirs.transformer.wpe.weight, every_row),
               "ln_f.weight": (theirs.transformer.ln_f.weight, every_row)}
    if bias:
        mapping["ln_f.bias"] = (theirs.transformer.ln_f.bias, every_row)
    for i, block in enumerate(theirs.transformer.h):
        w, b = block.attn.c_attn.weight, block.attn.c_attn.bias  # (3C, C): rows q, then k, then v
        for j, name in enumerate(("q_proj", "k_proj", "v_proj")):
            rows = slice(j * c, (j + 1) * c)
            mapping[f"blocks.{i}.attn.{name}.weight"] = (w, rows)
            if bias:
                mapping[f"blocks.{i}.attn.{name}.bias"] = (b, rows)
        pairs = {"attn.o_proj": block.attn.c_proj, "mlp.c_fc": block.mlp.c_fc, "mlp.c_proj": block.mlp.c_proj,
                 "ln_1": block.ln_1, "ln_2": block.ln_2}
        for our_name, module in pairs.items():
            mapping[f"blocks.{i}.{our_name}.weight"] = (module.weight, every_row)
            if bias:
                mapping[f"blocks.{i}.{our_name}.bias"] = (module.bias, every_row)
    state = dict(ours.named_parameters())
    assert set(state) == set(mapping), set(state) ^ set(mapping)  # every parameter mapped, none left over
    with torch.no_grad():
        for name, (source, rows) in mapping.items():
            state[name].copy_(source[rows])
    return theirs, ours, mapping


@pytest.mark.parametrize("bias", [False, True])
def test_same_weights_give_same_logits_loss_and_gradients(bias):
    theirs, ours, mapping = pair(bias)
    assert sum(p.numel() for p in theirs.parameters()) == ours.num_params()
    generator = torch.Generator().manual_seed(1)
    idx = torch.randint(11, (3, 8), generator=generator)
    targets = torch.randint(11, (3, 8), generator=generator)
    logits_theirs, loss_theirs = theirs(idx, targets)
    logits_ours, loss_ours, _ = ours(idx, targets)
    torch.testing.assert_close(logits_ours, logits_theirs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(loss_ours, loss_theirs, rtol=1e-12, atol=1e-12)
    loss_theirs.backward()
    loss_ours.backward()
    grads = dict(ours.named_parameters())
    for name, (source, rows) in mapping.items():  # each of our gradients against its rows of the reference's
        torch.testing.assert_close(grads[name].grad, source.grad[rows], rtol=1e-10, atol=1e-12, msg=name)

def test_optimizer_groups_and_schedule_agree():
    theirs, ours, _ = pair(bias=True)
    settings = ref.TrainSettings()
    train_config = TrainConfig(steps=settings.max_iters, lr=settings.learning_rate, min_lr=settings.min_lr,
                               warmup_steps=settings.warmup_iters, weight_decay=settings.weight_decay,
                               beta2=settings.beta2, grad_clip=settings.grad_clip)
    for step in [0, 1, 50, 99, 100, 101, 500, 1000, 1999, 2000]:
        assert math.isclose(get_lr(step, train_config), ref.get_lr(step, settings), rel_tol=1e-12), step
    opt_theirs = ref.configure_optimizer(theirs, settings)
    opt_ours = configure_optimizer(ours, train_config, torch.device("cpu"))
    for g_theirs, g_ours in zip(opt_theirs.param_groups, opt_ours.param_groups, strict=True):
        assert g_theirs["weight_decay"] == g_ours["weight_decay"] and g_theirs["betas"] == g_ours["betas"]
        assert sum(p.numel() for p in g_theirs["params"]) == sum(p.numel() for p in g_ours["params"])


def test_prepare_matches_the_task_split():
    from mha.experiments.data import load_tinyshakespeare
    from mha.experiments.tasks import Shakespeare

    try:
        text = load_tinyshakespeare()
    except FileNotFoundError:
        pytest.skip("Tiny Shakespeare not available (set MHA_DATA_DIR)")
    chars, train, val = ref.prepare(text)
    task = Shakespeare()
    assert chars == task.chars
    np.testing.assert_array_equal(train.astype(np.int64), task.data["train"].numpy())
    np.testing.assert_array_equal(val.astype(np.int64), task.data["val"].numpy())


def test_gpu_recipe_path_runs_on_a_tiny_model():
    """The GPU recipe's code path (dropout, bfloat16 autocast, batches moved to the device) on a CPU-sized model;
    the recipe itself is nanoGPT's config/train_shakespeare_char.py."""
    config, settings = ref.RECIPES["gpu"]
    assert (config.n_layer, config.n_head, config.n_embd, config.block_size, config.dropout) == (6, 6, 384, 256, 0.2)
    assert (settings.batch_size, settings.max_iters, settings.eval_iters, settings.dtype) == (64, 5000, 200,
                                                                                           "bfloat16")
    text = "".join(chr(97 + (i * 7) % 13) for i in range(5000))
    tiny = ref.GPTConfig(vocab_size=13, block_size=16, n_layer=1, n_head=2, n_embd=16, dropout=0.1)
    run = ref.train_one(0, text, tiny, ref.TrainSettings(batch_size=4, max_iters=6, warmup_iters=2, lr_decay_iters=6,
                                                         eval_interval=3, eval_iters=2, final_eval_iters=2,
                                                         device="cpu", dtype="bfloat16"), progress=False)
    assert [h["step"] for h in run["history"]] == [0, 3, 6] and np.isfinite(run["val_loss_final"])


def test_max_iters_shortens_a_run_and_writes_its_own_file(tmp_path, monkeypatch, capsys):
    """--max-iters N (a GPU's rate in a short slot): N iterations, the decay ending at N, the warmup at most N (no 0/0
    where both end together), an evaluation after the last iteration, and a file of its own."""
    from mha.experiments.data import load_tinyshakespeare

    try:
        load_tinyshakespeare()
    except FileNotFoundError:
        pytest.skip("Tiny Shakespeare not available (set MHA_DATA_DIR)")
    tiny = ref.GPTConfig(block_size=16, n_layer=1, n_head=2, n_embd=16)
    settings = ref.TrainSettings(batch_size=2, eval_iters=1, final_eval_iters=1)  # max 2000, warmup 100, eval 250
    monkeypatch.setitem(ref.RECIPES, "cpu", (tiny, settings))
    threads = torch.get_num_threads()
    try:
        out = ref.main(["--max-iters", "3", "--threads", "1", "--out", str(tmp_path / "short.json")])
    finally:
        torch.set_num_threads(threads)
    result = json.loads(out.read_text())
    assert (result["settings"]["max_iters"], result["settings"]["lr_decay_iters"],
            result["settings"]["warmup_iters"]) == (3, 3, 3)
    assert [h["step"] for h in result["runs"][0]["history"]] == [0, 3]  # evaluated after the last iteration too
    assert ref.get_lr(3, ref.TrainSettings(max_iters=3, lr_decay_iters=3, warmup_iters=3)) == settings.min_lr
    with pytest.raises(SystemExit):
        ref.main(["--max-iters", "0", "--out", str(tmp_path / "never.json")])
    assert "--max-iters must be an integer >= 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "never.json").exists()
