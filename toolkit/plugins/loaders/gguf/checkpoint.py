"""A GGUF model (one file or split parts) as a Checkpoint: config, tokenizer, packed tensors."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from toolkit.core.checkpoint import CheckpointSummary, TensorInfo
from toolkit.core.errors import CheckpointError, CorruptFileError, InvalidConfigError, SourceError
from toolkit.plugins.loaders.safetensors.files import read_json_object

from .config import hf_config
from .metadata import Metadata
from .metadata_checks import check_globals
from .reader import FastGGUFReader, open_reader
from .tensor import GGUFTensor, from_reader_tensor, type_name
from .tokenizer import build_tokenizer
from .tokenizer_checks import check_tokenizer_metadata

MAX_CONFIG_VALUES = 1 << 16  # a config-bearing tensor (rope_freqs) holds one value per rotary pair


class GGUFCheckpoint:
    """Tensors are yielded as GGUFTensor (packed rows viewing the memory map), one at a time.

    :param parts: the model's files, in split order
    :param config_override: a directory whose ``config.json`` keys replace the translated ones
    """

    format = "gguf"
    quant_scheme = "gguf"

    def __init__(self, parts: list[Path], *, config_override: str | None = None):
        self.files = tuple(parts)
        self.config_file = str(parts[0])
        self._readers: list[FastGGUFReader] = [open_reader(path) for path in parts]
        self.metadata = Metadata(self._readers[0].fields, file=str(parts[0]))
        self._check_split()
        self._index = self._tensor_index()
        # before any weight is read: a broken vocabulary fails now, not after the whole load
        check_tokenizer_metadata(self.metadata)
        types = {name: type_name(int(t.tensor_type)) for name, (_, t) in self._index.items()}
        self.hf_config = hf_config(self.metadata, list(self._index), types, read_tensor=self._values)
        if config_override:
            self.hf_config.update(_read_override(Path(config_override)))
        self.quant_metadata = {"tensor_types": types, "file_type": self.metadata.get("general.file_type")}
        self._tokenizer = None

    def _check_split(self) -> None:
        for index, reader in enumerate(self._readers):
            fields = Metadata(reader.fields, file=str(reader.path))
            check_globals(fields)
            count = fields.get("split.count", 1 if index == 0 else None)
            if count is not None and int(count) != len(self._readers):
                raise SourceError(f"metadata says the model has {count} split parts, but {len(self._readers)} "
                                  f"were found ({', '.join(str(p) for p in self.files)})")
            number = fields.get("split.no")
            if number is not None and int(number) != index:
                raise CorruptFileError(f"part {index + 1} of the split model says it is part {int(number) + 1}",
                                       file=str(reader.path))

    def _tensor_index(self) -> dict[str, tuple[FastGGUFReader, object]]:
        index: dict[str, tuple[FastGGUFReader, object]] = {}
        for reader in self._readers:
            for tensor in reader.tensors:
                if tensor.name in index:
                    raise CorruptFileError("tensor appears in two split parts", file=str(reader.path),
                                           tensor=tensor.name)
                index[tensor.name] = (reader, tensor)
        expected = self.metadata.get("split.tensors.count")
        if expected is not None and int(expected) != len(index):
            raise CorruptFileError(f"split metadata promises {expected} tensors, the parts hold {len(index)}",
                                   file=str(self.files[0]))
        return index

    def _values(self, name: str) -> np.ndarray:
        """A small tensor's values as float32 (config-bearing tensors such as ``rope_freqs``)."""
        reader, tensor = self._index[name]
        if type_name(int(tensor.tensor_type)) not in ("F32", "F16", "BF16") or len(tensor.shape) != 1 \
                or int(tensor.n_elements) > MAX_CONFIG_VALUES:
            raise InvalidConfigError(f"expected a 1-D float tensor of at most {MAX_CONFIG_VALUES} values, found "
                                     f"{type_name(int(tensor.tensor_type))} {list(tensor.shape)}",
                                     file=str(reader.path), tensor=name)
        return from_reader_tensor(tensor).to_dense().float().numpy()

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Logical shapes, torch order, from the tensor table (see core/tensor_checks.py)."""
        return {name: tuple(int(d) for d in reversed(t.shape.tolist())) for name, (_, t) in self._index.items()}

    # ---- tensors ------------------------------------------------------------------------
    def tensor_names(self) -> list[str]:
        return list(self._index)

    def read_tensors(self) -> Iterator[tuple[str, str, GGUFTensor]]:
        for name, (reader, tensor) in self._index.items():
            yield name, str(reader.path), from_reader_tensor(tensor)

    # ---- the rest of the contract -------------------------------------------------------
    def tokenizer(self):
        if self._tokenizer is None:
            try:
                self._tokenizer = build_tokenizer(self.metadata)
            except (CheckpointError, KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # noqa: BLE001 - the tokenizers library panics (a BaseException) on bad input
                raise CorruptFileError(f"cannot build the tokenizer from tokenizer.ggml.*: {type(exc).__name__}: "
                                       f"{exc}", file=str(self.files[0])) from exc
        return self._tokenizer

    def summary(self) -> CheckpointSummary:
        tensors = [TensorInfo(name, tuple(int(d) for d in reversed(t.shape.tolist())), type_name(int(t.tensor_type)),
                              int(t.n_bytes), reader.path.name) for name, (reader, t) in self._index.items()]
        return CheckpointSummary(format=self.format, architecture=str(self.metadata.get("general.architecture", "?")),
                                 metadata=self.metadata.scalars(), tensors=tensors)

    def close(self) -> None:
        """Drop the readers; tensors already placed in the model keep their own copies."""
        self._readers, self._index = [], {}


def _read_override(folder: Path) -> dict:
    path = folder / "config.json" if folder.is_dir() else folder
    if not path.is_file():
        raise SourceError(f"the config override {path} does not exist")
    return read_json_object(path)
