"""The run configuration: one typed, self-checking record of every setting an experiment run takes.

Book: part III (every sweep file sets these names; every ``results.csv`` row records them).

:class:`RunConfig` holds what every study shares: the task, the model (:class:`~mha.experiments.model.TransformerConfig`),
the training (:class:`~mha.experiments.train.TrainConfig`) and how to run. Each study adds its own settings in a
subclass and may change a default: :class:`TrainRun` (one training run, optionally timing KV-cache decoding),
:class:`HeadsRun` (what heads learn: patterns, redundancy, importance and pruning), :class:`DynamicsRun` (training
dynamics: per-step gradient norms, score statistics, induction probes) and :class:`ShakespeareRun` (nanoGPT's
character model, with a precise final loss and samples). The names are the flat parameter names of the sweep files,
so a sweep's ``run_id`` (a hash of the names and values it sets) does not depend on this module.

Every field is checked when the config is made: an unknown name, a wrong type or a bad value raises an error naming
the field (``TypeError`` for a wrong type, ``ValueError`` for a wrong value), before anything is trained.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field, fields

from mha._checks import check_bool, check_choice, check_float, check_int, check_type, head_shape

__all__ = ["RunConfig", "TrainRun", "HeadsRun", "DynamicsRun", "ShakespeareRun", "STUDY_CONFIGS", "make_config"]

ATTN_IMPLS = ("sdpa", "naive")


@dataclass(frozen=True)
class RunConfig:
    # Task (mha.experiments.tasks.make_task)
    task: str = "two_offset"  # 'recall', 'induction', 'induction_varying', 'two_offset' or 'shakespeare'
    task_kwargs: dict = field(default_factory=dict)  # the task's further arguments, e.g. {"vocab_size": 8}
    # Model (mha.experiments.model.TransformerConfig); vocab_size and block_size come from the task
    n_layers: int = 1  # transformer blocks
    d_model: int = 32  # width of the residual stream
    n_heads: int = 4  # h, query heads per layer
    n_kv_heads: int | None = None  # g, key/value heads; None: n_heads (MHA); 1: MQA; between: GQA
    head_dim: int | None = None  # size of one head; None: d_model // n_heads
    mlp_ratio: int = 4  # the MLP's hidden width is mlp_ratio * d_model
    attention_only: bool = False  # no MLP blocks
    scale_scores: bool = True  # False: scores not divided by sqrt(head_dim) (the scaling ablation)
    dropout: float = 0.0  # dropout on embeddings, attention weights and residual branches
    bias: bool = True  # biases in the Linear layers and LayerNorms
    attn_impl: str = "sdpa"  # "sdpa" or "naive" (mha.MultiHeadAttention's paths)
    # Training (mha.experiments.train.TrainConfig)
    steps: int = 60  # optimizer steps
    batch_size: int = 16  # sequences per step
    lr: float = 3e-3  # peak learning rate
    min_lr: float = 3e-4  # learning rate at the end of the cosine decay
    warmup_steps: int = 10  # linear warmup steps
    weight_decay: float = 0.1  # AdamW weight decay (2-D weights only)
    beta1: float = 0.9  # AdamW beta1
    beta2: float = 0.95  # AdamW beta2
    grad_clip: float = 1.0  # clip the global gradient norm to this; 0 disables
    eval_interval: int = 20  # evaluate every eval_interval steps (and after the last)
    eval_batches: int = 4  # held-out batches per evaluation
    seed: int = 0  # seeds the task's batches and the model's initialisation
    device: str = "auto"  # "auto" (CUDA when present), "cpu", "cuda", "cuda:1", ...
    precision: str = "float32"  # "float32", or "bfloat16" (forward passes under torch.autocast, for GPUs)
    # Running
    threads: int = 1  # torch CPU threads (a parallel sweep runs one run per core)
    progress: bool = False  # tqdm progress bar during training

    study = "run"  # the study this config is for (a class attribute, not a field)

    def __post_init__(self):
        for f in fields(self):
            value = _check_field(type(self).__name__, f, getattr(self, f.name))
            object.__setattr__(self, f.name, value)
        self._check_values()

    def _check_values(self) -> None:
        """Checks that involve more than one field (and the values a type cannot say)."""
        from mha.experiments import tasks  # the task registry (imports torch)

        name = type(self).__name__
        check_choice(f"{name}.task", self.task, sorted(tasks.TASKS))
        unknown = sorted(set(self.task_kwargs) - set(tasks.task_arguments(self.task)))
        if unknown:
            raise ValueError(f"{name}.task_kwargs has key(s) {unknown} that task {self.task!r} does not take; its "
                             f"arguments are {tasks.task_arguments(self.task)} (seed comes from {name}.seed)")
        try:  # the task's arguments' values too (building a synthetic task is cheap; Shakespeare reads no data)
            tasks.check_task(self.task, **self.task_kwargs_with_seed())
        except (TypeError, ValueError) as error:
            raise type(error)(f"{name}.task_kwargs: task {self.task!r}: {error}") from None
        head_shape(self.d_model, self.n_heads, self.n_kv_heads, self.head_dim)
        check_choice(f"{name}.attn_impl", self.attn_impl, ATTN_IMPLS)
        from mha.experiments.machine import resolve_device  # the syntax; whether it exists is checked at run time

        try:
            resolve_device(self.device)
        except ValueError as error:
            raise ValueError(f"{name}.device: {error}") from None
        check_float(f"{name}.dropout", self.dropout, minimum=0.0, maximum=1.0, max_inclusive=False)
        self.train_config()  # TrainConfig checks the training fields (warmup <= steps, min_lr <= lr, ...)

    # ----------------------------------------------------------------------------------------- building blocks
    def task_kwargs_with_seed(self) -> dict:
        """The task's keyword arguments: ``task_kwargs`` and the seed."""
        return {**self.task_kwargs, "seed": self.seed}

    def make_task(self):
        """The task (seeded by ``seed``)."""
        from mha.experiments.tasks import make_task

        return make_task(self.task, **self.task_kwargs_with_seed())

    def model_config(self, task):
        """The :class:`TransformerConfig` for ``task`` (its vocab_size and block_size)."""
        from mha.experiments.model import TransformerConfig

        return TransformerConfig(
            vocab_size=task.vocab_size, block_size=task.block_size, n_layers=self.n_layers, d_model=self.d_model,
            n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, head_dim=self.head_dim, mlp_ratio=self.mlp_ratio,
            attention_only=self.attention_only, scale_scores=self.scale_scores, dropout=self.dropout,
            bias=self.bias, attn_impl=self.attn_impl)

    def train_config(self):
        """The :class:`TrainConfig` of these settings."""
        from mha.experiments.train import TrainConfig

        return TrainConfig(
            steps=self.steps, batch_size=self.batch_size, lr=self.lr, min_lr=self.min_lr,
            warmup_steps=self.warmup_steps, weight_decay=self.weight_decay, beta1=self.beta1, beta2=self.beta2,
            grad_clip=self.grad_clip, eval_interval=self.eval_interval, eval_batches=self.eval_batches,
            seed=self.seed, device=self.device, precision=self.precision)

    def to_dict(self) -> dict:
        """Every field and its value (what a results row records as the run's parameters)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, values: dict):
        """Build from a mapping of field names; an unknown name is a ValueError that names it (and suggests the
        closest field)."""
        check_type("values", values, dict, "a dict of field names to values")
        names = [f.name for f in fields(cls)]
        for key in values:
            if key not in names:
                close = difflib.get_close_matches(str(key), names, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"{key!r} is not a setting of {cls.__name__} (study {cls.study!r}){hint}; its "
                                 f"settings are {names}")
        return cls(**values)


# -------------------------------------------------------------------------------------------------- the studies
@dataclass(frozen=True)
class TrainRun(RunConfig):
    """One training run (``experiments/notebooks/train.ipynb``); optionally times KV-cache decoding afterwards."""

    measure_decode: bool = False  # also time KV-cache decoding (decode_s_per_token)
    decode_len: int = 0  # positions (prompt + generated) when timing decoding; 0: the task's block_size
    decode_batch_size: int = 1  # sequences decoded together when timing decoding

    study = "train"


@dataclass(frozen=True)
class HeadsRun(RunConfig):
    """What heads learn (``heads.ipynb``): patterns and classes, redundancy, importance and pruning."""

    task: str = "induction"
    n_layers: int = 2
    analysis_batch_size: int = 16  # sequences per held-out analysis batch
    induction_periods: list | None = None  # repeat lengths for the induction score; None: 4, 8, ... (block + 1) // 2
    importance_batches: int = 1  # held-out batches for the head importance
    prune_eval_batches: int = 2  # held-out batches on which the pruned models are evaluated
    random_orders: int = 2  # random pruning orders (the baseline), seeds seed, seed + 1, ...
    prune_tolerance: float = 0.01  # "no noticeable loss": accuracy within this (loss within 1% without accuracy)

    study = "heads"

    def _check_values(self) -> None:
        super()._check_values()
        if self.induction_periods is not None:
            for i, period in enumerate(self.induction_periods):
                check_int(f"{type(self).__name__}.induction_periods[{i}]", period, minimum=2)
        check_float(f"{type(self).__name__}.prune_tolerance", self.prune_tolerance, minimum=0.0)


@dataclass(frozen=True)
class DynamicsRun(RunConfig):
    """Training dynamics (``dynamics.ipynb``): per-step gradient norms, score statistics and, on repeat tasks,
    the loss on each half, induction scores and head ablations, probed at step 0 and at every evaluation."""

    task: str = "induction"
    task_kwargs: dict = field(default_factory=lambda: {"vocab_size": 32, "seq_len": 16})
    n_layers: int = 2
    attention_only: bool = True
    spike_window: int = 50  # a loss spike: a step's loss more than spike_sigmas standard deviations above
    spike_sigmas: float = 5.0  # the mean of the previous spike_window steps (counted after warmup)
    save_attention: bool = False  # also save the most induction-like heads' final attention on one sequence

    study = "dynamics"

    def _check_values(self) -> None:
        super()._check_values()
        check_float(f"{type(self).__name__}.spike_sigmas", self.spike_sigmas, minimum=0.0, min_inclusive=False)


@dataclass(frozen=True)
class ShakespeareRun(RunConfig):
    """nanoGPT's character-level Tiny Shakespeare (``shakespeare.ipynb``): training, a precise final loss on many
    batches, and samples. The defaults are smoke-sized; the sweep files set nanoGPT's configurations."""

    task: str = "shakespeare"
    n_layers: int = 1
    n_heads: int = 2
    block_size: int = 32  # characters per sequence (the task's and the model's context)
    bias: bool = False  # nanoGPT's default: no biases
    steps: int = 30  # nanoGPT's max_iters and lr_decay_iters
    batch_size: int = 8
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 5
    beta2: float = 0.99
    eval_interval: int = 10
    eval_batches: int = 2  # nanoGPT's eval_iters
    final_eval_batches: int = 4  # batches for the final, more precise validation and training loss
    sample_chars: int = 50  # characters per generated sample
    sample_temperature: float = 0.8  # nanoGPT's sample.py default
    sample_top_k: int = 200  # nanoGPT's sample.py default (more than the 65 characters: no truncation)

    study = "shakespeare"

    def _check_values(self) -> None:
        name = type(self).__name__
        check_choice(f"{name}.task", self.task, ("shakespeare",))
        if "block_size" in self.task_kwargs:
            raise ValueError(f"{name}: set block_size, not task_kwargs['block_size']")
        super()._check_values()
        check_float(f"{name}.sample_temperature", self.sample_temperature, minimum=0.0, min_inclusive=False)

    def task_kwargs_with_seed(self) -> dict:
        return {**self.task_kwargs, "block_size": self.block_size, "seed": self.seed}


