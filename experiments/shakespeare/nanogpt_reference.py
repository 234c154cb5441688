"""nanoGPT's character-level Tiny Shakespeare recipe, re-implemented independently: the reference that the chapter
"A nanoGPT-comparable character model" measures ``mha.model.TinyTransformer`` and ``mha.train.train`` against.

nanoGPT (Karpathy, MIT licence) cannot be installed on the book's build machine (only package registries are
reachable), so this file re-implements, step by step, what its ``data/shakespeare_char/prepare.py``, ``model.py``
and ``train.py`` do for the README's CPU command

    python train.py config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=20 --log_interval=1
        --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000
        --dropout=0.0

(``--recipe gpu``: config/train_shakespeare_char.py as train.py runs it on a GPU: 6 layers, 6 heads, width 384,
context 256, batch 64, dropout 0.2, 5000 iterations, 200 evaluation batches, bfloat16 autocast; ``--compile`` as
train.py's default), including the order in which they draw random numbers: one global torch generator seeded with ``seed`` (nanoGPT:
1337), used in turn by module construction, the weight initialisation, every training batch and every evaluation
batch (20 fresh random batches per split at each evaluation, every 250 iterations). It imports nothing from the
``mha`` package but the checksum-verified text (``mha.tasks.load_tinyshakespeare``) and the CPU's name.

    python experiments/shakespeare/nanogpt_reference.py --seeds 1337 0 1 2 3 4 5 6 7 8 9
    python experiments/shakespeare/nanogpt_reference.py --recipe gpu --seeds 1337     (on a CUDA GPU)
    python experiments/shakespeare/nanogpt_reference.py --recipe gpu --max-iters 100  (a short run: a GPU's rate)

writes ``experiments/shakespeare/nanogpt-reference/results.json``: per seed, the log nanoGPT prints (train and val loss
estimates at every evaluation), the loss on 200 batches of each split at the end, the wall time, the time of the
training steps alone (``train_s``, ``tokens_per_s``: the span mha's trainer times; recorded since 2026-11-28, the
earlier files do not have it) and the machine's load. Runs of other seeds already in the file are kept (a seed run again replaces its entry), so seeds can be added
later. ``--max-iters N`` shortens a run as the sweeps' ``--set steps=N`` does: N iterations, the cosine decay ending
at N (``lr_decay_iters``), the warmup at most N, and an evaluation after the last iteration; its results go to their
own file (``results-iters<N>.json``, ``results-gpu-iters<N>.json``). Run it alone,
on a quiet machine: it is a wall-time comparison too. tests/test_nanogpt_reference.py checks that TinyTransformer
computes the same function as this model (same weights in, same logits, loss and gradients out).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm


@dataclass
class GPTConfig:
    vocab_size: int = 65  # characters of Tiny Shakespeare
    block_size: int = 64  # context length
    n_layer: int = 4  # transformer blocks
    n_head: int = 4  # attention heads
    n_embd: int = 128  # model width
    bias: bool = False  # biases in Linear layers and LayerNorms (nanoGPT's train.py default: False)
    dropout: float = 0.0  # on the embeddings, the attention weights and both residual branches (GPU recipe: 0.2)


@dataclass
class TrainSettings:
    batch_size: int = 12  # sequences per iteration
    max_iters: int = 2000  # iterations (the README's CPU command)
    learning_rate: float = 1e-3  # peak learning rate (config/train_shakespeare_char.py)
    min_lr: float = 1e-4  # learning rate at the end of the cosine decay
    warmup_iters: int = 100  # linear warmup iterations
    lr_decay_iters: int = 2000  # the cosine decay ends here
    weight_decay: float = 0.1  # AdamW weight decay on 2-D parameters
    beta1: float = 0.9  # AdamW beta1
    beta2: float = 0.99  # AdamW beta2 (config/train_shakespeare_char.py)
    grad_clip: float = 1.0  # global gradient-norm clip
    eval_interval: int = 250  # evaluate every eval_interval iterations
    eval_iters: int = 20  # random batches per split per evaluation (the README's --eval_iters=20)
    final_eval_iters: int = 200  # random batches per split for the precise estimate after training
    device: str = "cpu"  # "cpu" (the README's CPU command) or "cuda" (config/train_shakespeare_char.py)
    dtype: str = "float32"  # "bfloat16": forward passes under torch.autocast, as train.py on a GPU
    compile: bool = False  # torch.compile the model (train.py's default on a GPU; --compile)


RECIPES = {
    # the README's CPU command: --device=cpu --compile=False --eval_iters=20 --block_size=64 --batch_size=12
    # --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0
    "cpu": (GPTConfig(), TrainSettings()),
    # config/train_shakespeare_char.py as train.py runs it on a GPU (bfloat16 where supported)
    "gpu": (GPTConfig(block_size=256, n_layer=6, n_head=6, n_embd=384, dropout=0.2),
            TrainSettings(batch_size=64, max_iters=5000, lr_decay_iters=5000, eval_iters=200, device="cuda",
                          dtype="bfloat16")),
}


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (nanoGPT's own class: torch's had no bias=False option then)."""

    def __init__(self, n_dim: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n_dim))
        self.bias = nn.Parameter(torch.zeros(n_dim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    """One packed projection to q, k, v (``c_attn``), causal SDPA, the output projection ``c_proj``."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout

    def forward(self, x):
        batch, length, width = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)  # each (B, T, C)
        q = q.view(batch, length, self.n_head, width // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(batch, length, self.n_head, width // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(batch, length, self.n_head, width // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=True)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(batch, length, width)  # (B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's GPT: token + position embeddings, pre-LN blocks, final LN, lm head tied to the token embedding."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, config.bias)))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        # nanoGPT's initialisation, module by module in the order apply() visits them (children first): N(0, 0.02)
        # for every Linear and Embedding weight, zero biases; then GPT-2's smaller init of the residual projections.
        for module in _children_first(self):
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        residual_std = 0.02 / math.sqrt(2 * config.n_layer)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=residual_std)

    def forward(self, idx, targets=None):
        positions = torch.arange(idx.shape[1], device=idx.device)  # (T,)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(positions))  # (B, T, C)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))  # (B, T, vocab)
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def _children_first(module: nn.Module):
    """Every submodule, children before their parent: the order in which ``nn.Module.apply`` visits them."""
    for child in module.children():
        yield from _children_first(child)
    yield module


def prepare(text: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    """prepare.py: the sorted characters, and the encoded first 90% (train) and last 10% (val) as uint16."""
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = np.array([stoi[c] for c in text], dtype=np.uint16)
    n_train = int(len(data) * 0.9)
    return chars, data[:n_train], data[n_train:]


def get_batch(data: np.ndarray, block_size: int, batch_size: int, device: str = "cpu"):
    """train.py's get_batch: random crops from the global torch generator (on the CPU), moved to ``device``."""
    starts = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in starts])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64)) for i in starts])
    return x.to(device), y.to(device)


