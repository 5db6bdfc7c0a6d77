"""Where each string of a large GGUF string array begins, remembered between loads and proven on reuse.

A GGUF string array is a chain: each string's 8-byte length says where the next one begins, so
finding the starts takes one Python step per string (~0.1 s on a quiet 2-core box for Gemma 3's
262,144 tokens, 0.3-0.4 s when it is busy; tokenizers with merges have a second such array).
The starts found are kept in the cache folder (``cache_paths.py``) under a name made from the
file's identity (path, size, modification time) and the array's offset and length.

A kept index is only a guess: it is used once the file's own bytes prove it, all strings at once
(numpy), so a stale or damaged index can never give wrong strings, only cost the scan it would
have saved. The proof: the first string begins right after the array header, each string's
length (read at its start - 8) reaches exactly the next start, and the last one ends inside the
file; that is the chain the scan follows, string by string.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np

from .cache_paths import cache_dir

MIN_STRINGS = 8192  # smaller arrays scan in a few ms: not worth a file
FOLDER = "string-index"


def load(path: Path, raw: np.ndarray, start: int, count: int) -> tuple[np.ndarray, int] | None:
    """The starts of the ``count`` strings whose chain begins at ``start`` (the first length field)
    and where the last ends, from a kept index the file's bytes prove; None if there is none."""
    entry = _entry(path, start, count)
    if entry is None or not entry.is_file():
        return None
    try:
        starts = np.load(entry, allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    if starts.dtype != np.int64 or starts.shape != (count,):
        return None
    end = prove(raw, start, starts)
    return None if end is None else (starts, end)


def store(path: Path, start: int, count: int, starts: np.ndarray) -> None:
    """Keep ``starts`` for the next load (atomically: written aside, renamed into place); a cache
    that cannot be written costs only that next load's scan."""
    entry = _entry(path, start, count)
    if entry is None:
        return
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        handle, partial = tempfile.mkstemp(dir=entry.parent, prefix=entry.stem, suffix=".partial")
        try:
            with os.fdopen(handle, "wb") as out:
                np.save(out, np.ascontiguousarray(starts, dtype=np.int64), allow_pickle=False)
            os.replace(partial, entry)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    except OSError:
        pass


def prove(raw: np.ndarray, start: int, starts: np.ndarray) -> int | None:
    """Where the chain's last string ends if ``starts`` is exactly the chain of strings that begins
    at byte ``start`` of ``raw`` (a uint8 array of the whole file), else None."""
    count = len(starts)
    if count == 0 or len(raw) < 8 or int(starts[0]) != start + 8:
        return None
    heads = starts - 8
    if int(heads.min()) < start or int(starts.max()) > len(raw):
        return None
    # each length field, read as little-endian uint64 wherever it lies (not 8-byte aligned): a view
    # with a uint64 at every byte offset of the file
    words = np.ndarray(shape=(len(raw) - 7,), dtype="<u8", buffer=raw, strides=(1,))
    lengths = words[heads]
    if int(lengths.max()) > len(raw):  # also keeps the sums below far from int64's limit
        return None
    ends = starts + lengths.astype(np.int64)
    if not np.array_equal(ends[:-1] + 8, starts[1:]):
        return None
    end = int(ends[-1])
    return end if end <= len(raw) else None


def _entry(path: Path, start: int, count: int) -> Path | None:
    folder = cache_dir()
    if folder is None:
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return None
    identity = f"{os.path.realpath(path)}|{stat.st_size}|{stat.st_mtime_ns}|{start}|{count}"
    return folder / FOLDER / f"{hashlib.blake2b(identity.encode(), digest_size=16).hexdigest()}.npy"
