"""Typed errors of stored-state checkpoints (subclasses of the core's, so callers can catch either)."""
from __future__ import annotations

from toolkit.core.errors import CorruptFileError, ShardingError


class TensorParallelMismatchError(ShardingError):
    """A per-rank state saved at one tp size, loaded at another (it cannot be re-sharded)."""


class ChecksumMismatchError(CorruptFileError):
    """A tensor's bytes (or dtype/shape) differ from what the manifest recorded at save time."""
