"""One trainer for every experiment: a :class:`~mha.experiments.model.TinyTransformer` trained on a task, with hooks.

Book: part III (experiments), every chapter: "Head count", "MHA, GQA and MQA in training" (``measure_decode_time``),
"What heads learn", "Induction heads" and "The scaling ablation" (per-step gradient norms and step-0 probes, through
hooks), "A nanoGPT-comparable character model".

The loop is nanoGPT's ``train.py`` reduced to one process: AdamW with weight decay on the 2-D weights only, linear
warmup then cosine decay of the learning rate to ``min_lr`` (``get_lr``), gradient clipping, and a periodic
evaluation on a fixed set of held-out batches (drawn once from the task's "val" stream, so every evaluation and
every run with the same seed sees the same batches). Its settings are a :class:`TrainConfig` (defined, with its
defaults and checks, beside the run's other settings in :mod:`mha.experiments.config`).

Hooks (:class:`Hook`) see every step's loss and gradient norm (the norm before clipping), add what they measure to
each evaluation's record, may ask for an evaluation at step 0 (the initialisation) and may stop the run (a loss
that is no longer finite). A run with no hooks computes exactly what it computed before hooks existed. Early stopping
(``TrainConfig.patience``) stops a run whose validation loss has stopped improving: the part III runs trained to
convergence.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from dataclasses import asdict

import torch
from tqdm import tqdm  # plain tqdm: tqdm.auto warns inside Jupyter when ipywidgets is missing

from mha._checks import check_choice, check_int, check_type
from mha.experiments.config import PRECISIONS, TrainConfig
from mha.experiments.io import save_json
from mha.experiments.machine import machine_info, resolve_device, seed_everything, synchronize
from mha.experiments.model import TinyTransformer, TransformerConfig
from mha.experiments.tasks import Task, accuracy
from mha.experiments.timing import paired_times, summary

__all__ = ["TrainConfig", "TrainResult", "Hook", "train", "get_lr", "configure_optimizer", "evaluate",
           "measure_decode_time", "autocast", "PRECISIONS"]  # TrainConfig and PRECISIONS: from mha.experiments.config


def autocast(device: torch.device, precision: str):
    """The context the forward passes run in: nothing for "float32", ``torch.autocast(bfloat16)`` for
    "bfloat16" (matrix products in bfloat16, reductions and the weights in float32, as nanoGPT on a GPU)."""
    check_choice("precision", precision, PRECISIONS)
    if precision == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


class TrainResult(dict):
    """The metrics dict returned by :func:`train` (JSON-serialisable), with the trained model as ``.model``."""

    model: TinyTransformer


class Hook:
    """What a hook may do; every method is optional (the defaults do nothing).

    The trainer calls, in this order: :meth:`on_start` once, after the model, optimizer and held-out batches exist
    (and before an evaluation at step 0, if :attr:`eval_at_start`); :meth:`on_step` after every optimizer step;
    :meth:`on_eval` at every evaluation, with the record the trainer built (step, lr, train_loss, val_loss,
    val_acc), to which the hook adds its own keys (it may also replace ``train_loss``, the value the run reports).
    """

    eval_at_start: bool = False  # also evaluate (and call on_eval) at step 0, before any update

    def on_start(self, model: TinyTransformer, eval_set: list, device: torch.device) -> None:
        """The model at initialisation, the held-out batches and the device."""

    def on_step(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> bool:
        """After optimizer step ``step`` (0-based): the step's loss and the gradient norm before clipping.
        Return True to stop training (the trainer then evaluates once more and returns)."""
        return False

    def on_eval(self, record: dict) -> None:
        """At each evaluation; ``record["step"]`` is the number of steps done (0 at the start)."""


def get_lr(step: int, config: TrainConfig) -> float:
    """nanoGPT's schedule: linear warmup to ``lr`` over ``warmup_steps``, then cosine decay to ``min_lr`` at
    ``steps``."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / (config.warmup_steps + 1)
    if step >= config.steps:
        return config.min_lr
    decay_ratio = (step - config.warmup_steps) / (config.steps - config.warmup_steps)  # in [0, 1)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # from 1 to 0
    return config.min_lr + coeff * (config.lr - config.min_lr)