STUDY_CONFIGS = {cls.study: cls for cls in (TrainRun, HeadsRun, DynamicsRun, ShakespeareRun)}
"""study name -> its configuration class."""


def make_config(study: str, values: dict) -> RunConfig:
    """The configuration of ``study`` ('train', 'heads', 'dynamics', 'shakespeare') from flat ``values``."""
    check_choice("study", study, sorted(STUDY_CONFIGS))
    return STUDY_CONFIGS[study].from_dict(values)


# ------------------------------------------------------------------------------------------------ field checks
def _check_field(owner: str, f: dataclasses.Field, value):
    """Check one field against its annotation: int, float, bool, str, dict, list, each optionally ``| None``."""
    name = f"{owner}.{f.name}"
    kinds = _annotation_kinds(f.type)
    if value is None:
        if type(None) in kinds:
            return None
        raise TypeError(f"{name} must not be None (expected {_describe(kinds)})")
    if int in kinds and float not in kinds:
        return check_int(name, value, minimum=_minimum(f.name))
    if float in kinds:
        return check_float(name, value, minimum=0.0)
    if bool in kinds:
        return check_bool(name, value)
    if str in kinds:
        return check_type(name, value, str, "a string")
    if dict in kinds:
        value = check_type(name, value, dict, "a mapping (e.g. {vocab_size: 8} in a sweep file)")
        for key in value:
            check_type(f"{name} key {key!r}", key, str, "a string")
        return dict(value)
    if list in kinds:
        return list(check_type(name, value, (list, tuple), "a list"))
    raise AssertionError(f"no check for {name}'s annotation {f.type!r}")  # a field added without a check


_ANNOTATIONS = {"int": int, "float": float, "bool": bool, "str": str, "dict": dict, "list": list, "None": type(None)}


def _annotation_kinds(annotation) -> set:
    """The types an annotation (a string, with ``from __future__ import annotations``) admits."""
    if isinstance(annotation, str):
        return {_ANNOTATIONS[part.strip()] for part in annotation.split("|")}
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return set(typing.get_args(annotation))
    return {annotation}


def _describe(kinds) -> str:
    return " or ".join(sorted(k.__name__ for k in kinds))


_MINIMUM_ZERO = {"warmup_steps", "seed", "decode_len"}


def _minimum(field_name: str) -> int:
    """Integer fields are >= 1, but for counts that may be zero."""
    return 0 if field_name in _MINIMUM_ZERO else 1
