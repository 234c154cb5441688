"""Training a :class:`~mha.model.TinyTransformer` on a task, and timing its decoding.

Book: part III (experiments), every chapter: "Head count", "MHA, GQA and MQA in training" (``measure_decode_time``),
"What heads learn", "Induction heads", "The scaling ablation", "A nanoGPT-comparable character model".

The loop is nanoGPT's ``train.py`` reduced to one process: AdamW with weight decay on the 2-D weights only, linear
warmup then cosine decay of the learning rate to ``min_lr`` (``get_lr``), gradient clipping, and a periodic
evaluation on a fixed set of held-out batches (drawn once from the task's "val" stream, so every evaluation and
every run with the same seed sees the same batches).
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from mha._checks import check_int
from mha.model import TinyTransformer, TransformerConfig
from mha.tasks import Task, accuracy

__all__ = ["TrainConfig", "TrainResult", "train", "get_lr", "configure_optimizer", "evaluate", "seed_everything",
           "resolve_device", "device_name", "cpu_model", "save_metrics",
           "measure_decode_time"]


@dataclass
class TrainConfig:
    steps: int = 1000  # optimizer steps
    batch_size: int = 32  # sequences per step
    lr: float = 1e-3  # peak learning rate (after warmup)
    min_lr: float = 1e-4  # learning rate at the end of the cosine decay
    warmup_steps: int = 100  # linear warmup steps
    weight_decay: float = 0.1  # AdamW decoupled weight decay, on 2-D weights only
    beta1: float = 0.9  # AdamW beta1
    beta2: float = 0.95  # AdamW beta2 (nanoGPT's value)
    grad_clip: float = 1.0  # clip the global gradient norm to this; 0 disables
    eval_interval: int = 100  # evaluate every eval_interval steps (and after the last step)
    eval_batches: int = 8  # held-out batches per evaluation (the same batches every time)
    seed: int = 0  # seeds torch, numpy and random (model init; the task has its own seed)
    device: str = "auto"  # "auto" (CUDA when present, else CPU), "cpu", "cuda", "cuda:1", ...

    def __post_init__(self):
        for name in ("steps", "batch_size", "eval_interval", "eval_batches"):
            check_int(f"TrainConfig.{name}", getattr(self, name))
        for name in ("warmup_steps", "seed"):
            check_int(f"TrainConfig.{name}", getattr(self, name), minimum=0)
        if self.warmup_steps > self.steps:
            raise ValueError(f"TrainConfig.warmup_steps ({self.warmup_steps}) must be <= steps ({self.steps})")
        for name in ("lr", "min_lr", "weight_decay", "grad_clip"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise ValueError(f"TrainConfig.{name} must be a finite float >= 0, got {value!r}")
        if self.min_lr > self.lr:
            raise ValueError(f"TrainConfig.min_lr ({self.min_lr}) must be <= lr ({self.lr})")


class TrainResult(dict):
    """The metrics dict returned by :func:`train` (JSON-serialisable), with the trained model as ``.model``."""

    model: TinyTransformer


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(device: str = "auto") -> torch.device:
    """"auto" -> CUDA when available, else CPU; any other string is passed to ``torch.device``."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what ``platform`` knows, else "unknown"."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def device_name(device: torch.device) -> str:
    """What ran: the GPU's name on CUDA (e.g. "NVIDIA H100 80GB HBM3"), else the CPU's model (:func:`cpu_model`)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


def save_metrics(metrics: dict, path: str | os.PathLike) -> None:
    """Write ``metrics`` as JSON to ``path`` atomically (a temporary file, then ``os.replace``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(metrics, indent=1) + "\n")
    os.replace(partial, path)


