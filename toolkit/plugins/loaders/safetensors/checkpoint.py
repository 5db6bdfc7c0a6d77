"""A Hugging Face checkpoint directory read lazily, one tensor at a time.

safetensors files are memory-mapped by ``safe_open``; ``.bin`` files go through
``torch.load(weights_only=True, mmap=True)``, which refuses any pickle that is not plain
tensors (the refusal becomes UnsafeCheckpointError).
"""
from __future__ import annotations

import json
import math
import pickle
import zipfile
from pathlib import Path
from typing import Iterator

import torch
from safetensors import SafetensorError, safe_open

from toolkit.core.checkpoint import CheckpointSummary, TensorInfo
from toolkit.core.errors import CorruptFileError, SourceError, UnsafeCheckpointError

INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


def weight_files(folder: Path, *, quiet: bool = False) -> list[Path]:
    """The checkpoint's weight files in index order (safetensors preferred over .bin)."""
    for index_name, pattern in ((INDEX, "*.safetensors"), (BIN_INDEX, "pytorch_model*.bin")):
        index = folder / index_name
        if index.exists():
            names = json.loads(index.read_text())["weight_map"].values()
            return [folder / name for name in dict.fromkeys(names)]
        found = sorted(folder.glob(pattern))
        if found:
            return found
    if quiet:
        return []
    raise SourceError(f"{folder} has no *.safetensors or pytorch_model*.bin files")


class HFCheckpoint:
    format = "safetensors"
    quant_scheme = None
    quant_metadata = None

    def __init__(self, folder: Path, *, override: str | None = None):
        self.folder = folder
        self.files = tuple(weight_files(folder))
        config_path = Path(override) / "config.json" if override else folder / "config.json"
        self.hf_config = _read_json(config_path)
        self._names: list[tuple[str, Path]] | None = None

    # ---- tensors ------------------------------------------------------------------------
    def _index(self) -> list[tuple[str, Path]]:
        if self._names is None:
            self._names = [(name, path) for path in self.files for name in _keys(path)]
        return self._names

    def tensor_names(self) -> list[str]:
        return [name for name, _ in self._index()]

    def read_tensors(self) -> Iterator[tuple[str, str, torch.Tensor]]:
        for path in self.files:
            if path.suffix == ".safetensors":
                yield from _read_safetensors(path)
            else:
                for name, tensor in _load_bin(path).items():
                    yield name, str(path), tensor

    # ---- the rest of the contract -------------------------------------------------------
    def tokenizer(self):
        if not any((self.folder / name).exists() for name in TOKENIZER_FILES):
            return None
        from transformers import AutoTokenizer  # noqa: PLC0415 - slow import, only when needed

        return AutoTokenizer.from_pretrained(self.folder)

    def summary(self) -> CheckpointSummary:
        tensors = [info for path in self.files for info in _tensor_infos(path)]
        arch = (self.hf_config.get("architectures") or [self.hf_config.get("model_type", "?")])[0]
        return CheckpointSummary(format=self.format, architecture=arch, metadata=self.hf_config, tensors=tensors)

    def close(self) -> None:
        return None


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CorruptFileError(f"cannot read JSON: {exc}", file=str(path)) from exc


def _open(path: Path):
    try:
        return safe_open(str(path), framework="pt")
    except (SafetensorError, OSError, ValueError) as exc:
        raise CorruptFileError(f"not a readable safetensors file: {exc}", file=str(path)) from exc


def _keys(path: Path) -> list[str]:
    if path.suffix != ".safetensors":
        return list(_load_bin(path))
    with _open(path) as handle:
        return list(handle.keys())


def _read_safetensors(path: Path) -> Iterator[tuple[str, str, torch.Tensor]]:
    with _open(path) as handle:
        for name in handle.keys():
            try:
                tensor = handle.get_tensor(name)
            except (SafetensorError, OSError, ValueError) as exc:
                raise CorruptFileError(f"cannot read tensor data: {exc}", file=str(path), tensor=name) from exc
            yield name, str(path), tensor


def _tensor_infos(path: Path) -> list[TensorInfo]:
    if path.suffix != ".safetensors":
        return [TensorInfo(n, tuple(t.shape), str(t.dtype), t.nbytes, path.name) for n, t in _load_bin(path).items()]
    infos = []
    with _open(path) as handle:
        for name in handle.keys():
            piece = handle.get_slice(name)
            shape = tuple(piece.get_shape())
            dtype = piece.get_dtype()
            infos.append(TensorInfo(name, shape, dtype, math.prod(shape) * _dtype_bytes(dtype), path.name))
    return infos


def _dtype_bytes(dtype: str) -> int:
    return {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "F16": 2, "BF16": 2, "I16": 2}.get(dtype, 1)


def _load_bin(path: Path) -> dict[str, torch.Tensor]:
    try:
        # mmap needs the zip container torch.save writes since 1.6; older pickles load eagerly
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpointError(f"refused: the pickle holds objects other than tensors ({exc})",
                                    file=str(path)) from exc
    except (RuntimeError, EOFError, OSError) as exc:
        raise CorruptFileError(f"not a readable torch checkpoint: {exc}", file=str(path)) from exc
    if not isinstance(state, dict):
        raise UnsafeCheckpointError(f"expected a dict of tensors, found {type(state).__name__}", file=str(path))
    return state
