"""Tests for mha.experiments.train: schedule, optimizer groups, the training loop's metrics, hooks, decode timing."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from mha.experiments.model import TinyTransformer, TransformerConfig
from mha.experiments.tasks import Task, make_task
from mha.experiments.machine import resolve_device
from mha.experiments.timing import ScriptedClock
from mha.experiments.train import Hook, TrainConfig, configure_optimizer, get_lr, measure_decode_time, train

torch.set_num_threads(1)

RECALL = dict(vocab_size=16, num_kv_pairs=4)


def small_run(seed=0, steps=40, hooks=(), **overrides):
    task = make_task("recall", seed=seed, **RECALL)
    model_config = TransformerConfig(vocab_size=16, block_size=task.block_size, n_layers=1, d_model=32, n_heads=4)
    kwargs = dict(steps=steps, batch_size=16, lr=1e-2, warmup_steps=5, eval_interval=10, eval_batches=2, seed=seed)
    kwargs.update(overrides)
    return task, model_config, train(model_config, task, TrainConfig(**kwargs), progress=False, hooks=hooks)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("train") / "metrics.json"
    task = make_task("recall", seed=0, **RECALL)
    model_config = TransformerConfig(vocab_size=16, block_size=task.block_size, n_layers=1, d_model=32, n_heads=4)
    config = TrainConfig(steps=40, batch_size=16, lr=1e-2, warmup_steps=5, eval_interval=10, eval_batches=2)
    return model_config, config, train(model_config, task, config, progress=False, metrics_path=path), path


def test_get_lr_matches_the_formula():
    cfg = TrainConfig(steps=110, lr=1.0, min_lr=0.1, warmup_steps=10)
    assert get_lr(0, cfg) == pytest.approx(1 / 11)
    assert get_lr(9, cfg) == pytest.approx(10 / 11)
    assert get_lr(10, cfg) == pytest.approx(1.0)  # cosine starts at the peak
    assert get_lr(60, cfg) == pytest.approx(0.55)  # half way: (lr + min_lr) / 2
    assert get_lr(85, cfg) == pytest.approx(0.1 + 0.9 * (1 + math.cos(0.75 * math.pi)) / 2)
    assert get_lr(110, cfg) == pytest.approx(0.1) and get_lr(500, cfg) == pytest.approx(0.1)
    lrs = [get_lr(s, cfg) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))
    assert get_lr(0, TrainConfig(steps=5, warmup_steps=0, lr=1.0, min_lr=0.0)) == pytest.approx(1.0)


def test_weight_decay_only_on_matrices():
    model = TinyTransformer(TransformerConfig(vocab_size=8, block_size=8, n_layers=2, d_model=16, n_heads=2))
    optimizer = configure_optimizer(model, TrainConfig(weight_decay=0.3), torch.device("cpu"))
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.3 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    assert sorted(names[id(p)] for p in decay["params"]) == sorted(n for n, p in model.named_parameters()
                                                                  if n.endswith("weight") and "ln" not in n)
    assert all(names[id(p)].endswith("bias") or ".ln" in names[id(p)] or names[id(p)].startswith("ln")
               for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_metrics_and_json(run):
    model_config, config, result, path = run
    assert [h["step"] for h in result["history"]] == [10, 20, 30, 40]
    assert [h["lr"] for h in result["history"]] == [get_lr(s - 1, config) for s in (10, 20, 30, 40)]
    assert result["val_loss"] == result["history"][-1]["val_loss"] and 0 <= result["val_acc"] <= 1
    assert result["params"] == result.model.num_params()
    assert result["n_kv_heads"] == 4 and result["head_dim"] == 8  # resolved from None
    hd = 32 // 4
    assert result["kv_cache_bytes"] == 2 * 1 * model_config.block_size * 1 * 4 * hd * 4
    assert result["device"] == resolve_device("auto").type and result["torch_version"] == torch.__version__
    assert result["tokens_per_s"] > 0 and result["wall_s"] > 0
    assert json.loads(path.read_text()) == json.loads(json.dumps(result))
    assert result["model_config"]["d_model"] == 32 and result["train_config"]["steps"] == 40
    assert result["task"] == {"name": "recall", "vocab_size": 16, "num_kv_pairs": 4, "num_queries": 4, "seed": 0}


def test_reported_val_metrics_recomputed(run):
    """The final val_loss/val_acc equal a recomputation on the returned model over the same held-out batches."""
    _, config, result, _ = run
    task = make_task("recall", seed=0, **RECALL)
    model = result.model.eval()
    losses, accs = [], []
    with torch.no_grad():
        for _ in range(config.eval_batches):
            x, y = task.get_batch("val", config.batch_size)
            logits = model(x)[0]
            scored = y != -100
            losses.append(F.cross_entropy(logits[scored], y[scored]).item())
            accs.append((logits.argmax(-1)[scored] == y[scored]).float().mean().item())
    assert result["val_loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-5)
    assert result["val_acc"] == pytest.approx(sum(accs) / len(accs), rel=1e-5)


def test_training_learns(run):
    """Recall: at init the loss is ~ln 16; learning that answers are values alone brings it near ln 8."""
    result = run[2]
    assert result["history"][-1]["val_loss"] < math.log(16) - 0.4


def test_seeded_runs_repeat_exactly(run):
    _, _, again = small_run(seed=0)
    assert again["history"] == run[2]["history"]
    _, _, other = small_run(seed=1, steps=10)
    assert other["history"][0] != run[2]["history"][0]


def test_task_without_accuracy():
    class Constant(Task):
        name, vocab_size, block_size, has_accuracy = "constant", 5, 6, False
        _kwargs = {}

        def _sample(self, batch_size, generator, split):
            x = torch.randint(5, (batch_size, 6), generator=generator)
            return x, torch.full_like(x, 2)

    config = TransformerConfig(vocab_size=5, block_size=6, n_layers=1, d_model=8, n_heads=2)
    result = train(config, Constant(), TrainConfig(steps=3, batch_size=2, warmup_steps=1, eval_interval=5),
                   progress=False)
    assert result["val_acc"] is None and result["history"][-1]["val_acc"] is None and len(result["history"]) == 1


def test_bad_configs():
    task = make_task("recall", **RECALL)
    with pytest.raises(ValueError, match="block_size"):
        train(TransformerConfig(vocab_size=16, block_size=4, n_layers=1, d_model=8, n_heads=2), task,
              TrainConfig(steps=2, warmup_steps=0), progress=False)
    with pytest.raises(TypeError, match="Task"):
        train(TransformerConfig(), "recall", TrainConfig(), progress=False)
    with pytest.raises(ValueError, match="warmup_steps"):
        TrainConfig(steps=5, warmup_steps=6)
    with pytest.raises(ValueError, match="min_lr"):
        TrainConfig(lr=1e-3, min_lr=1e-2)
    with pytest.raises(ValueError, match="batch_size"):
        TrainConfig(batch_size=0)
    with pytest.raises(TypeError, match="TrainConfig.lr"):  # a wrong type is a TypeError
        TrainConfig(lr="0.001")
    with pytest.raises(ValueError, match="beta2"):
        TrainConfig(beta2=1.0)
    with pytest.raises(TypeError, match=r"hooks\[0\]"):
        small_run(steps=2, warmup_steps=0, hooks=[object()])


class Recorder(Hook):
    """Records what the trainer hands its hooks; stops after ``stop_at`` steps when given."""

    def __init__(self, eval_at_start=False, stop_at=None):
        self.eval_at_start = eval_at_start
        self.stop_at = stop_at
        self.steps, self.losses, self.norms, self.records, self.started = [], [], [], [], None

    def on_start(self, model, eval_set, device):
        self.started = (model.training, len(eval_set), device.type)

    def on_step(self, step, loss, grad_norm):
        self.steps.append(step)
        self.losses.append(loss.item())
        self.norms.append(grad_norm.item())
        return self.stop_at is not None and step + 1 >= self.stop_at

    def on_eval(self, record):
        record["seen_steps"] = len(self.steps)
        self.records.append(dict(record))


def test_hooks_see_every_step_and_leave_the_run_unchanged():
    """A hook sees every step (its loss averages to the interval train_loss the trainer reports) and can ask for an
    evaluation at step 0; a run with hooks computes exactly the metrics of a run without."""
    _, _, plain = small_run(steps=20)
    hook = Recorder(eval_at_start=True)
    _, _, hooked = small_run(steps=20, hooks=[hook])
    assert hook.started == (True, 2, "cpu")
    assert hook.steps == list(range(20))
    assert all(math.isfinite(n) and n > 0 for n in hook.norms)
    assert hooked["val_loss"] == plain["val_loss"] and hooked["train_loss"] == plain["train_loss"]
    assert [h["step"] for h in hooked["history"]] == [0, 10, 20]
    assert hooked["history"][0]["train_loss"] is None and hooked["history"][0]["lr"] == 0.0
    assert hooked["history"][1:] == [{**h, "seen_steps": s} for h, s in zip(plain["history"], (10, 20))]
    interval = torch.tensor(hook.losses[10:20]).mean().item()  # the same float32 mean the trainer takes
    assert hooked["history"][2]["train_loss"] == pytest.approx(interval, rel=1e-6)


def test_gradient_norm_is_measured_before_clipping():
    """With clipping at 1e-3 every step is clipped, yet the hook's norms are the unclipped ones: they equal the norms
    of a run without clipping at step 0 (same weights, same batch) and exceed the clip threshold."""
    unclipped, clipped = Recorder(), Recorder()
    small_run(steps=3, warmup_steps=0, grad_clip=0.0, hooks=[unclipped])
    small_run(steps=3, warmup_steps=0, grad_clip=1e-3, hooks=[clipped])
    assert clipped.norms[0] == pytest.approx(unclipped.norms[0], rel=1e-6)
    assert min(clipped.norms) > 1e-3


def test_a_hook_can_stop_the_run():
    hook = Recorder(stop_at=7)
    _, _, result = small_run(steps=40, hooks=[hook])
    assert result["steps_done"] == 7 and hook.steps == list(range(7))
    assert [h["step"] for h in result["history"]] == [7]  # one evaluation, at the stop


def test_measure_decode_time_is_the_median_time_per_token_of_the_timed_decodes():
    """With a scripted clock that moves only when the model runs (each decoded token costs its scripted seconds, the
    prefill 100 s), the result is the median over the timed decodes of their time per token: the prefill and the
    warm-up decodes are not timed, and every decode feeds the same tokens as greedy generation."""
    model = TinyTransformer(TransformerConfig(vocab_size=8, block_size=16, n_layers=1, d_model=16, n_heads=2,
                                              n_kv_heads=1))
    prompt_len, new_tokens, warmup = 4, 4, 2
    prompt = torch.randint(8, (1, prompt_len), generator=torch.Generator().manual_seed(0))  # measure's, seed 0
    generated = model.eval().generate(prompt, new_tokens, greedy=True)[:, prompt_len:]
    model.train()
    per_token = [3.0, 2.0] + [0.5, 0.125, 0.25]  # the seconds of each token of each decode: 2 warm-up, 3 timed
    clock = ScriptedClock()
    token = clock.contender([cost for cost in per_token for _ in range(new_tokens)], "token")
    prefill = clock.contender([100.0] * 10, "prefill")
    fed = []

    def on_forward(module, args, output):
        if args[0].shape[1] == 1:
            fed.append(args[0])
            token()
        else:
            prefill()

    handle = model.register_forward_hook(on_forward)
    try:
        seconds = measure_decode_time(model, prompt_len, new_tokens, repeats=3, warmup=warmup, clock=clock)
    finally:
        handle.remove()
    assert isinstance(seconds, float)
    assert seconds == pytest.approx(0.25)  # the median of 0.5, 0.125 and 0.25 (their mean would be 0.29)
    assert clock.log == ["prefill"] + ["token"] * new_tokens * 5  # one prefill, then 2 + 3 decodes
    decoded = torch.cat(fed, dim=1).view(1, 5, new_tokens)  # (N, decodes, new_tokens)
    assert all(torch.equal(decoded[:, k], generated) for k in range(5))  # the same tokens every time
    assert model.training  # the mode is restored
    with pytest.raises(ValueError, match="block_size"):
        measure_decode_time(model, prompt_len=10, new_tokens=7)
    with pytest.raises(ValueError, match="warmup"):
        measure_decode_time(model, prompt_len=4, new_tokens=4, warmup=0)


def test_device_name_on_cpu_is_the_cpu_model_of_proc_cpuinfo():
    from pathlib import Path

    from mha.experiments.machine import cpu_model, device_name

    name = device_name(torch.device("cpu"))
    assert name == cpu_model() and name.strip() == name and name
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists() and "model name" in cpuinfo.read_text():
        assert any(line.startswith("model name") and line.split(":", 1)[1].strip() == name
                   for line in cpuinfo.read_text().splitlines())


def test_bfloat16_precision_runs_the_forward_in_bfloat16():
    """precision="bfloat16": the forward passes run under autocast (a Linear's output is bfloat16), the weights stay
    float32, and training still learns; float32 (the default) is untouched."""
    seen = []
    task, model_config, plain = small_run(steps=10, warmup_steps=1)

    class Spy(Hook):
        def on_start(self, model, eval_set, device):
            model.blocks[0].attn.q_proj.register_forward_hook(lambda m, i, out: seen.append(out.dtype))

    _, _, half = small_run(steps=10, warmup_steps=1, precision="bfloat16", hooks=[Spy()])
    assert set(seen) == {torch.bfloat16} and half.model.lm_head.weight.dtype == torch.float32
    assert math.isfinite(half["val_loss"]) and half["val_loss"] != plain["val_loss"]
    assert abs(half["val_loss"] - plain["val_loss"]) < 0.1
    with pytest.raises(ValueError, match="precision must be one of 'float32', 'bfloat16'"):
        TrainConfig(precision="float16")


def first_patience_stop(history, patience):
    """Where early stopping should stop, found from a full run's history: the first evaluation that is the
    ``patience``-th in a row not to set a new lowest validation loss (None if there is none)."""
    best, waited = math.inf, 0
    for record in history:
        if record["val_loss"] < best:
            best, waited = record["val_loss"], 0
        else:
            waited += 1
            if waited == patience:
                return record["step"]
    return None


@pytest.mark.parametrize("patience", [1, 2])
def test_early_stopping_stops_where_the_full_runs_history_says(patience):
    # lr 3e-2 with little decay: the validation loss of this small run goes up and down, so that patience runs out
    overrides = dict(steps=120, lr=3e-2, min_lr=3e-2, eval_interval=5)
    *_, full = small_run(**overrides)
    stop = first_patience_stop(full["history"], patience)
    assert stop is not None and stop < 120, "the setting must make the run stop early for this test to test anything"
    *_, early = small_run(patience=patience, **overrides)
    assert early["steps_done"] == stop and early["stopped_early"]
    assert early["history"] == full["history"][:len(early["history"])]  # the same run, cut where patience ran out
    best = min(full["history"][:len(early["history"])], key=lambda r: r["val_loss"])
    assert (early["best_val_loss"], early["best_step"]) == (best["val_loss"], best["step"])
    assert "best_val_loss" not in full  # only runs with patience report it


def test_patience_that_never_runs_out_trains_every_step():
    *_, result = small_run(steps=20, patience=1000)
    assert result["steps_done"] == 20 and not result["stopped_early"]


def test_patience_must_be_a_positive_integer():
    with pytest.raises(ValueError, match="patience"):
        TrainConfig(patience=0)
    with pytest.raises(TypeError, match="patience"):
        TrainConfig(patience=2.5)
