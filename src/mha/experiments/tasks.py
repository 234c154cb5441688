"""Tasks for the experiments: batches ``(x, y)`` of token ids, deterministic given a seed.

Book: part III (experiments): "Head count", "MHA, GQA and MQA in training" (associative recall, two-offset lookup),
"Induction heads" (repeated sequences, with a fixed or a varying period), "A nanoGPT-comparable character model"
(Tiny Shakespeare, read through :mod:`mha.experiments.data`).

Every task has ``vocab_size``, ``block_size`` (the length of x), ``has_accuracy`` and
``get_batch(split, batch_size, device=None) -> (x, y)``: two int64 tensors of shape (batch_size, block_size), y the
target at each position of x, or -100 where the position is not scored (cross-entropy's ``ignore_index``).
Accuracy, where a task has one, is the fraction of scored positions whose target is the logits' argmax
(:func:`accuracy`). Each split ("train", "val") draws from its own random stream, seeded by (seed, split), so the
validation batches are held out from training and the same seed gives the same batches.
"""

from __future__ import annotations

import functools
import inspect
import os

import numpy as np
import torch

from mha._checks import check_choice, check_int, check_type
from mha.experiments.data import load_tinyshakespeare

__all__ = ["Task", "AssociativeRecall", "RepeatedSequence", "VaryingPeriodRepeat", "TwoOffsetLookup", "Shakespeare",
           "make_task", "check_task", "task_arguments", "periods_of", "accuracy", "IGNORE", "TASKS"]

IGNORE = -100  # target id of an unscored position (F.cross_entropy's default ignore_index)
SPLITS = ("train", "val")


