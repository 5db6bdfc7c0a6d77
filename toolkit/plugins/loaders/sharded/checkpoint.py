"""A saved per-rank state read back as a Checkpoint: the loading rank's own tensors, verified.

Tensors are the parameters' stored state (``param`` or ``param:part``); the ``sharded`` name
map hands each one to ``load_stored`` unchanged. The tp size is checked when tensors are
first asked for (``open`` also serves tokenizer-only and ``inspect`` readers at any tp).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors import SafetensorError, safe_open

from toolkit.core.errors import CorruptFileError

from .errors import ChecksumMismatchError
from .manifest_checkpoint import ManifestCheckpoint
from .stored import dtype_name, parse_dtype, sha256
from .writer import MANIFEST, TAG


class ShardedCheckpoint(ManifestCheckpoint):
    format = "sharded"

    def __init__(self, folder: Path, *, tp_rank: int, tp_size: int):
        super().__init__(folder, manifest_name=MANIFEST, tag=TAG, tp_rank=tp_rank, tp_size=tp_size)

    def read_tensors(self) -> Iterator[tuple[str, str, torch.Tensor]]:
        records = self._entry()["tensors"]
        for file_name in dict.fromkeys(record["file"] for record in records):
            path = self.folder / file_name
            with _open(path) as handle:
                for record in (r for r in records if r["file"] == file_name):
                    yield record["name"], str(path), _read_verified(handle, record, path)

    def _record_nbytes(self, record: dict[str, Any]) -> int:
        return _nbytes(record)


def _open(path: Path):
    try:
        return safe_open(str(path), framework="pt")
    except (SafetensorError, OSError, ValueError) as exc:
        raise CorruptFileError(f"not a readable safetensors file: {exc}", file=str(path)) from exc


def _read_verified(handle, record: dict[str, Any], path: Path) -> torch.Tensor:
    name = record["name"]
    try:
        tensor = handle.get_tensor(name)
    except (SafetensorError, OSError, ValueError) as exc:
        raise CorruptFileError(f"cannot read tensor data: {exc}", file=str(path), tensor=name) from exc
    found = (dtype_name(tensor.dtype), list(tensor.shape))
    if found != (record["dtype"], list(record["shape"])):
        raise ChecksumMismatchError(f"tensor is {found[0]} {found[1]}, the manifest recorded "
                                    f"{record['dtype']} {record['shape']}", file=str(path), tensor=name)
    if "sha256" not in record:  # the writer always records one; its absence means the manifest was edited
        raise ChecksumMismatchError("the manifest records no sha256 for this tensor", file=str(path), tensor=name)
    if sha256(tensor) != record["sha256"]:
        raise ChecksumMismatchError("sha256 of the tensor bytes differs from the manifest (file modified or "
                                    "corrupted)", file=str(path), tensor=name)
    return tensor


def _nbytes(record: dict[str, Any]) -> int:
    count = 1
    for dim in record["shape"]:
        count *= dim
    return count * parse_dtype(record["dtype"]).itemsize
