"""Data sets on disk: where they live, and Tiny Shakespeare, downloaded once and checked by its sha256.

Book: part III, "A nanoGPT-comparable character model" (and every chapter trained on Tiny Shakespeare).

The checksum of a file on disk is the standard library's (:func:`file_sha256`, ``hashlib``), so reading a file that
is already there needs nothing else (a GPU image without pooch works offline). The download is `pooch`'s
(``pooch.retrieve``: a temporary file, its hash checked, then moved into place, so a failed or corrupt download never
leaves a file behind), imported only when a file must be downloaded. This module says where the file goes and
turns the failures into errors that say what to do.
"""

from __future__ import annotations

import hashlib
import os
import sys
import warnings
from pathlib import Path

__all__ = ["TINYSHAKESPEARE_URL", "TINYSHAKESPEARE_SHA256", "dataset_dir", "tinyshakespeare_path",
           "load_tinyshakespeare", "file_sha256"]

TINYSHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
TINYSHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"

DOWNLOADER = None
"""pooch downloader used for the download (None: pooch's HTTP downloader); tests replace it."""


def _pooch():
    """pooch, imported when first needed: it imports ``tqdm.auto``, which warns inside Jupyter without ipywidgets
    (the warning would print on book pages that never download anything)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        import pooch

    return pooch


def file_sha256(path: str | os.PathLike) -> str:
    """The sha256 of a file's bytes, as 64 lowercase hex digits (read in 1 MiB blocks; ``hashlib``)."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _user_cache() -> Path:
    """The user's cache folder for this package: pooch's ``os_cache("mha-derived")`` (``~/.cache/mha-derived`` on
    Linux) when pooch is installed; without it the same folder on Linux, from ``XDG_CACHE_HOME`` (else
    ``~/.cache``), and ``~/Library/Caches`` on macOS or ``%LOCALAPPDATA%`` on Windows."""
    try:
        return Path(_pooch().os_cache("mha-derived"))
    except ImportError:
        pass
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "mha-derived"
    if sys.platform.startswith("win") and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "mha-derived" / "Cache"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mha-derived"


def dataset_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """Where data sets live: the argument, else ``$MHA_DATA_DIR``, else the user cache (``~/.cache/mha-derived`` on
    Linux, ``pooch.os_cache``; see :func:`_user_cache`)."""
    if data_dir is not None:
        return Path(data_dir)
    if os.environ.get("MHA_DATA_DIR"):
        return Path(os.environ["MHA_DATA_DIR"])
    return _user_cache()


def tinyshakespeare_path(data_dir: str | os.PathLike | None = None) -> Path:
    """``<data_dir>/tinyshakespeare/input.txt`` (see :func:`dataset_dir`)."""
    return dataset_dir(data_dir) / "tinyshakespeare" / "input.txt"


def load_tinyshakespeare(data_dir: str | os.PathLike | None = None) -> str:
    """The Tiny Shakespeare text (1,115,394 characters), checked against its sha256.

    Read from :func:`tinyshakespeare_path` and checked by :func:`file_sha256` (no pooch needed); when the file is
    missing it is downloaded from :data:`TINYSHAKESPEARE_URL` (with pooch) and checked first. A file on disk with
    another checksum raises ValueError (it is not overwritten: delete it to download again); a download with the
    wrong checksum raises ValueError and writes nothing; a missing file that cannot be downloaded (no network, or
    pooch not installed) raises FileNotFoundError saying where to put it.
    """
    path = tinyshakespeare_path(data_dir)
    if path.exists():
        digest = file_sha256(path)
        if digest != TINYSHAKESPEARE_SHA256:
            raise ValueError(f"{path} has sha256 {digest}, expected {TINYSHAKESPEARE_SHA256}: the file is corrupt "
                             f"or another text; delete it to download it again from {TINYSHAKESPEARE_URL}")
        return path.read_bytes().decode("utf-8")
    try:
        pooch = _pooch()
        import requests  # pooch's own dependency: its HTTP errors are requests exceptions
    except ImportError as error:
        raise FileNotFoundError(
            f"Tiny Shakespeare is not at {path}, and downloading it needs pooch, which is not installed ({error}). "
            f"Download {TINYSHAKESPEARE_URL} and save it as {path} (or set MHA_DATA_DIR to a directory holding "
            f"tinyshakespeare/input.txt), or pip install pooch") from error
    try:
        pooch.retrieve(TINYSHAKESPEARE_URL, known_hash=f"sha256:{TINYSHAKESPEARE_SHA256}", fname=path.name,
                       path=path.parent, downloader=DOWNLOADER, progressbar=False)
    except (requests.exceptions.RequestException, OSError) as error:
        raise FileNotFoundError(
            f"Tiny Shakespeare is not at {path} and could not be downloaded ({error}). Download "
            f"{TINYSHAKESPEARE_URL} and save it as {path} (or set MHA_DATA_DIR to a directory holding "
            f"tinyshakespeare/input.txt)") from error
    except ValueError as error:  # pooch: the downloaded file's hash does not match
        raise ValueError(f"the file downloaded from {TINYSHAKESPEARE_URL} does not have sha256 "
                         f"{TINYSHAKESPEARE_SHA256} ({error}); nothing was written to {path}") from error
    return path.read_bytes().decode("utf-8")