def autocast(settings: TrainSettings):
    """train.py's ``ctx``: nothing in float32, torch.autocast in bfloat16."""
    if settings.dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(settings.device).type, dtype=getattr(torch, settings.dtype))


def get_lr(it: int, s: TrainSettings) -> float:
    """train.py's schedule: linear warmup, cosine decay to min_lr at lr_decay_iters, then min_lr."""
    if it < s.warmup_iters:
        return s.learning_rate * (it + 1) / (s.warmup_iters + 1)
    if it >= s.lr_decay_iters:  # train.py has '>': the same value at lr_decay_iters (cos(pi) = -1), and no 0/0
        return s.min_lr  # when a shortened run's warmup ends where its decay ends (--max-iters)
    ratio = (it - s.warmup_iters) / (s.lr_decay_iters - s.warmup_iters)
    return s.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (s.learning_rate - s.min_lr)


def configure_optimizer(model: GPT, s: TrainSettings) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": s.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=s.learning_rate, betas=(s.beta1, s.beta2))


@torch.no_grad()
def estimate_loss(model: GPT, splits: dict, block_size: int, batch_size: int, iters: int,
                  settings: TrainSettings | None = None) -> dict:
    """train.py's estimate_loss: the mean loss over ``iters`` fresh random batches of each split, in eval mode."""
    settings = settings or TrainSettings()
    model.eval()
    out = {}
    for name, data in splits.items():
        losses = []
        for _ in range(iters):
            x, y = get_batch(data, block_size, batch_size, settings.device)
            with autocast(settings):
                losses.append(model(x, y)[1].item())
        out[name] = float(np.mean(losses))
    model.train()
    return out


