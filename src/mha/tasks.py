"""Tasks for the experiments: batches ``(x, y)`` of token ids, deterministic given a seed.

Book: part III (experiments): "Head count", "MHA, GQA and MQA in training" (associative recall, two-offset lookup),
"Induction heads" (repeated sequences), "A nanoGPT-comparable character model" (Tiny Shakespeare).

Every task has ``vocab_size``, ``block_size`` (the length of x), ``has_accuracy`` and
``get_batch(split, batch_size, device=None) -> (x, y)``: two int64 tensors of shape (batch_size, block_size), y the
target at each position of x, or -100 where the position is not scored (cross-entropy's ``ignore_index``).
Accuracy, where a task has one, is the fraction of scored positions whose target is the logits' argmax
(:func:`accuracy`). Each split ("train", "val") draws from its own random stream, seeded by (seed, split), so the
validation batches are held out from training and the same seed gives the same batches.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from urllib.request import urlopen

import numpy as np
import torch

from mha._checks import check_int

__all__ = ["Task", "AssociativeRecall", "RepeatedSequence", "TwoOffsetLookup", "Shakespeare", "make_task",
           "accuracy", "load_tinyshakespeare", "dataset_dir", "TINYSHAKESPEARE_URL", "TINYSHAKESPEARE_SHA256", "TASKS"]

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
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
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
        if score not in ("repeat", "all"):
            raise ValueError(f"score must be 'repeat' or 'all', got {score!r}")
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
        offsets = tuple(offsets)
        if (len(offsets) != 2 or any(isinstance(o, bool) or not isinstance(o, int) or o < 0 for o in offsets)
                or offsets[0] == offsets[1]):
            raise ValueError(f"offsets must be two distinct ints >= 0, got {offsets!r}")
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
TINYSHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
TINYSHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"


def dataset_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """Where data sets live: the argument, else ``$MHA_DATA_DIR``, else ``$XDG_CACHE_HOME/mha-derived``
    (``~/.cache/mha-derived``)."""
    if data_dir is not None:
        return Path(data_dir)
    if os.environ.get("MHA_DATA_DIR"):
        return Path(os.environ["MHA_DATA_DIR"])
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "mha-derived"


def load_tinyshakespeare(data_dir: str | os.PathLike | None = None) -> str:
    """The Tiny Shakespeare text (1,115,394 characters), checked against its sha256.

    Read from ``<data_dir>/tinyshakespeare/input.txt`` (data_dir: the argument, else ``$MHA_DATA_DIR``, else
    ``~/.cache/mha-derived``); when the file is missing it is downloaded from :data:`TINYSHAKESPEARE_URL`, checked,
    and written there. A file with the wrong checksum (on disk or downloaded) raises ValueError; a missing file
    that cannot be downloaded raises FileNotFoundError saying where to put it.

    Book: part III, "A nanoGPT-comparable character model".
    """
    path = dataset_dir(data_dir) / "tinyshakespeare" / "input.txt"
    if path.exists():
        raw = path.read_bytes()
        digest = hashlib.sha256(raw).hexdigest()
        if digest != TINYSHAKESPEARE_SHA256:
            raise ValueError(f"{path} has sha256 {digest}, expected {TINYSHAKESPEARE_SHA256}: the file is corrupt "
                             f"or another text; delete it to download it again from {TINYSHAKESPEARE_URL}")
        return raw.decode("utf-8")
    try:
        with urlopen(TINYSHAKESPEARE_URL, timeout=60) as response:
            raw = response.read()
    except OSError as error:  # URLError, timeouts and refused connections are OSErrors
        raise FileNotFoundError(
            f"Tiny Shakespeare is not at {path} and could not be downloaded ({error}). Download "
            f"{TINYSHAKESPEARE_URL} and save it as {path} (or set MHA_DATA_DIR to a directory holding "
            f"tinyshakespeare/input.txt)") from error
    digest = hashlib.sha256(raw).hexdigest()
    if digest != TINYSHAKESPEARE_SHA256:
        raise ValueError(f"the file downloaded from {TINYSHAKESPEARE_URL} has sha256 {digest}, expected "
                         f"{TINYSHAKESPEARE_SHA256}; nothing was written to {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.part")
    partial.write_bytes(raw)
    os.replace(partial, path)  # atomic: never a half-written input.txt
    return raw.decode("utf-8")


class Shakespeare(Task):
    """Character-level Tiny Shakespeare, as nanoGPT's ``shakespeare_char``.

    The vocabulary is the sorted set of the text's characters (65); the first 90% of the text is the training
    split and the last 10% the validation split; a batch is random crops of block_size characters, y the next
    character at every position (nanoGPT's ``get_batch``). No accuracy (``has_accuracy = False``).
    """

    name = "shakespeare"
    has_accuracy = False

    def __init__(self, block_size: int = 64, data_dir: str | os.PathLike | None = None, seed: int = 0):
        super().__init__(seed)
        check_int("block_size", block_size)
        text = load_tinyshakespeare(data_dir)
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.vocab_size = len(self.chars)
        self.block_size = block_size
        data = torch.tensor(self.encode(text), dtype=torch.long)
        n_train = int(0.9 * len(data))
        self.data = {"train": data[:n_train], "val": data[n_train:]}
        self._kwargs = dict(block_size=block_size, seed=seed)

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


TASKS = {cls.name: cls for cls in (AssociativeRecall, RepeatedSequence, TwoOffsetLookup, Shakespeare)}


def make_task(name: str, **kwargs) -> Task:
    """A task by name: 'recall' (AssociativeRecall), 'induction' (RepeatedSequence), 'two_offset'
    (TwoOffsetLookup), 'shakespeare' (Shakespeare); keyword arguments go to the class."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; expected one of {sorted(TASKS)}")
    return TASKS[name](**kwargs)
