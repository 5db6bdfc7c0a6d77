"""A Checkpoint over ``.npz`` archives: arrays are read one at a time, never unpickled."""
from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from toolkit.core.checkpoint import CheckpointSummary, TensorInfo
from toolkit.core.errors import CorruptFileError, UnsafeCheckpointError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


class NpzCheckpoint:
    format = "npz"
    quant_scheme = None  # plain arrays: the default (unquantized) scheme serves them
    quant_metadata = None

    def __init__(self, folder: Path, archives: list[Path], *, config_override: str | None = None):
        self.folder, self.files = folder, tuple(archives)
        config_path = Path(config_override or folder) / "config.json"
        try:
            self.hf_config = json.loads(config_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise CorruptFileError(f"cannot read config: {exc}", file=str(config_path)) from exc

    def tensor_names(self) -> list[str]:
        return [name for path in self.files for name in _members(path)]

    def read_tensors(self) -> Iterator[tuple[str, str, torch.Tensor]]:
        for path in self.files:
            with _open(path) as archive:
                for name in archive.files:
                    yield name, str(path), torch.from_numpy(_read(archive, path, name))

    def tokenizer(self):
        if not any((self.folder / name).exists() for name in TOKENIZER_FILES):
            return None
        from transformers import AutoTokenizer  # noqa: PLC0415 - slow import, only when needed

        return AutoTokenizer.from_pretrained(self.folder)

    def summary(self) -> CheckpointSummary:
        arch = (self.hf_config.get("architectures") or [self.hf_config.get("model_type", "?")])[0]
        tensors = [info for path in self.files for info in _headers(path)]
        return CheckpointSummary(format=self.format, architecture=arch, metadata=self.hf_config, tensors=tensors)

    def close(self) -> None:
        return None


def _open(path: Path):
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise CorruptFileError(f"not a readable .npz archive: {exc}", file=str(path)) from exc


def _read(archive, path: Path, name: str) -> np.ndarray:
    try:
        array = archive[name]
    except ValueError as exc:  # numpy refuses object arrays when allow_pickle=False
        raise UnsafeCheckpointError(f"refused: {exc}", file=str(path), tensor=name) from exc
    except (OSError, zipfile.BadZipFile, EOFError) as exc:
        raise CorruptFileError(f"cannot read array: {exc}", file=str(path), tensor=name) from exc
    return np.ascontiguousarray(array)


def _members(path: Path) -> list[str]:
    with _open(path) as archive:
        return list(archive.files)


def _headers(path: Path) -> list[TensorInfo]:
    """Shapes and dtypes from each member's .npy header, without reading array data."""
    infos = []
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.namelist():
                with archive.open(member) as handle:
                    shape, dtype = _npy_header(handle)
                infos.append(TensorInfo(member.removesuffix(".npy"), shape, str(dtype),
                                        int(np.prod(shape)) * dtype.itemsize, path.name))
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise CorruptFileError(f"not a readable .npz archive: {exc}", file=str(path)) from exc
    return infos


def _npy_header(handle) -> tuple[tuple[int, ...], np.dtype]:
    version = np.lib.format.read_magic(handle)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = read(handle)
    return tuple(shape), dtype
