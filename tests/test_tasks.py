"""Tests for mha.experiments.tasks and .data: targets are checked against explicit per-position loops; the download
through pooch with a fake downloader."""

import hashlib
import math
import os
from pathlib import Path

import pytest
import torch

from mha.experiments import data, tasks
from mha.experiments.tasks import (AssociativeRecall, RepeatedSequence, Shakespeare, TwoOffsetLookup,
                                   VaryingPeriodRepeat, accuracy, make_task, periods_of)

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = Path(os.environ.get("MHA_DATA_DIR") or REPO.parent / "shared" / "data")
HAVE_SHAKESPEARE = (DATA_DIR / "tinyshakespeare" / "input.txt").exists()
needs_shakespeare = pytest.mark.skipif(not HAVE_SHAKESPEARE, reason=f"no Tiny Shakespeare under {DATA_DIR}")


@pytest.mark.parametrize("name, kwargs", [("recall", {}), ("induction", {}), ("two_offset", {}),
                                          ("induction_varying", {})])
def test_deterministic_and_splits_differ(name, kwargs):
    a, b = make_task(name, seed=3, **kwargs), make_task(name, seed=3, **kwargs)
    batches_a = [a.get_batch("train", 4) for _ in range(2)] + [a.get_batch("val", 4)]
    batches_b = [b.get_batch("train", 4) for _ in range(2)] + [b.get_batch("val", 4)]
    for (xa, ya), (xb, yb) in zip(batches_a, batches_b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
        assert xa.dtype == ya.dtype == torch.long and xa.shape == ya.shape == (4, a.block_size)
        assert 0 <= int(xa.min()) and int(xa.max()) < a.vocab_size
    assert not torch.equal(batches_a[0][0], batches_a[1][0])  # the stream advances
    assert not torch.equal(batches_a[0][0], batches_a[2][0])  # train and val are different streams
    assert not torch.equal(make_task(name, seed=4, **kwargs).get_batch("train", 4)[0], batches_a[0][0])


def test_associative_recall_targets():
    task = AssociativeRecall(vocab_size=20, num_kv_pairs=5, num_queries=3, seed=1)
    assert task.block_size == 2 * (5 + 3) - 1 and task.has_accuracy
    x, y = task.get_batch("train", 16)
    for i in range(16):
        seq = x[i].tolist() + [None]
        table = {seq[2 * j]: seq[2 * j + 1] for j in range(5)}
        assert len(table) == 5  # distinct keys
        assert all(k < 10 for k in table) and all(v >= 10 for v in table.values())
        assert len(set(table.values())) == 5
        queried = []
        for t in range(task.block_size):
            if t >= 10 and (t - 10) % 2 == 0:  # a query key
                assert y[i, t] == table[seq[t]]
                queried.append(seq[t])
                if t + 1 < task.block_size:
                    assert seq[t + 1] == table[seq[t]]  # the answer follows in x too
            else:
                assert y[i, t] == -100
        assert len(set(queried)) == 3


def test_repeated_sequence_targets_and_split_losses():
    task = RepeatedSequence(vocab_size=11, seq_len=6, seed=2)
    x, y = task.get_batch("train", 8)
    assert task.block_size == 11 and task.split == 6
    for i in range(8):
        for t in range(task.block_size):
            if t < 6:
                assert y[i, t] == -100
            else:  # the token after the previous occurrence, 6 positions back
                assert y[i, t] == x[i, t - 5]
    task_all = RepeatedSequence(vocab_size=11, seq_len=6, score="all", seed=2)
    x_all, y_all = task_all.get_batch("train", 8)
    assert torch.equal(x_all, x) and torch.equal(y_all[:, 6:], y[:, 6:])
    assert torch.equal(y_all[:, :-1], x[:, 1:])
    # Uniform logits on the first half, a confident right answer on the repeat: losses ln V and ~0.
    logits = torch.zeros(8, 11, 11)
    logits[:, 6:] = 30 * torch.nn.functional.one_hot(y_all[:, 6:], 11).float()
    first, repeat = task_all.split_losses(logits, y_all)
    assert first == pytest.approx(math.log(11)) and repeat < 1e-9
    with pytest.raises(ValueError, match="score='all'"):
        task.split_losses(logits, y)


def test_two_offset_targets():
    task = TwoOffsetLookup(vocab_size=7, block_size=10, offsets=(2, 5), seed=0)
    x, y = task.get_batch("val", 6)
    for i in range(6):
        for t in range(10):
            expected = (x[i, t - 2] + x[i, t - 5]) % 7 if t >= 5 else -100
            assert y[i, t] == expected
    x0, y0 = TwoOffsetLookup(vocab_size=7, block_size=10, offsets=(0, 1)).get_batch("train", 2)
    assert torch.equal(y0[:, 1:], (x0[:, 1:] + x0[:, :-1]) % 7) and torch.all(y0[:, 0] == -100)


def test_accuracy():
    y = torch.tensor([[1, -100, 2], [0, 0, -100]])
    logits = torch.zeros(2, 3, 3)
    logits[0, 0, 1] = logits[0, 1, 0] = logits[0, 2, 0] = logits[1, 0, 0] = logits[1, 1, 2] = 1
    assert accuracy(logits, y) == pytest.approx(2 / 4)  # right at (0,0) and (1,0); wrong at (0,2), (1,1)
    with pytest.raises(ValueError, match="no scored"):
        accuracy(logits, torch.full((2, 3), -100))


def test_bad_arguments():
    with pytest.raises(ValueError, match="task must be one of .*got 'nope'"):
        make_task("nope")
    with pytest.raises(TypeError, match=r"takes no argument\(s\) \['seq_len'\]"):
        make_task("two_offset", seq_len=4)
    with pytest.raises(TypeError, match="offsets"):
        TwoOffsetLookup(offsets=(1.0, 3))
    with pytest.raises(ValueError, match="min_period"):
        VaryingPeriodRepeat(seq_len=8, min_period=9)
    with pytest.raises(ValueError, match="length"):
        VaryingPeriodRepeat(seq_len=8, length=15)
    with pytest.raises(ValueError, match="num_kv_pairs"):
        AssociativeRecall(vocab_size=10, num_kv_pairs=6)
    with pytest.raises(ValueError, match="num_queries"):
        AssociativeRecall(num_kv_pairs=4, num_queries=5)
    with pytest.raises(ValueError, match="offsets"):
        TwoOffsetLookup(offsets=(2, 2))
    with pytest.raises(ValueError, match="block_size"):
        TwoOffsetLookup(block_size=4, offsets=(1, 4))
    with pytest.raises(ValueError, match="score"):
        RepeatedSequence(score="first")
    with pytest.raises(ValueError, match="split"):
        make_task("two_offset").get_batch("test", 2)
    with pytest.raises(ValueError, match="batch_size"):
        make_task("two_offset").get_batch("train", 0)


@needs_shakespeare
def test_shakespeare_batches():
    task = Shakespeare(block_size=32, data_dir=DATA_DIR, seed=0)
    text = (DATA_DIR / "tinyshakespeare" / "input.txt").read_text()
    assert task.vocab_size == 65 and not task.has_accuracy
    assert task.decode(task.encode("To be, or not")) == "To be, or not"
    n_train = int(0.9 * len(text))
    for split, part in (("train", text[:n_train]), ("val", text[n_train:])):
        x, y = task.get_batch(split, 4)
        assert x.shape == y.shape == (4, 32)
        for i in range(4):
            crop = task.decode(x[i])
            assert crop in part and task.decode(y[i]) == crop[1:] + task.decode(y[i, -1:])
            assert task.decode(y[i]) in part


@pytest.fixture
def fake_download(monkeypatch):
    """pooch's downloader replaced by a fake that writes ``served["bytes"]`` or raises ``served["error"]``."""
    for module in ("pooch", "requests"):
        pytest.importorskip(module, reason=f"{module} is not installed: only a download needs it (the checksum of a "
                                           f"file on disk is hashlib's)")
    served = {"calls": 0}

    def downloader(url, output_file, pooch_instance, check_only=False):
        served["calls"] += 1
        served["url"] = url
        if "error" in served:
            raise served["error"]
        Path(output_file).write_bytes(served["bytes"])

    monkeypatch.setattr(data, "DOWNLOADER", downloader)
    return served


def test_download_bad_checksum_writes_nothing(tmp_path, fake_download):
    fake_download["bytes"] = b"not shakespeare"
    with pytest.raises(ValueError, match=hashlib.sha256(b"not shakespeare").hexdigest()):
        data.load_tinyshakespeare(tmp_path)
    assert fake_download["url"] == data.TINYSHAKESPEARE_URL
    assert not (tmp_path / "tinyshakespeare" / "input.txt").exists()
    assert [p.name for p in (tmp_path / "tinyshakespeare").iterdir()] == []  # no temporary file left either


def test_download_without_network_names_the_path(tmp_path, fake_download, monkeypatch):
    import requests

    fake_download["error"] = requests.exceptions.ConnectionError("no network")
    monkeypatch.setenv("MHA_DATA_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError) as info:
        data.load_tinyshakespeare()
    message = str(info.value)
    assert str(tmp_path / "tinyshakespeare" / "input.txt") in message and data.TINYSHAKESPEARE_URL in message


def test_corrupt_cached_file_is_an_error_and_is_kept(tmp_path, monkeypatch):
    def no_download():
        raise AssertionError("a file on disk is checked without pooch, and never downloaded again")

    monkeypatch.setattr(data, "_pooch", no_download)
    path = tmp_path / "tinyshakespeare" / "input.txt"
    path.parent.mkdir()
    path.write_text("First Citizen: a corrupted copy")
    with pytest.raises(ValueError, match=hashlib.sha256(b"First Citizen: a corrupted copy").hexdigest()):
        data.load_tinyshakespeare(tmp_path)
    assert path.read_text() == "First Citizen: a corrupted copy"


def test_file_sha256_is_the_standard_digest(tmp_path):
    """hashlib's sha256 in 1 MiB blocks: the FIPS 180-2 test vector, and a file longer than one block."""
    (tmp_path / "abc").write_bytes(b"abc")
    assert data.file_sha256(tmp_path / "abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    (tmp_path / "long").write_bytes(b"a" * 1_000_000 * 3)
    assert data.file_sha256(tmp_path / "long") == hashlib.sha256(b"a" * 3_000_000).hexdigest()


@needs_shakespeare
def test_reading_needs_no_pooch_and_a_missing_file_says_what_to_do(tmp_path, monkeypatch):
    """Without pooch (a stock GPU image) the text on disk is read and checked (hashlib); a missing file is a
    FileNotFoundError that says where to put it and that a download needs pooch."""
    def no_pooch():
        raise ImportError("No module named 'pooch'")

    monkeypatch.setattr(data, "_pooch", no_pooch)
    raw = (DATA_DIR / "tinyshakespeare" / "input.txt").read_bytes()
    assert data.file_sha256(DATA_DIR / "tinyshakespeare" / "input.txt") == data.TINYSHAKESPEARE_SHA256
    assert data.load_tinyshakespeare(DATA_DIR) == raw.decode()
    with pytest.raises(FileNotFoundError) as info:
        data.load_tinyshakespeare(tmp_path)
    message = str(info.value)
    assert "needs pooch" in message and str(tmp_path / "tinyshakespeare" / "input.txt") in message
    monkeypatch.delenv("MHA_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    if os.sys.platform.startswith("linux"):  # pooch's os_cache on Linux is the same folder
        assert data.dataset_dir() == tmp_path / "cache" / "mha-derived"


@needs_shakespeare
def test_download_then_read_from_cache(tmp_path, fake_download):
    raw = (DATA_DIR / "tinyshakespeare" / "input.txt").read_bytes()
    fake_download["bytes"] = raw
    text = data.load_tinyshakespeare(tmp_path)
    assert text == raw.decode() and (tmp_path / "tinyshakespeare" / "input.txt").read_bytes() == raw
    fake_download["error"] = OSError("no network")  # the second call reads the cached file
    assert data.load_tinyshakespeare(tmp_path) == text and fake_download["calls"] == 1


def test_varying_period_repeat_targets_and_periods():
    """Each sequence repeats its first p tokens, p in [min_period, seq_len]; y is x shifted by one; periods_of and
    repeat_mask recover p (checked against the definition, position by position)."""
    task = VaryingPeriodRepeat(vocab_size=256, seq_len=12, min_period=5, length=30, seed=1)
    x, y = task.get_batch("train", 64)
    assert x.shape == y.shape == (64, task.block_size) == (64, 29)
    seq = torch.cat([x, y[:, -1:]], dim=1)  # (N, 30)
    assert torch.equal(seq[:, 1:-1], y[:, :-1])
    periods = periods_of(x, 5, 12)
    mask = task.repeat_mask(x)
    seen = set()
    for i in range(64):
        p = int(periods[i])
        seen.add(p)
        assert 5 <= p <= 12
        for t in range(30):
            assert seq[i, t] == seq[i, t % p]  # period p
        # with 256 tokens, a shorter period would need p random tokens to repeat by chance
        assert not all(seq[i, t] == seq[i, t - (p - 1)] for t in range(p - 1, 30)) or p == 5
        assert mask[i].tolist() == [t >= p for t in range(29)]
    assert len(seen) >= 5  # the period really varies
    fixed = VaryingPeriodRepeat(vocab_size=256, seq_len=12, min_period=12, seed=1)
    assert set(periods_of(fixed.get_batch("val", 16)[0], 12, 12).tolist()) == {12}