def train(model_config: TransformerConfig, task: Task, train_config: TrainConfig, progress: bool = True,
          metrics_path: str | os.PathLike | None = None) -> TrainResult:
    """Train a fresh :class:`TinyTransformer` on ``task``; return the metrics, with the model as ``result.model``.

    ``model_config`` must cover the task: vocab_size >= task.vocab_size and block_size >= task.block_size.

    Returns a :class:`TrainResult`, a dict with:
        history: list of {step, lr, train_loss (mean over the steps since the previous evaluation), val_loss,
            val_acc} at every evaluation (every eval_interval steps and after the last step);
        val_loss, val_acc (None when the task has no accuracy), train_loss: the final values;
        tokens_per_s: training tokens (steps x batch_size x block_size) per second of training-step time
            (evaluations excluded); wall_s: the whole call, model construction and evaluations included;
        params: ``model.num_params()``; n_kv_heads, head_dim: the values the model resolved (None in the config
            means n_heads and d_model // n_heads); kv_cache_bytes: the KV cache of one sequence of block_size positions,
            all layers, at float32 (4 bytes), whatever device and dtype trained;
        device (e.g. "cuda", "cpu"), device_name, torch_version, model_config, train_config, task (its config).
    With ``metrics_path`` the dict is also written there as JSON (:func:`save_metrics`).

    Book: part III, "Head count" (and the other experiment chapters).
    """
    if not isinstance(model_config, TransformerConfig):
        raise TypeError(f"model_config must be a TransformerConfig, got {type(model_config).__name__}")
    if not isinstance(train_config, TrainConfig):
        raise TypeError(f"train_config must be a TrainConfig, got {type(train_config).__name__}")
    if not isinstance(task, Task):
        raise TypeError(f"task must be a mha.tasks.Task (see make_task), got {type(task).__name__}")
    if model_config.vocab_size < task.vocab_size or model_config.block_size < task.block_size:
        raise ValueError(f"model_config (vocab_size={model_config.vocab_size}, block_size={model_config.block_size}) "
                         f"must cover the task's vocab_size={task.vocab_size} and block_size={task.block_size}")
    cfg = train_config
    start = time.perf_counter()
    seed_everything(cfg.seed)
    device = resolve_device(cfg.device)
    model = TinyTransformer(model_config).to(device)
    optimizer = configure_optimizer(model, cfg, device)
    eval_set = [task.get_batch("val", cfg.batch_size, device) for _ in range(cfg.eval_batches)]

    history, interval_losses, train_s = [], [], 0.0
    val_loss = val_acc = train_loss = None
    model.train()
    bar = tqdm(range(cfg.steps), desc="train", disable=not progress, leave=False)
    for step in bar:
        _synchronize(device)
        step_start = time.perf_counter()
        lr = get_lr(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = task.get_batch("train", cfg.batch_size, device)
        _, loss, _ = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        interval_losses.append(loss.detach())
        _synchronize(device)
        train_s += time.perf_counter() - step_start

        if (step + 1) % cfg.eval_interval == 0 or step == cfg.steps - 1:
            train_loss = torch.stack(interval_losses).mean().item()
            interval_losses = []
            val_loss, val_acc = evaluate(model, eval_set, task.has_accuracy)
            history.append(dict(step=step + 1, lr=lr, train_loss=train_loss, val_loss=val_loss, val_acc=val_acc))
            bar.set_postfix(train_loss=f"{train_loss:.3f}", val_loss=f"{val_loss:.3f}")
    bar.close()

    result = TrainResult(
        history=history, val_loss=val_loss, val_acc=val_acc, train_loss=train_loss,
        tokens_per_s=cfg.steps * cfg.batch_size * task.block_size / train_s,
        wall_s=time.perf_counter() - start,
        params=model.num_params(), n_kv_heads=model.n_kv_heads, head_dim=model.head_dim,
        kv_cache_bytes=model.kv_cache_bytes(1, model_config.block_size, dtype_bytes=4),
        device=device.type, device_name=device_name(device), torch_version=torch.__version__,
        model_config=asdict(model_config), train_config=asdict(cfg), task=task.config())
    result.model = model
    if metrics_path is not None:
        save_metrics(result, metrics_path)
    return result


@torch.no_grad()
def measure_decode_time(model: TinyTransformer, prompt_len: int, new_tokens: int, batch_size: int = 1,
                        repeats: int = 5, warmup: int = 1, seed: int = 0) -> float:
    """Seconds per decoded token with the KV cache: the median over ``repeats`` of (decode time / new_tokens).

    Each repeat prefills a random prompt of ``prompt_len`` tokens (not timed), then times ``new_tokens`` single-
    token forward passes through the cache (greedy). ``prompt_len + new_tokens`` must fit in block_size (beyond it
    :meth:`TinyTransformer.generate` recomputes instead of caching). ``warmup`` untimed repeats come first.

    Book: part II, "Autoregressive decoding and the KV cache"; part III, "MHA, GQA and MQA in training".
    """
    block_size = model.config.block_size
    for name, value in (("prompt_len", prompt_len), ("new_tokens", new_tokens), ("batch_size", batch_size),
                        ("repeats", repeats)):
        check_int(name, value)
    if prompt_len + new_tokens > block_size:
        raise ValueError(f"prompt_len + new_tokens ({prompt_len} + {new_tokens}) must be <= block_size "
                         f"({block_size}) so that every token is decoded through the cache")
    device = model.lm_head.weight.device
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.randint(model.config.vocab_size, (batch_size, prompt_len), generator=generator).to(device)
    was_training = model.training
    model.eval()
    per_token = []
    for repeat in range(warmup + repeats):
        caches = model.make_kv_caches(batch_size, prompt_len + new_tokens)
        logits, _, _ = model(prompt, kv_caches=caches)  # prefill, (N, prompt_len, vocab_size)
        _synchronize(device)
        begin = time.perf_counter()
        for _ in range(new_tokens):
            next_id = logits[:, -1:, :].argmax(dim=-1)  # (N, 1)
            logits, _, _ = model(next_id, kv_caches=caches)  # (N, 1, vocab_size)
        _synchronize(device)
        if repeat >= warmup:
            per_token.append((time.perf_counter() - begin) / new_tokens)
    model.train(was_training)
    return statistics.median(per_token)
