"""The run configuration: every setting of an experiment run, each defined, defaulted and checked in one place.

Book: part III (every sweep file sets these names; every ``results.csv`` row records them).

A run's configuration is composed of two parts and the run's own settings:

- :class:`ModelConfig`, the model's architecture (:class:`~mha.experiments.model.TransformerConfig` adds the task's
  ``vocab_size`` and ``block_size`` to it, and is what :class:`~mha.experiments.model.TinyTransformer` is built from);
  :class:`ModernModelConfig` adds the attention options of today's models (sliding windows with local/global layers,
  learned sink logits, RoPE; book part IV), and is the model part of the studies that may set them (``shakespeare``);
- :class:`TrainConfig`, the training (what :func:`mha.experiments.train.train` takes);
- :class:`RunConfig`: the task, those two parts (``config.model``, ``config.train``) and how to run. Each study adds
  its own settings in a subclass and may change a default: :class:`TrainRun` (one training run, optionally timing
  KV-cache decoding), :class:`HeadsRun` (what heads learn: patterns, redundancy, importance and pruning),
  :class:`DynamicsRun` (training dynamics: per-step gradient norms, score statistics, induction probes) and
  :class:`ShakespeareRun` (nanoGPT's character model, with a precise final loss and samples). The registry of the
  studies (name, configuration class, function) is :data:`mha.experiments.studies.STUDIES`.

Sweep files, ``results.csv`` and the notebooks' ``overrides`` use flat names (``task``, ``n_heads``, ``lr``,
``steps``, ...): each flat name is a field of exactly one part or of the run itself. :meth:`RunConfig.from_dict`
puts each where it belongs, over the study's defaults; :meth:`RunConfig.to_dict` gives the flat dict back (what a
results row records), and ``config.n_heads`` reads ``config.model.n_heads``. A sweep's ``run_id`` is a hash of the
flat names and values it sets, so it does not depend on how this module arranges them.

A setting added after results were committed is declared with :func:`since`: the value it names is the one every
earlier run had without a setting for it, and :meth:`RunConfig.to_dict` leaves the setting out while it has that
value. The configuration an earlier run recorded is then still exactly what the code gives for it now (the runner
compares the two as text), and a run that sets the new option records it. The value left out is fixed in
:func:`since`, not read from the current default: were the default changed later, runs at the new default would record
it, and the runner would see that the committed runs differ.

Every field is checked once, when its part is made: its type from its annotation, its range (an integer >= 1, a
real number >= 0, unless the field says otherwise), then the checks that involve more than one field. A bad value
raises an error naming the field (``TypeError`` for a wrong type, ``ValueError`` for a wrong value) before anything
is trained; a part made for a run names the run's class (``TrainRun.n_heads must be ...``).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import difflib
import functools
import types
import typing
from dataclasses import dataclass, field, fields, replace

from mha._checks import check_bool, check_choice, check_float, check_int, check_type, head_shape

__all__ = ["ModelConfig", "ModernModelConfig", "TrainConfig", "RunConfig", "TrainRun", "HeadsRun", "DynamicsRun",
           "ShakespeareRun", "PRECISIONS", "attn_impls", "since", "layer_windows"]

PRECISIONS = ("float32", "bfloat16")  # the trainer's forward passes: plain, or under torch.autocast(bfloat16)


@functools.cache
def attn_impls() -> tuple[str, ...]:
    """The attention paths a model of the experiments may take: :data:`mha.attention.IMPLS` without "triton".

    The Triton kernel (``mha.kernels``) never forms the attention weights, which the studies' analyses and probes
    read (``need_weights``), has no attention dropout and runs on CUDA only; it is benchmarked on its own
    (``python -m mha.bench``), not trained in a study. (A function, not a constant: ``mha.attention`` imports torch,
    and this module does not.)
    """
    from mha.attention import IMPLS

    return tuple(impl for impl in IMPLS if impl != "triton")


# ------------------------------------------------------------------------------------------------- the machinery
_OWNER = contextvars.ContextVar("mha_config_owner", default=None)  # the class a part's error messages name


@contextlib.contextmanager
def _named(owner: str):
    """Parts made inside name ``owner`` in their errors ("TrainRun.n_heads"), not their own class."""
    token = _OWNER.set(owner)
    try:
        yield
    finally:
        _OWNER.reset(token)


def bounded(default, **bounds):
    """A field with its own range: ``bounds`` are :func:`~mha._checks.check_int`'s or
    :func:`~mha._checks.check_float`'s keyword arguments, in place of the usual (an integer >= 1, a real number
    >= 0)."""
    return field(default=default, metadata={"bounds": bounds})


def since(value, **bounds):
    """A setting added after results were committed, with default ``value``: the value every earlier run had without
    a setting for it. :meth:`RunConfig.to_dict` records the setting only when it differs from ``value`` (see the
    module's docstring). ``bounds``: as :func:`bounded`'s, else the usual range."""
    metadata = {"unrecorded": value}
    if bounds:
        metadata["bounds"] = bounds
    return field(default=value, metadata=metadata)


def _unrecorded(f: dataclasses.Field, value) -> bool:
    """True when ``value`` of field ``f`` is the value that its :func:`since` leaves out of the recorded
    configuration (same type and value: ``0`` is not ``False``, ``1`` not ``1.0``)."""
    if "unrecorded" not in f.metadata:
        return False
    old = f.metadata["unrecorded"]
    return value is None if old is None else type(value) is type(old) and value == old


def part(cls, **defaults):
    """A field holding a part (a :class:`ModelConfig` or :class:`TrainConfig`); ``defaults``: the study's own
    defaults for some of its settings (the others keep the part's)."""
    return field(default_factory=functools.partial(cls, **defaults), metadata={"part": cls})


class _Checked:
    """What every configuration dataclass does when made: check each field (:func:`_check_field`: its annotation and
    range; a value is stored as checked, e.g. ``1`` as ``1.0`` for a float), then :meth:`_check_values`."""

    def __post_init__(self):
        owner = _OWNER.get() or type(self).__name__
        for f in fields(self):
            object.__setattr__(self, f.name, _check_field(owner, f, getattr(self, f.name)))
        self._check_values(owner)

    def _check_values(self, owner: str) -> None:
        """Checks that involve more than one field (and the values a type cannot say); errors name ``owner``."""


# ------------------------------------------------------------------------------------------------------ the parts
@dataclass(frozen=True)
class ModelConfig(_Checked):
    """The model's architecture: everything :class:`~mha.experiments.model.TinyTransformer` is built from but the
    task's sizes (:class:`~mha.experiments.model.TransformerConfig` adds ``vocab_size`` and ``block_size``)."""

    n_layers: int = 1  # transformer blocks
    d_model: int = 32  # width of the residual stream
    n_heads: int = 4  # h, query heads per layer
    n_kv_heads: int | None = None  # g, key/value heads; None: n_heads (MHA); 1: MQA; between: GQA
    head_dim: int | None = None  # size of one head; None: d_model // n_heads (set it to hold it fixed as h grows)
    mlp_ratio: int = 4  # the MLP's hidden width is mlp_ratio * d_model
    attention_only: bool = False  # no MLP blocks (attention-only transformer, for induction-head studies)
    scale_scores: bool = True  # False: scores not divided by sqrt(head_dim) (scale=1.0, the scaling ablation)
    # dropout on embeddings, attention weights and residual branches (in training mode only)
    dropout: float = bounded(0.0, minimum=0.0, maximum=1.0, max_inclusive=False)
    bias: bool = True  # biases in the Linear layers and LayerNorms
    attn_impl: str = "sdpa"  # MultiHeadAttention's path: "sdpa" (F.scaled_dot_product_attention) or "naive"

    def _check_values(self, owner: str) -> None:
        head_shape(self.d_model, self.n_heads, self.n_kv_heads, self.head_dim)  # g divides h, head_dim, ...
        check_choice(f"{owner}.attn_impl", self.attn_impl, attn_impls())


@dataclass(frozen=True)
class ModernModelConfig(ModelConfig):
    """:class:`ModelConfig` and the attention options of today's models (book part IV, "Sliding windows and attention
    sinks" and "Windows and sinks, measured"), each passed to :class:`mha.MultiHeadAttention`. With their defaults the
    model is exactly the :class:`ModelConfig` model (same modules, parameters and initialisation), and none of them is
    recorded (:func:`since`): the committed runs of the studies that take this part keep their configurations."""

    # the sliding window of the local layers: each query sees the `window` most recent keys, itself included (book
    # part IV's convention); None: no window, every layer global (full causal attention)
    window: int | None = since(None)
    # with a window, every global_every-th layer (layers k - 1, 2k - 1, ... for k = global_every) is global, the others
    # local: 2 alternates local, global, ... (gpt-oss), 6 is Gemma 3's five local layers per global one; None: every
    # layer local
    global_every: int | None = since(None)
    sinks: bool = since(False)  # one learned sink logit per head in every layer (gpt-oss's), starting at 0
    # RoPE with this base in every layer's heads, in place of the learned position table (10000 in Llama 2); None:
    # the learned absolute position embedding (nanoGPT's)
    rope_base: float | None = since(None, minimum=0.0, min_inclusive=False)
    # the output gate of gated attention (book part IV, "Gated attention"): each head's output times sigmoid(x W_gate)
    # before W_o, one gate per head ("headwise") or per coordinate ("elementwise"); None: no gate
    gate: str | None = since(None)
    # multi-head latent attention (book part IV, "Multi-head latent attention") in every layer: the size of the cached
    # latent c; the heads' keys and values are rebuilt from it (DeepSeek-V3's 512). Needs rope_base. None: per-head
    # keys and values (MHA, or GQA/MQA with n_kv_heads)
    kv_rank: int | None = since(None)
    # with kv_rank: the size of the one RoPE key all heads share (DeepSeek-V3's 64); None: head_dim // 2. Each head
    # scores with head_dim position-free coordinates plus these, and its values have head_dim coordinates
    qk_rope_head_dim: int | None = since(None)

    def _check_values(self, owner: str) -> None:
        super()._check_values(owner)
        if self.gate is not None:
            check_choice(f"{owner}.gate", self.gate, ("headwise", "elementwise"))
        if self.qk_rope_head_dim is not None and self.kv_rank is None:
            raise ValueError(f"{owner}.qk_rope_head_dim ({self.qk_rope_head_dim}) is a setting of latent attention: "
                             f"set kv_rank too")
        if self.kv_rank is not None:
            taken = {name: getattr(self, name) for name in ("n_kv_heads", "window", "sinks", "gate")
                     if getattr(self, name) not in (None, False)}
            if self.rope_base is None or taken:
                raise ValueError(f"{owner}.kv_rank ({self.kv_rank}): latent attention needs rope_base and takes none "
                                 f"of n_kv_heads, window, sinks, gate; got rope_base={self.rope_base}, {taken}")
            head_dim = self.head_dim or self.d_model // self.n_heads
            rope = head_dim // 2 if self.qk_rope_head_dim is None else self.qk_rope_head_dim
            if rope < 2 or rope % 2:
                raise ValueError(f"{owner}.qk_rope_head_dim must be an even number >= 2 (RoPE rotates pairs), got "
                                 f"{rope}")
        if self.global_every is not None:
            if self.window is None:
                raise ValueError(f"{owner}.global_every ({self.global_every}) needs a window: without one every layer "
                                 f"is global already")
            if not 2 <= self.global_every <= self.n_layers:
                raise ValueError(f"{owner}.global_every must be between 2 and n_layers ({self.n_layers}), got "
                                 f"{self.global_every}: 1 would make every layer global, more than n_layers none")
        if self.rope_base is not None:
            head_dim = self.head_dim or self.d_model // self.n_heads
            if head_dim % 2:
                raise ValueError(f"{owner}.rope_base needs an even head size (RoPE rotates pairs), got head_dim "
                                 f"{head_dim}")


def layer_windows(model: ModelConfig) -> list[int | None]:
    """Each layer's window, bottom to top: ``model.window`` for a local layer, None for a global one (every layer of a
    :class:`ModelConfig` without the options of :class:`ModernModelConfig` is global)."""
    window, every = getattr(model, "window", None), getattr(model, "global_every", None)
    return [None if window is None or (every is not None and (i + 1) % every == 0) else window
            for i in range(model.n_layers)]


@dataclass(frozen=True)
class TrainConfig(_Checked):
    """The training: nanoGPT's loop (:func:`mha.experiments.train.train`), its schedule and its evaluations."""

    steps: int = 60  # optimizer steps
    batch_size: int = 16  # sequences per step
    lr: float = 3e-3  # peak learning rate (after warmup)
    min_lr: float = 3e-4  # learning rate at the end of the cosine decay
    warmup_steps: int = bounded(10, minimum=0)  # linear warmup steps
    weight_decay: float = 0.1  # AdamW decoupled weight decay, on 2-D weights only
    beta1: float = bounded(0.9, minimum=0.0, maximum=1.0, max_inclusive=False)  # AdamW beta1
    beta2: float = bounded(0.95, minimum=0.0, maximum=1.0, max_inclusive=False)  # AdamW beta2 (nanoGPT's value)
    grad_clip: float = 1.0  # clip the global gradient norm to this; 0 disables
    eval_interval: int = 20  # evaluate every eval_interval steps (and after the last step)
    eval_batches: int = 4  # held-out batches per evaluation (the same batches every time)
    seed: int = bounded(0, minimum=0)  # seeds torch, numpy and random (model init) and the run's task
    device: str = "auto"  # "auto" (CUDA when present, else CPU), "cpu", "cuda", "cuda:1", ...
    precision: str = "float32"  # "float32", or "bfloat16": forward passes under torch.autocast (nanoGPT's GPU recipe)
    # early stopping: stop once this many evaluations in a row have not lowered the best validation loss so far (the
    # run then reports best_val_loss and best_step too); None: run every step
    patience: int | None = since(None)

    def _check_values(self, owner: str) -> None:
        if self.warmup_steps > self.steps:
            raise ValueError(f"{owner}.warmup_steps ({self.warmup_steps}) must be <= steps ({self.steps})")
        if self.min_lr > self.lr:
            raise ValueError(f"{owner}.min_lr ({self.min_lr}) must be <= lr ({self.lr})")
        check_choice(f"{owner}.precision", self.precision, PRECISIONS)
        from mha.experiments.machine import resolve_device  # the syntax; whether it exists is checked at run time

        try:
            resolve_device(self.device)
        except ValueError as error:
            raise ValueError(f"{owner}.device: {error}") from None


# --------------------------------------------------------------------------------------------------------- a run
@dataclass(frozen=True)
class RunConfig(_Checked):
    """A run: the task, the model (``model``, a :class:`ModelConfig`), the training (``train``, a
    :class:`TrainConfig`) and how to run.

    Build one from flat settings with :meth:`from_dict` (as a sweep does): each setting it is not given keeps the
    study's default. A part passed whole (``TrainRun(train=TrainConfig(lr=1e-3))``) replaces the study's default
    part whole, its other settings included.
    """

    task: str = "two_offset"  # 'recall', 'induction', 'induction_varying', 'two_offset' or 'shakespeare'
    task_kwargs: dict = field(default_factory=dict)  # the task's further arguments, e.g. {"vocab_size": 8}
    model: ModelConfig = part(ModelConfig)  # the model; vocab_size and block_size come from the task
    train: TrainConfig = part(TrainConfig)  # the training; its seed seeds the task too
    threads: int = 1  # torch CPU threads (a parallel sweep runs one run per core)
    progress: bool = False  # tqdm progress bar during training

    study = "run"  # the study this config is for (a class attribute, not a field)

    def _check_values(self, owner: str) -> None:
        from mha.experiments import tasks  # the task registry (imports torch)

        check_choice(f"{owner}.task", self.task, sorted(tasks.TASKS))
        unknown = sorted(set(self.task_kwargs) - set(tasks.task_arguments(self.task)))
        if unknown:
            raise ValueError(f"{owner}.task_kwargs has key(s) {unknown} that task {self.task!r} does not take; its "
                             f"arguments are {tasks.task_arguments(self.task)} (seed comes from {owner}.seed)")
        try:  # the task's arguments' values too (building a synthetic task is cheap; Shakespeare reads no data)
            tasks.check_task(self.task, **self.task_kwargs_with_seed())
        except (TypeError, ValueError) as error:
            raise type(error)(f"{owner}.task_kwargs: task {self.task!r}: {error}") from None

    # ----------------------------------------------------------------------------------------- the flat settings
    @classmethod
    def settings(cls) -> dict[str, str | None]:
        """Every flat setting name, in order, and where it lives: "model", "train", or None (the run itself)."""
        return _layout(cls)

    @classmethod
    def from_dict(cls, values: dict):
        """Build from flat settings (a sweep's names); the others keep the study's defaults. An unknown name is a
        ValueError that names it (and suggests the closest setting)."""
        check_type("values", values, dict, "a dict of setting names to values")
        layout = cls.settings()
        for key in values:
            if key not in layout:
                close = difflib.get_close_matches(str(key), list(layout), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"{key!r} is not a setting of {cls.__name__} (study {cls.study!r}){hint}; its "
                                 f"settings are {list(layout)}")
        own = {}
        for f in fields(cls):
            if "part" in f.metadata:
                default = _default_part(cls, f.name)
                changes = {k: v for k, v in values.items() if layout[k] == f.name}
                with _named(cls.__name__):
                    own[f.name] = replace(default, **changes) if changes else default
            elif f.name in values:
                own[f.name] = values[f.name]
        return cls(**own)

    def to_dict(self) -> dict:
        """Every flat setting and its value, in :meth:`settings`' order (what a results row records as the run's
        configuration); a setting declared with :func:`since` only where it differs from the value it names."""
        flat = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if "part" in f.metadata:
                flat.update((g.name, getattr(value, g.name)) for g in fields(value)
                            if not _unrecorded(g, getattr(value, g.name)))
            elif not _unrecorded(f, value):
                flat[f.name] = value
        return flat

    # ----------------------------------------------------------------------------------------- building blocks
    def task_kwargs_with_seed(self) -> dict:
        """The task's keyword arguments: ``task_kwargs`` and the seed."""
        return {**self.task_kwargs, "seed": self.train.seed}

    def make_task(self):
        """The task (seeded by ``seed``)."""
        from mha.experiments.tasks import make_task

        return make_task(self.task, **self.task_kwargs_with_seed())

    def model_config(self, task):
        """The :class:`~mha.experiments.model.TransformerConfig` of ``model`` for ``task`` (its vocab_size and
        block_size)."""
        from mha.experiments.model import TransformerConfig

        return TransformerConfig.for_task(self.model, task)


def _read_through(part_name: str, name: str) -> property:
    return property(lambda self: getattr(getattr(self, part_name), name),
                    doc=f"``{part_name}.{name}``, by its flat name (as sweep files and results.csv name it).")


for _part, _cls in (("model", ModelConfig), ("train", TrainConfig)):  # config.n_heads reads config.model.n_heads
    for _f in fields(_cls):
        setattr(RunConfig, _f.name, _read_through(_part, _f.name))


@functools.cache
def _default_part(cls, name: str):
    """The study's default part ``name`` (made and checked once: a part is frozen, so it can be shared)."""
    return next(f for f in fields(cls) if f.name == name).default_factory()


@functools.cache
def _layout(cls) -> dict[str, str | None]:
    layout = {}
    for f in fields(cls):
        names = [g.name for g in fields(f.metadata["part"])] if "part" in f.metadata else [f.name]
        for name in names:
            if name in layout:  # a study's field named like a part's: the flat names would be ambiguous
                raise TypeError(f"{cls.__name__}: setting {name!r} is defined twice")
            layout[name] = f.name if "part" in f.metadata else None
    return layout


# -------------------------------------------------------------------------------------------------- the studies
@dataclass(frozen=True)
class TrainRun(RunConfig):
    """One training run (``experiments/notebooks/train.ipynb``); optionally times KV-cache decoding afterwards."""

    measure_decode: bool = False  # also time KV-cache decoding (decode_s_per_token)
    decode_len: int = bounded(0, minimum=0)  # positions (prompt + generated) when timing decoding; 0: block_size
    decode_batch_size: int = 1  # sequences decoded together when timing decoding

    study = "train"


@dataclass(frozen=True)
class HeadsRun(RunConfig):
    """What heads learn (``heads.ipynb``): patterns and classes, redundancy, importance and pruning."""

    task: str = "induction"
    model: ModelConfig = part(ModelConfig, n_layers=2)
    analysis_batch_size: int = 16  # sequences per held-out analysis batch
    induction_periods: list | None = None  # repeat lengths for the induction score; None: 4, 8, ... (block + 1) // 2
    importance_batches: int = 1  # held-out batches for the head importance
    prune_eval_batches: int = 2  # held-out batches on which the pruned models are evaluated
    random_orders: int = 2  # random pruning orders (the baseline), seeds seed, seed + 1, ...
    prune_tolerance: float = 0.01  # "no noticeable loss": accuracy within this (loss within 1% without accuracy)

    study = "heads"

    def _check_values(self, owner: str) -> None:
        super()._check_values(owner)
        for i, period in enumerate(self.induction_periods or ()):
            check_int(f"{owner}.induction_periods[{i}]", period, minimum=2)


@dataclass(frozen=True)
class DynamicsRun(RunConfig):
    """Training dynamics (``dynamics.ipynb``): per-step gradient norms, score statistics and, on repeat tasks,
    the loss on each half, induction scores and head ablations, probed at step 0 and at every evaluation."""

    task: str = "induction"
    task_kwargs: dict = field(default_factory=lambda: {"vocab_size": 32, "seq_len": 16})
    model: ModelConfig = part(ModelConfig, n_layers=2, attention_only=True)
    # a loss spike: a step's loss more than spike_sigmas standard deviations above the mean of the previous
    # spike_window steps (counted after warmup)
    spike_window: int = 50
    spike_sigmas: float = bounded(5.0, minimum=0.0, min_inclusive=False)
    save_attention: bool = False  # also save the most induction-like heads' final attention on one sequence

    study = "dynamics"


@dataclass(frozen=True)
class ShakespeareRun(RunConfig):
    """nanoGPT's character-level Tiny Shakespeare (``shakespeare.ipynb``): training, a precise final loss on many
    batches, and samples. The defaults are smoke-sized; the sweep files set nanoGPT's configurations."""

    task: str = "shakespeare"
    # nanoGPT's default: no biases; the attention options of part IV may be set (ModernModelConfig)
    model: ModernModelConfig = part(ModernModelConfig, n_layers=1, n_heads=2, bias=False)
    # steps: nanoGPT's max_iters and lr_decay_iters; eval_batches: its eval_iters
    train: TrainConfig = part(TrainConfig, steps=30, batch_size=8, lr=1e-3, min_lr=1e-4, warmup_steps=5, beta2=0.99,
                              eval_interval=10, eval_batches=2)
    block_size: int = 32  # characters per sequence (the task's and the model's context)
    final_eval_batches: int = 4  # batches for the final, more precise validation and training loss
    sample_chars: int = 50  # characters per generated sample
    sample_temperature: float = bounded(0.8, minimum=0.0, min_inclusive=False)  # nanoGPT's sample.py default
    sample_top_k: int = 200  # nanoGPT's sample.py default (more than the 65 characters: no truncation)
    # held-out batches on which, after training, each head's attention to the first position and its sink logit's
    # share are measured (mha.experiments.probes.first_token_attention; queries in the second half of the context);
    # 0: not measured
    sink_probe_batches: int = since(0, minimum=0)

    study = "shakespeare"

    def _check_values(self, owner: str) -> None:
        check_choice(f"{owner}.task", self.task, ("shakespeare",))
        if "block_size" in self.task_kwargs:
            raise ValueError(f"{owner}: set block_size, not task_kwargs['block_size']")
        super()._check_values(owner)

    def task_kwargs_with_seed(self) -> dict:
        return {**self.task_kwargs, "block_size": self.block_size, "seed": self.train.seed}


for _f in fields(ModernModelConfig):  # config.window reads config.model.window (the studies whose part has it)
    if not hasattr(ShakespeareRun, _f.name):
        setattr(ShakespeareRun, _f.name, _read_through("model", _f.name))


# ------------------------------------------------------------------------------------------------ field checks
_DEFAULT_BOUNDS = {int: {"minimum": 1}, float: {"minimum": 0.0}}  # an integer >= 1, a real number >= 0


def _check_field(owner: str, f: dataclasses.Field, value):
    """Check one field against its annotation (int, float, bool, str, dict, list, each optionally ``| None``, or a
    part) and its range; return the value to store."""
    name = f"{owner}.{f.name}"
    if "part" in f.metadata:
        cls = f.metadata["part"]
        if type(value) is not cls:  # a TransformerConfig is not a run's model: the task gives its sizes
            raise TypeError(f"{name} must be a {cls.__name__}, got {type(value).__name__}")
        return value  # checked when it was made
    kinds = _annotation_kinds(f.type)
    if value is None:
        if type(None) in kinds:
            return None
        raise TypeError(f"{name} must not be None (expected {_describe(kinds)})")
    if int in kinds and float not in kinds:
        return check_int(name, value, **f.metadata.get("bounds", _DEFAULT_BOUNDS[int]))
    if float in kinds:
        return check_float(name, value, **f.metadata.get("bounds", _DEFAULT_BOUNDS[float]))
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


@functools.cache
def _annotation_kinds(annotation) -> frozenset:
    """The types an annotation (a string, with ``from __future__ import annotations``) admits."""
    if isinstance(annotation, str):
        return frozenset(_ANNOTATIONS[kind.strip()] for kind in annotation.split("|"))
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return frozenset(typing.get_args(annotation))
    return frozenset({annotation})


def _describe(kinds) -> str:
    return " or ".join(sorted(k.__name__ for k in kinds))