def accuracy(logits: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of scored positions (y != -100) where argmax(logits) equals y; logits (..., V), y (...)."""
    scored = y != IGNORE
    if not bool(scored.any()):
        raise ValueError("y has no scored position (every entry is -100): accuracy is undefined")
    correct = (logits.argmax(dim=-1) == y) & scored
    return (correct.sum() / scored.sum()).item()


class Task:
    """Base class: a seeded source of (x, y) batches. Subclasses set the attributes and implement ``_sample``."""

    name: str = ""  # the make_task name
    vocab_size: int  # token ids are in [0, vocab_size)
    block_size: int  # length of x and y
    has_accuracy: bool = True  # whether exact-match accuracy on the scored positions is meaningful

    def __init__(self, seed: int = 0):
        check_int("seed", seed, minimum=0)
        self.seed = seed
        self._generators: dict[str, torch.Generator] = {}

    def generator(self, split: str) -> torch.Generator:
        """The split's random stream (created on first use from (seed, split)); batches advance it."""
        check_choice("split", split, SPLITS)
        if split not in self._generators:
            state = np.random.SeedSequence([self.seed, SPLITS.index(split)]).generate_state(1, dtype=np.uint64)[0]
            self._generators[split] = torch.Generator().manual_seed(int(state))
        return self._generators[split]

    def get_batch(self, split: str, batch_size: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch of the split's stream: x, y each (batch_size, block_size) int64, y = -100 unscored."""
        check_int("batch_size", batch_size)
        x, y = self._sample(batch_size, self.generator(split), split)
        return x.to(device), y.to(device)

    def _sample(self, batch_size: int, generator: torch.Generator, split: str):
        raise NotImplementedError

    def config(self) -> dict:
        """The task's name and constructor arguments (for metrics files)."""
        return {"name": self.name, **self._kwargs}


def _distinct(batch_size: int, population: int, count: int, generator: torch.Generator) -> torch.Tensor:
    """(batch_size, count) ids drawn without replacement from range(population), independently per row."""
    return torch.rand(batch_size, population, generator=generator).argsort(dim=1)[:, :count]


class AssociativeRecall(Task):
    """Multi-query associative recall (MQAR; Arora et al. 2023, "Zoology").

    A sequence is ``num_kv_pairs`` key-value pairs ``k_1 v_1 ... k_P v_P`` followed by ``num_queries`` queries
    ``q_1 a_1 ... q_Q a_Q``, each q_i one of the keys (distinct) and a_i its value. Keys are drawn from the first
    half of the vocabulary, values from the second half, without repetition within a sequence. x is the sequence
    without its last token and y the next token, scored only where the next token is an answer a_i (right after
    the query key). Unlike Zoology the queries follow the pairs directly (no filler tokens between them).
    block_size = 2 (num_kv_pairs + num_queries) - 1.
    """

    name = "recall"
    has_accuracy = True

    def __init__(self, vocab_size: int = 64, num_kv_pairs: int = 8, num_queries: int | None = None, seed: int = 0):
        super().__init__(seed)
        num_queries = num_kv_pairs if num_queries is None else num_queries
        check_int("vocab_size", vocab_size, minimum=2)
        check_int("num_kv_pairs", num_kv_pairs)
        check_int("num_queries", num_queries)
        if num_kv_pairs > vocab_size // 2:
            raise ValueError(f"num_kv_pairs ({num_kv_pairs}) must be <= vocab_size // 2 ({vocab_size // 2}): "
                             f"keys and values are distinct ids from each half of the vocabulary")
        if num_queries > num_kv_pairs:
            raise ValueError(f"num_queries ({num_queries}) must be <= num_kv_pairs ({num_kv_pairs}): each query "
                             f"asks for a different key")
        self.vocab_size = vocab_size
        self.num_kv_pairs = num_kv_pairs
        self.num_queries = num_queries
        self.block_size = 2 * (num_kv_pairs + num_queries) - 1
        self._kwargs = dict(vocab_size=vocab_size, num_kv_pairs=num_kv_pairs, num_queries=num_queries, seed=seed)

    def _sample(self, batch_size, generator, split):
        n, p, q, half = batch_size, self.num_kv_pairs, self.num_queries, self.vocab_size // 2
        keys = _distinct(n, half, p, generator)  # (N, P) in [0, half)
        values = half + _distinct(n, self.vocab_size - half, p, generator)  # (N, P) in [half, vocab_size)
        asked = _distinct(n, p, q, generator)  # (N, Q): which pairs are queried
        pairs = torch.stack([keys, values], dim=2).view(n, 2 * p)  # (N, 2P): k_1 v_1 k_2 v_2 ...
        queries = torch.stack([keys.gather(1, asked), values.gather(1, asked)], dim=2).view(n, 2 * q)  # (N, 2Q)
        seq = torch.cat([pairs, queries], dim=1)  # (N, 2P + 2Q)
        x, y = seq[:, :-1], seq[:, 1:].clone()  # (N, block_size) each
        answer = torch.zeros(self.block_size, dtype=torch.bool)
        answer[2 * p::2] = True  # x holds a query key there; y the answer
        y[:, ~answer] = IGNORE
        return x.contiguous(), y


class RepeatedSequence(Task):
    """A random sequence of ``seq_len`` tokens followed by its exact repeat (Olsson et al. 2022, induction heads).

    x is the 2 seq_len tokens without the last one (block_size = 2 seq_len - 1) and y the next token. Positions
    t >= ``split`` (= seq_len) predict tokens of the second copy whose predecessor already occurred: only an
    induction mechanism (find the previous occurrence of the current token, copy what followed) predicts them.
    Positions t < split - 1 predict tokens of the random first copy: chance. Position split - 1 predicts the
    copy's first token, x[0]: no token before it predicts it, but the period is fixed, so a head that attends to
    position 0 can copy it (by position, not by induction); it is counted with the first half.
    ``score="repeat"`` (default) scores the repeated half only; ``score="all"`` scores every position, so
    :meth:`split_losses` can compare the loss on the first half with the loss on the repeat.
    """

    name = "induction"
    has_accuracy = True

    def __init__(self, vocab_size: int = 32, seq_len: int = 16, score: str = "repeat", seed: int = 0):
        super().__init__(seed)
        check_int("vocab_size", vocab_size, minimum=2)
        check_int("seq_len", seq_len, minimum=2)
        check_choice("score", score, ("repeat", "all"))
        self.vocab_size = vocab_size
        self.seq_len = seq_len
        self.score = score
        self.split = seq_len  # positions t >= split are the repeat
        self.block_size = 2 * seq_len - 1
        self._kwargs = dict(vocab_size=vocab_size, seq_len=seq_len, score=score, seed=seed)

    def _sample(self, batch_size, generator, split):
        first = torch.randint(self.vocab_size, (batch_size, self.seq_len), generator=generator)  # (N, T)
        seq = torch.cat([first, first], dim=1)  # (N, 2T)
        x, y = seq[:, :-1], seq[:, 1:].clone()  # (N, 2T - 1) each
        if self.score == "repeat":
            y[:, :self.split] = IGNORE
        return x.contiguous(), y

    def split_losses(self, logits: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        """Mean cross-entropy on the first half (t < split) and on the repeat (t >= split); y from score='all'."""
        losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), y, ignore_index=IGNORE,
                                                   reduction="none")  # (N, block_size)
        scored = y != IGNORE
        if not bool(scored[:, :self.split].any()):
            raise ValueError("y scores no position of the first half: build the task with score='all'")
        halves = [(losses[:, s] * scored[:, s]).sum() / scored[:, s].sum()
                  for s in (slice(0, self.split), slice(self.split, None))]
        return halves[0].item(), halves[1].item()


class VaryingPeriodRepeat(RepeatedSequence):
    """:class:`RepeatedSequence` with a period drawn per sequence, so that no fixed offset predicts the repeat.

    Each sequence draws its period p uniformly from ``[min_period, seq_len]``, draws p random tokens and repeats
    them until the sequence is ``length`` tokens long (default 2 seq_len; block_size = length - 1). A position t is
    on the *repeat* when t >= p: its token occurred p places back, and the target is the successor of that
    occurrence, which an induction head (find the previous occurrence of the current token, copy what followed)
    predicts and a head attending at a fixed offset does not. ``min_period = seq_len`` is the fixed-period control.
    Every position is scored (``score="all"``); :func:`periods_of` recovers the periods from the tokens.

    Book: part III, "Induction heads".
    """

    name = "induction_varying"

    def __init__(self, vocab_size: int = 32, seq_len: int = 16, min_period: int = 8, length: int | None = None,
                 seed: int = 0):
        super().__init__(vocab_size=vocab_size, seq_len=seq_len, score="all", seed=seed)
        self.min_period = check_int("min_period", min_period, minimum=2, maximum=seq_len)
        length = 2 * seq_len if length is None else length
        self.length = check_int("length", length, minimum=2 * seq_len)  # two copies of the longest period
        self.block_size = self.length - 1
        self._kwargs = dict(vocab_size=vocab_size, seq_len=seq_len, min_period=min_period, length=length, seed=seed)

    def _sample(self, batch_size, generator, split):
        first = torch.randint(self.vocab_size, (batch_size, self.seq_len), generator=generator)  # (N, T)
        period = torch.randint(self.min_period, self.seq_len + 1, (batch_size, 1), generator=generator)  # (N, 1)
        positions = torch.arange(self.length) % period  # (N, length): 0 1 .. p-1 0 1 ..
        seq = first.gather(1, positions)  # (N, length)
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()  # (N, length - 1) each

    def repeat_mask(self, x: torch.Tensor) -> torch.Tensor:
        """(N, L) bool: True where position t of ``x`` is on the repeat (t >= the sequence's period)."""
        period = periods_of(x, self.min_period, self.seq_len)  # (N,)
        if not bool((period > 0).all()):
            raise ValueError("x holds a sequence with no period in [min_period, seq_len]: not a batch of this task")
        return torch.arange(x.shape[1], device=x.device)[None, :] >= period[:, None]  # (N, L)


def periods_of(x: torch.Tensor, min_period: int, max_period: int) -> torch.Tensor:
    """(N,): for each row of ``x`` (N, L), the smallest p in [min_period, max_period] with x[t] = x[t - p] for every
    t >= p, or -1 if there is none."""
    period = torch.full((x.shape[0],), -1, dtype=torch.long, device=x.device)  # (N,)
    for p in range(max_period, min_period - 1, -1):  # downwards: the smallest period wins
        period[(x[:, p:] == x[:, :-p]).all(dim=1)] = p
    return period


class TwoOffsetLookup(Task):
    """Random tokens; the target at position t is (x[t - a] + x[t - b]) mod vocab_size for offsets (a, b).

    One attention layer must attend to two relative positions at once (two heads, or one head splitting its
    weight); the MLP then computes the sum. Positions t < max(a, b) are not scored. Offsets are >= 0 (0 is the
    current token) and distinct.
    """

    name = "two_offset"
    has_accuracy = True

    def __init__(self, vocab_size: int = 8, block_size: int = 32, offsets: tuple[int, int] = (1, 3), seed: int = 0):
        super().__init__(seed)
        check_int("vocab_size", vocab_size, minimum=2)
        check_int("block_size", block_size)
        check_type("offsets", offsets, (tuple, list), "a pair of distinct integers >= 0, e.g. (1, 3)")
        offsets = tuple(check_int(f"offsets[{i}]", o, minimum=0) for i, o in enumerate(offsets))
        if len(offsets) != 2 or offsets[0] == offsets[1]:
            raise ValueError(f"offsets must be two distinct integers >= 0, got {offsets!r}")
        if max(offsets) >= block_size:
            raise ValueError(f"max(offsets) ({max(offsets)}) must be < block_size ({block_size}): no position "
                             f"would be scored")
        self.vocab_size = vocab_size
        self.block_size = block_size
        self.offsets = offsets
        self._kwargs = dict(vocab_size=vocab_size, block_size=block_size, offsets=list(offsets), seed=seed)

    def _sample(self, batch_size, generator, split):
        a, b = self.offsets
        start = max(a, b)
        x = torch.randint(self.vocab_size, (batch_size, self.block_size), generator=generator)  # (N, L)
        y = torch.full_like(x, IGNORE)
        t = torch.arange(start, self.block_size)  # scored positions
        y[:, start:] = (x[:, t - a] + x[:, t - b]) % self.vocab_size  # (N, L - start)
        return x, y


# ---------------------------------------------------------------------------------------------- Tiny Shakespeare
class Shakespeare(Task):
    """Character-level Tiny Shakespeare, as nanoGPT's ``shakespeare_char``.

    The vocabulary is the sorted set of the text's characters (65); the first 90% of the text is the training
    split and the last 10% the validation split; a batch is random crops of block_size characters, y the next
    character at every position (nanoGPT's ``get_batch``). No accuracy (``has_accuracy = False``).
    """

    name = "shakespeare"
    has_accuracy = False

    def __init__(self, block_size: int = 64, data_dir: str | os.PathLike | None = None, seed: int = 0):
        self.check_arguments(block_size, data_dir, seed)
        super().__init__(seed)
        text = load_tinyshakespeare(data_dir)
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.vocab_size = len(self.chars)
        self.block_size = block_size
        data = torch.tensor(self.encode(text), dtype=torch.long)
        n_train = int(0.9 * len(data))
        self.data = {"train": data[:n_train], "val": data[n_train:]}
        self._kwargs = dict(block_size=block_size, seed=seed)

    @staticmethod
    def check_arguments(block_size: int = 64, data_dir: str | os.PathLike | None = None, seed: int = 0) -> None:
        """The constructor's checks, without reading the text."""
        check_int("block_size", block_size)
        check_int("seed", seed, minimum=0)
        if data_dir is not None:
            check_type("data_dir", data_dir, (str, os.PathLike), "a folder (str or os.PathLike) or None")

    def encode(self, text: str) -> list[int]:
        return [self.stoi[c] for c in text]

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in (ids.tolist() if isinstance(ids, torch.Tensor) else ids))

    def _sample(self, batch_size, generator, split):
        data = self.data[split]
        if len(data) <= self.block_size:
            raise ValueError(f"block_size ({self.block_size}) must be < the {split} split's length ({len(data)})")
        starts = torch.randint(len(data) - self.block_size, (batch_size,), generator=generator)  # (N,)
        offsets = starts[:, None] + torch.arange(self.block_size)  # (N, block_size)
        return data[offsets], data[offsets + 1]


