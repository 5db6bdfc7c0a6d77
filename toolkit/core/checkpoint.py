"""The Loader and Checkpoint contracts.

A Loader recognises a source and opens it as a Checkpoint: a config in Hugging Face
``config.json`` vocabulary, an optional tokenizer, the quant scheme the file requires, and
tensors read lazily one at a time. Tensors may be ``torch.Tensor`` or a format's own object
(packed bytes plus type); only that format's scheme and name map look inside it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Protocol

from .records import FrozenRecord, Record

# Source, TensorInfo and CheckpointSummary are hand-written records, not dataclasses: every load imports
# this module, and defining a dataclass costs ~0.5-1 ms (records.py).


class Source(FrozenRecord):
    """A resolved model reference: the path the user meant and the files under it."""

    reference: str
    path: Path
    files: tuple[Path, ...]
    hint: str | None  # the ":QUANT" suffix of "repo:QUANT", if given

    def __init__(self, reference: str, path: Path, files: tuple[Path, ...], hint: str | None = None):
        self.__dict__.update(reference=reference, path=path, files=files, hint=hint)

    @property
    def is_dir(self) -> bool:
        return self.path.is_dir()


class TensorInfo(FrozenRecord):
    """One row of ``toolkit inspect``: name, logical shape, storage type, bytes, file."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    file: str

    def __init__(self, name: str, shape: tuple[int, ...], dtype: str, nbytes: int, file: str):
        self.__dict__.update(name=name, shape=shape, dtype=dtype, nbytes=nbytes, file=file)


class CheckpointSummary(Record):
    """What ``toolkit inspect`` prints, gathered without reading tensor data."""

    format: str
    architecture: str
    metadata: dict[str, Any]
    tensors: list[TensorInfo]

    def __init__(self, format: str, architecture: str, metadata: dict[str, Any],
                 tensors: list[TensorInfo] | None = None):
        self.format = format
        self.architecture = architecture
        self.metadata = metadata
        self.tensors = [] if tensors is None else tensors


class Checkpoint(Protocol):
    format: str
    files: tuple[Path, ...]
    hf_config: dict
    quant_scheme: str | None   # name of the scheme the data needs; None for plain weights
    quant_metadata: Any         # opaque to the core; handed to that scheme's factory
    # Optional ``params_dtype: torch.dtype``: a checkpoint of in-memory (stored) state pins the dtype
    # it was saved at; load.py uses it when the caller asked for none.

    def tensor_names(self) -> list[str]: ...

    def read_tensors(self) -> Iterator[tuple[str, str, Any]]:
        """Yield ``(name, file, tensor)`` one at a time, each read lazily (memory-mapped)."""

    def tokenizer(self) -> Any | None:
        """A transformers-compatible tokenizer (encode, decode, apply_chat_template), or None."""

    def summary(self) -> CheckpointSummary: ...

    def close(self) -> None: ...


class Loader(Protocol):
    name: str

    def detect(self, source: Source) -> float | None:
        """Confidence in [0, 1] that this loader reads ``source``; None if it cannot."""

    def open(self, source: Source, load_config) -> Checkpoint: ...