def train_one(seed: int, text: str, config: GPTConfig | None = None, settings: TrainSettings | None = None,
              progress: bool = True) -> dict:
    """One run of train.py with ``torch.manual_seed(seed)``; returns the log, the final estimates and the time."""
    settings = settings or TrainSettings()
    chars, train_data, val_data = prepare(text)
    config = config or GPTConfig(vocab_size=len(chars))
    splits = {"train": train_data, "val": val_data}
    torch.manual_seed(seed)
    start = time.perf_counter()
    model = GPT(config).to(settings.device)
    optimizer = configure_optimizer(model, settings)
    step_model = torch.compile(model) if settings.compile else model
    history, train_s = [], 0.0  # train_s: the training steps alone, as mha's trainer times them (tokens_per_s)
    x, y = get_batch(train_data, config.block_size, settings.batch_size, settings.device)
    bar = tqdm(range(settings.max_iters + 1), desc=f"seed {seed}", disable=not progress, leave=False)
    for it in bar:
        lr = get_lr(it, settings)
        for group in optimizer.param_groups:
            group["lr"] = lr
        if it % settings.eval_interval == 0 or it == settings.max_iters:  # and after the last iteration
            losses = estimate_loss(step_model, splits, config.block_size, settings.batch_size, settings.eval_iters,
                                   settings)
            history.append(dict(step=it, train_loss=losses["train"], val_loss=losses["val"]))
            bar.set_postfix(val_loss=f"{losses['val']:.4f}")
        if it == settings.max_iters:
            break  # train.py takes one more step after this evaluation; it changes no reported number
        step_start = time.perf_counter()
        with autocast(settings):
            _, loss = step_model(x, y)
        x, y = get_batch(train_data, config.block_size, settings.batch_size, settings.device)  # the next batch, now
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if settings.device.startswith("cuda"):
            torch.cuda.synchronize()
        train_s += time.perf_counter() - step_start
    if settings.device.startswith("cuda"):
        torch.cuda.synchronize()
    wall_s = time.perf_counter() - start
    final = estimate_loss(step_model, splits, config.block_size, settings.batch_size, settings.final_eval_iters,
                          settings)
    return dict(seed=seed, val_loss=history[-1]["val_loss"], train_loss=history[-1]["train_loss"],
                val_loss_final=final["val"], train_loss_final=final["train"], wall_s=wall_s, train_s=train_s,
                tokens_per_s=settings.max_iters * settings.batch_size * config.block_size / max(train_s, 1e-12),
                history=history,
                params=sum(p.numel() for p in model.parameters()))


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="cpu",
                        help="cpu: the README's CPU command (default); gpu: config/train_shakespeare_char.py on CUDA")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (train.py's GPU default)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1337], help="torch.manual_seed values (nanoGPT: 1337)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--data-dir", default=None, help="directory holding tinyshakespeare/input.txt "
                                                         "(default: MHA_DATA_DIR, else the download cache)")
    parser.add_argument("--max-iters", type=int, default=None, metavar="N",
                        help="a shortened run: N iterations, the cosine decay ending at N, the warmup at most N "
                             "(default: the recipe's, 2000 on the CPU, 5000 on the GPU)")
    parser.add_argument("--out", default=None, help="JSON file to write (default nanogpt-reference/results.json for "
                                                    "the CPU recipe, results-gpu.json for the GPU recipe; with "
                                                    "--max-iters N, results[-gpu]-iters<N>.json)")
    args = parser.parse_args(argv)
    config, settings = RECIPES[args.recipe]
    if args.compile:
        settings = replace(settings, compile=True)
    default_name = "results.json" if args.recipe == "cpu" else "results-gpu.json"
    if args.max_iters is not None:
        if args.max_iters < 1:
            parser.error(f"--max-iters must be an integer >= 1, got {args.max_iters}")
        settings = replace(settings, max_iters=args.max_iters, lr_decay_iters=args.max_iters,
                           warmup_iters=min(settings.warmup_iters, args.max_iters))
        default_name = default_name.replace(".json", f"-iters{args.max_iters}.json")
    args.out = args.out or str(Path(__file__).resolve().parent / "nanogpt-reference" / default_name)
    from mha.experiments.data import load_tinyshakespeare  # the checksum-verified text (downloaded once, or MHA_DATA_DIR)
    from mha.experiments.machine import cpu_model

    torch.set_num_threads(args.threads)
    text = load_tinyshakespeare(args.data_dir)
    out = Path(args.out)
    header = dict(description=__doc__.split("\n\n")[0], config=asdict(config), settings=asdict(settings),
                  threads=args.threads)
    if args.recipe == "cpu":  # the committed CPU results were written before these fields existed
        for key in ("dropout",):
            header["config"].pop(key)
        for key in ("device", "dtype", "compile"):
            header["settings"].pop(key)
    kept = []  # runs of other seeds already in the file (same recipe): a seed given here replaces its old run
    if out.exists():
        previous = json.loads(out.read_text())
        if any(previous.get(key) != value for key, value in header.items()):
            raise SystemExit(f"{out} holds runs of another configuration or thread count; choose another --out")
        kept = [run for run in previous["runs"] if run["seed"] not in args.seeds]
    runs = []
    for seed in tqdm(args.seeds, desc="seeds"):
        run = train_one(seed, text, replace(config, vocab_size=len(set(text))), settings)
        run.update(device_name=torch.cuda.get_device_name(0) if settings.device.startswith("cuda") else cpu_model(), torch_version=torch.__version__, python_version=platform.python_version(),
                   cpu_count=os.cpu_count(), load_average_1min=os.getloadavg()[0] if hasattr(os, "getloadavg") else None)
        runs.append(run)
        print(f"seed {seed}: step {run['history'][-1]['step']}: train loss {run['train_loss']:.4f}, "
              f"val loss {run['val_loss']:.4f} ({run['wall_s']:.1f} s)", flush=True)
        result = dict(header, runs=sorted(kept + runs, key=lambda r: (r["seed"] != 1337, r["seed"])))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")  # after every seed: an interrupted run keeps its seeds
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