TASKS = {cls.name: cls for cls in (AssociativeRecall, RepeatedSequence, VaryingPeriodRepeat, TwoOffsetLookup,
                                   Shakespeare)}


def task_arguments(name: str) -> list[str]:
    """The keyword arguments task ``name`` takes (besides ``seed``), e.g. for checking a sweep's task_kwargs."""
    check_choice("task", name, sorted(TASKS))
    return list(_arguments(TASKS[name]))


@functools.cache
def _arguments(cls: type) -> tuple[str, ...]:
    """``cls.__init__``'s keyword arguments but seed (read once per class: a sweep checks every run's task)."""
    return tuple(p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "seed"))


def check_task(name: str, **kwargs) -> None:
    """Raise what :func:`make_task` would raise for these arguments, without reading any data: a synthetic task is
    built (its constructor only checks), Tiny Shakespeare only checks its arguments."""
    check_choice("task", name, sorted(TASKS))
    if name == Shakespeare.name:
        unknown = sorted(set(kwargs) - set(task_arguments(name)) - {"seed"})
        if unknown:
            raise TypeError(f"task {name!r} takes no argument(s) {unknown}; its arguments are "
                            f"{task_arguments(name) + ['seed']}")
        Shakespeare.check_arguments(**kwargs)
    else:
        make_task(name, **kwargs)


def make_task(name: str, **kwargs) -> Task:
    """A task by name: 'recall' (AssociativeRecall), 'induction' (RepeatedSequence), 'induction_varying'
    (VaryingPeriodRepeat), 'two_offset' (TwoOffsetLookup), 'shakespeare' (Shakespeare); keyword arguments go to the
    class. An argument the class does not take is a TypeError naming it and the ones it takes."""
    check_choice("task", name, sorted(TASKS))
    unknown = sorted(set(kwargs) - set(task_arguments(name)) - {"seed"})
    if unknown:
        raise TypeError(f"task {name!r} takes no argument(s) {unknown}; its arguments are "
                        f"{task_arguments(name) + ['seed']}")
    return TASKS[name](**kwargs)
