"""A Hugging Face checkpoint directory read lazily, one tensor at a time.

safetensors files are memory-mapped by ``safe_open``; ``.bin`` files go through
``torch.load(weights_only=True, mmap=True)``, which refuses any pickle that is not plain
tensors (the refusal becomes UnsafeCheckpointError).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Iterator

import torch
from safetensors import SafetensorError, safe_open

from toolkit.core.checkpoint import CheckpointSummary, TensorInfo
from toolkit.core.errors import CorruptFileError, SourceError

from .files import BIN_INDEX, INDEX, has_weights, load_bin, read_index, read_json_object

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


__all__ = ["HFCheckpoint", "has_weights"]


def weight_map(folder: Path) -> tuple[Path | None, dict[str, Path] | None]:
    """(index file, tensor name -> shard) of the checkpoint's index; (None, None) without one."""
    for index_name in (INDEX, BIN_INDEX):
        index = folder / index_name
        if index.exists():
            return index, read_index(index)
    return None, None


def weight_files(folder: Path, *, quiet: bool = False) -> list[Path]:
    """The checkpoint's weight files in index order (safetensors preferred over .bin)."""
    _, mapping = weight_map(folder)
    if mapping is not None:
        return list(dict.fromkeys(mapping.values()))
    for pattern in ("*.safetensors", "pytorch_model*.bin"):
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

    def __init__(self, folder: Path, *, override: str | None = None, packed: bool = False):
        """:param packed: integer and scalar tensors are expected (a quantized checkpoint's codes)"""
        self.folder, self.packed = folder, packed
        self.index_file, self.weight_map = weight_map(folder)
        self.files = tuple(dict.fromkeys(self.weight_map.values())) if self.weight_map else tuple(weight_files(folder))
        config_path = Path(override) / "config.json" if override else folder / "config.json"
        self.config_file = str(config_path)
        self.hf_config = read_json_object(config_path)
        self._names: list[tuple[str, Path]] | None = None

    # ---- tensors ------------------------------------------------------------------------
    def _index(self) -> list[tuple[str, Path]]:
        if self._names is None:
            self._names = [(name, path) for path in self.files for name in _keys(path, self.packed)]
            self._check_index()
        return self._names

    def _check_index(self) -> None:
        """Every tensor the index places in a shard is in that shard."""
        if self.weight_map is None:
            return
        held = {(name, path) for name, path in self._names}
        for name, path in self.weight_map.items():
            if (name, path) not in held:
                raise CorruptFileError(f"the index places this tensor in {path.name}, which does not hold it",
                                       file=str(self.index_file), tensor=name)

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Logical shapes from the headers (no tensor data read); see core/tensor_checks.py."""
        return {info.name: info.shape for path in self.files for info in _tensor_infos(path, self.packed)}

    def tensor_names(self) -> list[str]:
        return [name for name, _ in self._index()]

    def read_tensors(self) -> Iterator[tuple[str, str, torch.Tensor]]:
        self._index()  # the index is checked against the shards before any tensor is yielded
        for path in self.files:
            if path.suffix == ".safetensors":
                yield from _read_safetensors(path)
            else:
                for name, tensor in load_bin(path, packed=self.packed).items():
                    yield name, str(path), tensor

    # ---- the rest of the contract -------------------------------------------------------
    def tokenizer(self):
        if not any((self.folder / name).exists() for name in TOKENIZER_FILES):
            return None
        from transformers import AutoTokenizer  # noqa: PLC0415 - slow import, only when needed

        try:
            return AutoTokenizer.from_pretrained(self.folder)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - transformers/tokenizers on untrusted files (tokenizers can panic)
            raise CorruptFileError(f"cannot load the tokenizer: {type(exc).__name__}: {exc}",
                                   file=str(self.folder)) from exc

    def summary(self) -> CheckpointSummary:
        tensors = [info for path in self.files for info in _tensor_infos(path, self.packed)]
        arch = (self.hf_config.get("architectures") or [self.hf_config.get("model_type", "?")])[0]
        return CheckpointSummary(format=self.format, architecture=arch, metadata=self.hf_config, tensors=tensors)

    def close(self) -> None:
        return None


def _open(path: Path):
    try:
        return safe_open(str(path), framework="pt")
    except (SafetensorError, OSError, ValueError) as exc:
        raise CorruptFileError(f"not a readable safetensors file: {exc}", file=str(path)) from exc


def _keys(path: Path, packed: bool) -> list[str]:
    if path.suffix != ".safetensors":
        return list(load_bin(path, packed=packed))
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


def _tensor_infos(path: Path, packed: bool = False) -> list[TensorInfo]:
    if path.suffix != ".safetensors":
        return [TensorInfo(n, tuple(t.shape), str(t.dtype), t.nbytes, path.name)
                for n, t in load_bin(path, packed=packed).items()]
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