def configure_optimizer(model: torch.nn.Module, config: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on parameters of dimension >= 2 (matmul weights, embeddings) and none on biases
    and LayerNorm gains (nanoGPT's ``configure_optimizers``)."""
    params = [p for p in model.parameters() if p.requires_grad]  # the tied embedding appears once
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": config.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(config.beta1, config.beta2),
                             fused=device.type == "cuda")


@torch.no_grad()
def evaluate(model: TinyTransformer, batches, has_accuracy: bool) -> tuple[float, float | None]:
    """Mean loss (and accuracy, when the task has one) over ``batches`` of (x, y), in eval mode."""
    was_training = model.training
    model.eval()
    losses, accuracies = [], []
    for x, y in batches:
        logits, loss, _ = model(x, y)
        losses.append(loss.item())
        if has_accuracy:
            accuracies.append(accuracy(logits, y))
    model.train(was_training)
    return statistics.fmean(losses), (statistics.fmean(accuracies) if has_accuracy else None)


def _check_train_arguments(model_config, task, train_config, hooks) -> list[Hook]:
    check_type("model_config", model_config, TransformerConfig, "a TransformerConfig")
    check_type("train_config", train_config, TrainConfig, "a TrainConfig")
    check_type("task", task, Task, "a mha.experiments.tasks.Task (see make_task)")
    hooks = list(hooks)
    for i, hook in enumerate(hooks):
        check_type(f"hooks[{i}]", hook, Hook, "a mha.experiments.train.Hook")
    if model_config.vocab_size < task.vocab_size or model_config.block_size < task.block_size:
        raise ValueError(f"model_config (vocab_size={model_config.vocab_size}, block_size={model_config.block_size}) "
                         f"must cover the task's vocab_size={task.vocab_size} and block_size={task.block_size}")
    return hooks


def train(model_config: TransformerConfig, task: Task, train_config: TrainConfig, progress: bool = True,
          metrics_path=None, hooks=()) -> TrainResult:
    """Train a fresh :class:`TinyTransformer` on ``task``; return the metrics, with the model as ``result.model``.

    ``model_config`` must cover the task: vocab_size >= task.vocab_size and block_size >= task.block_size.
    ``hooks``: :class:`Hook` objects (per-step measurements, probes at each evaluation, early stop).

    Returns a :class:`TrainResult`, a dict with:
        history: list of {step, lr, train_loss (mean over the steps since the previous evaluation), val_loss,
            val_acc, and whatever the hooks add} at every evaluation (every eval_interval steps, after the last
            step, and at step 0 when a hook asks for it);
        val_loss, val_acc (None when the task has no accuracy), train_loss: the final evaluation's values;
        steps_done: optimizer steps taken (fewer than ``steps`` if a hook or early stopping stopped the run);
        with ``train_config.patience`` only: best_val_loss and best_step (the lowest validation loss of the periodic
            evaluations, and its step) and stopped_early (True when patience ran out before ``steps``);
        tokens_per_s: training tokens (steps_done x batch_size x block_size) per second of training-step time
            (evaluations excluded); wall_s: the whole call, model construction and evaluations included;
        params: ``model.num_params()``; n_kv_heads, head_dim: the values the model resolved (None in the config
            means n_heads and d_model // n_heads); kv_cache_bytes: the KV cache of one sequence of block_size positions,
            all layers, at float32 (4 bytes), whatever device and dtype trained;
        device (e.g. "cuda", "cpu"), device_name, torch_version (as :func:`mha.experiments.machine.machine_info`
            records them), model_config, train_config, task (its config).
    With ``metrics_path`` the dict is also written there as JSON (:func:`mha.experiments.io.save_json`).
    """
    hooks = _check_train_arguments(model_config, task, train_config, hooks)
    cfg = train_config
    start = time.perf_counter()
    seed_everything(cfg.seed)
    device = resolve_device(cfg.device)
    model = TinyTransformer(model_config).to(device)
    optimizer = configure_optimizer(model, cfg, device)
    eval_set = [task.get_batch("val", cfg.batch_size, device) for _ in range(cfg.eval_batches)]
    for hook in hooks:
        hook.on_start(model, eval_set, device)

    history = []

    def evaluation(step, lr, train_loss):
        with autocast(device, cfg.precision):
            val_loss, val_acc = evaluate(model, eval_set, task.has_accuracy)
        record = dict(step=step, lr=lr, train_loss=train_loss, val_loss=val_loss, val_acc=val_acc)
        for hook in hooks:
            hook.on_eval(record)
        history.append(record)
        return record

    if any(hook.eval_at_start for hook in hooks):
        evaluation(0, 0.0, None)
    interval_losses, train_s, steps_done = [], 0.0, 0
    best_val_loss, best_step, waited = math.inf, 0, 0  # early stopping: the best so far, evaluations since it
    model.train()
    bar = tqdm(range(cfg.steps), desc="train", disable=not progress, leave=False)
    for step in bar:
        synchronize(device)
        step_start = time.perf_counter()
        lr = get_lr(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = task.get_batch("train", cfg.batch_size, device)
        with autocast(device, cfg.precision):
            _, loss, _ = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        # The norm before clipping; with grad_clip = 0 the gradients are multiplied by exactly 1 (nothing changes).
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else math.inf)
        optimizer.step()
        interval_losses.append(loss.detach())
        synchronize(device)
        train_s += time.perf_counter() - step_start
        steps_done = step + 1
        stop = any([hook.on_step(step, loss.detach(), grad_norm) for hook in hooks])  # every hook sees every step

        if steps_done % cfg.eval_interval == 0 or steps_done == cfg.steps or stop:
            record = evaluation(steps_done, lr, torch.stack(interval_losses).mean().item())
            interval_losses = []
            if record["val_loss"] < best_val_loss:
                best_val_loss, best_step, waited = record["val_loss"], steps_done, 0
            else:
                waited += 1
            stop = stop or (cfg.patience is not None and waited >= cfg.patience)
            bar.set_postfix(train_loss=f"{record['train_loss']:.3f}", val_loss=f"{record['val_loss']:.3f}")
        if stop:
            break
    bar.close()

    final = history[-1]
    machine = machine_info(device)
    result = TrainResult(
        history=history, val_loss=final["val_loss"], val_acc=final["val_acc"], train_loss=final["train_loss"],
        steps_done=steps_done, tokens_per_s=steps_done * cfg.batch_size * task.block_size / max(train_s, 1e-12),
        wall_s=time.perf_counter() - start,
        params=model.num_params(), n_kv_heads=model.n_kv_heads, head_dim=model.head_dim,
        kv_cache_bytes=model.kv_cache_bytes(1, model_config.block_size, dtype_bytes=4),
        device=machine["device"], device_name=machine["device_name"], torch_version=machine["torch_version"],
        model_config=asdict(model_config), train_config=asdict(cfg), task=task.config())
    if cfg.patience is not None:
        result.update(best_val_loss=best_val_loss, best_step=best_step, stopped_early=steps_done < cfg.steps)
    result.model = model
    if metrics_path is not None:
        save_json(result, metrics_path)
    return result


@torch.no_grad()
def measure_decode_time(model: TinyTransformer, prompt_len: int, new_tokens: int, batch_size: int = 1,
                        repeats: int = 5, warmup: int = 1, seed: int = 0, clock=None) -> float:
    """Seconds per decoded token with the KV cache: the median over ``repeats`` of (decode time / new_tokens).

    A random prompt of ``prompt_len`` tokens is prefilled once (not timed). Each decode sets the caches back to the
    prompt and runs ``new_tokens`` single-token forward passes through them (greedy), the same tokens every time.
    The decodes are timed by the package's one timer, :func:`mha.experiments.timing.paired_times` (one contender,
    one decode per timing, CUDA synchronised around each): ``warmup`` (>= 1) untimed decodes, then ``repeats``
    timed ones. ``clock``: the timer's clock (default ``time.perf_counter``; a
    :class:`~mha.experiments.timing.ScriptedClock` in the tests). ``prompt_len + new_tokens`` must fit in block_size
    (beyond it :meth:`TinyTransformer.generate` recomputes instead of caching).

    Book: part II, "Autoregressive decoding and the KV cache"; part III, "MHA, GQA and MQA in training".
    """
    block_size = model.config.block_size
    for name, value in (("prompt_len", prompt_len), ("new_tokens", new_tokens), ("batch_size", batch_size),
                        ("repeats", repeats), ("warmup", warmup)):
        check_int(name, value)
    if prompt_len + new_tokens > block_size:
        raise ValueError(f"prompt_len + new_tokens ({prompt_len} + {new_tokens}) must be <= block_size "
                         f"({block_size}) so that every token is decoded through the cache")
    device = model.lm_head.weight.device
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.randint(model.config.vocab_size, (batch_size, prompt_len), generator=generator).to(device)
    was_training = model.training
    model.eval()
    try:
        caches = model.make_kv_caches(batch_size, prompt_len + new_tokens)
        prefill, _, _ = model(prompt, kv_caches=caches)  # (N, prompt_len, vocab_size), not timed

        def decode():
            for cache in caches:
                cache.length = prompt_len  # back to the prompt: the positions after it are written again
            logits = prefill
            for _ in range(new_tokens):
                next_id = logits[:, -1:, :].argmax(dim=-1)  # (N, 1)
                logits, _, _ = model(next_id, kv_caches=caches)  # (N, 1, vocab_size)

        timed = paired_times({"decode": decode}, repeats, warmup, device=device, clock=clock)
    finally:
        model.train(was_training)
    return summary([seconds / new_tokens for seconds in timed["times"]["decode"]])["median"]
