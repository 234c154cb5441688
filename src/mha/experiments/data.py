"""Data sets on disk: where they live, and Tiny Shakespeare, downloaded once and checked by its sha256.

Book: part III, "A nanoGPT-comparable character model" (and every chapter trained on Tiny Shakespeare).

Download, checksum and cache are `pooch`'s (``pooch.retrieve``: a temporary file, its hash checked, then moved into
place, so a failed or corrupt download never leaves a file behind). This module only says where the file goes and
turns pooch's failures into errors that say what to do.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

__all__ = ["TINYSHAKESPEARE_URL", "TINYSHAKESPEARE_SHA256", "dataset_dir", "tinyshakespeare_path",
           "load_tinyshakespeare"]

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


def dataset_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """Where data sets live: the argument, else ``$MHA_DATA_DIR``, else the user cache (``~/.cache/mha-derived`` on
    Linux, ``pooch.os_cache``)."""
    if data_dir is not None:
        return Path(data_dir)
    if os.environ.get("MHA_DATA_DIR"):
        return Path(os.environ["MHA_DATA_DIR"])
    return Path(_pooch().os_cache("mha-derived"))


def tinyshakespeare_path(data_dir: str | os.PathLike | None = None) -> Path:
    """``<data_dir>/tinyshakespeare/input.txt`` (see :func:`dataset_dir`)."""
    return dataset_dir(data_dir) / "tinyshakespeare" / "input.txt"


def load_tinyshakespeare(data_dir: str | os.PathLike | None = None) -> str:
    """The Tiny Shakespeare text (1,115,394 characters), checked against its sha256.

    Read from :func:`tinyshakespeare_path`; when the file is missing it is downloaded from
    :data:`TINYSHAKESPEARE_URL` and checked first. A file on disk with another checksum raises ValueError (it is
    not overwritten: delete it to download again); a download with the wrong checksum raises ValueError and writes
    nothing; a missing file that cannot be downloaded raises FileNotFoundError saying where to put it.
    """
    path = tinyshakespeare_path(data_dir)
    if path.exists():
        digest = _pooch().file_hash(str(path), alg="sha256")
        if digest != TINYSHAKESPEARE_SHA256:
            raise ValueError(f"{path} has sha256 {digest}, expected {TINYSHAKESPEARE_SHA256}: the file is corrupt "
                             f"or another text; delete it to download it again from {TINYSHAKESPEARE_URL}")
        return path.read_bytes().decode("utf-8")
    import requests  # pooch's own dependency: its HTTP errors are requests exceptions

    try:
        _pooch().retrieve(TINYSHAKESPEARE_URL, known_hash=f"sha256:{TINYSHAKESPEARE_SHA256}", fname=path.name,
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
