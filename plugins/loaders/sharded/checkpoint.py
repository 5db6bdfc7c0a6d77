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

from toolkit.core.checkpoint import CheckpointSummary, TensorInfo
from toolkit.core.errors import CorruptFileError

from . import manifest
from .errors import ChecksumMismatchError
from .stored import dtype_name, load_tokenizer, parse_dtype, sha256
from .writer import MANIFEST, TAG


class ShardedCheckpoint:
    format = "sharded"

    def __init__(self, folder: Path, *, tp_rank: int, tp_size: int):
        self.folder, self.tp_rank, self.tp_size = folder, tp_rank, tp_size
        self.manifest_path = folder / MANIFEST
        self.manifest = manifest.read(self.manifest_path, TAG)
        self.hf_config: dict = self.manifest["hf_config"]
        self.quant_scheme: str | None = self.manifest["quant_scheme"]
        self.quant_metadata: Any = self.manifest.get("quant_metadata")
        self.params_dtype = _params_dtype(self.manifest, self.manifest_path)
        own = self.manifest["ranks"].get(str(tp_rank), {}).get("files", [])
        self.files = (self.manifest_path, *(folder / name for name in own))

    def _entry(self) -> dict[str, Any]:
        return manifest.rank_entry(self.manifest, tp_rank=self.tp_rank, tp_size=self.tp_size,
                                   path=self.manifest_path)

    def tensor_names(self) -> list[str]:
        return [record["name"] for record in self._entry()["tensors"]]

    def read_tensors(self) -> Iterator[tuple[str, str, torch.Tensor]]:
        records = self._entry()["tensors"]
        for file_name in dict.fromkeys(record["file"] for record in records):
            path = self.folder / file_name
            with _open(path) as handle:
                for record in (r for r in records if r["file"] == file_name):
                    yield record["name"], str(path), _read_verified(handle, record, path)

    def tokenizer(self):
        return load_tokenizer(self.folder, self.manifest.get("tokenizer_files") or [])

    def summary(self) -> CheckpointSummary:
        metadata = {key: value for key, value in self.manifest.items() if key not in ("ranks", "hf_config")}
        tensors = [TensorInfo(r["name"], tuple(r["shape"]), r["dtype"], _nbytes(r), r["file"])
                   for rank in sorted(self.manifest["ranks"], key=int) for r in self.manifest["ranks"][rank]["tensors"]]
        return CheckpointSummary(format=self.format, architecture=self.manifest["architecture"],
                                 metadata=dict(metadata, **self.hf_config), tensors=tensors)

    def close(self) -> None:
        return None


def _params_dtype(manifest_data: dict, path: Path) -> torch.dtype:
    try:
        return parse_dtype(manifest_data["params_dtype"])
    except ValueError as exc:
        raise CorruptFileError(str(exc), file=str(path)) from exc


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
    if sha256(tensor) != record["sha256"]:
        raise ChecksumMismatchError("sha256 of the tensor bytes differs from the manifest (file modified or "
                                    "corrupted)", file=str(path), tensor=name)
    return tensor


def _nbytes(record: dict[str, Any]) -> int:
    count = 1
    for dim in record["shape"]:
        count *= dim
    return count * parse_dtype(record["dtype"]).itemsize
