"""The schema of a stored-state manifest, checked field by field when it is read.

Everything the loader later trusts is checked here, naming the manifest and the key: the tp
size is a positive integer and ``ranks`` holds exactly ranks ``0 .. tp_size - 1``; each rank
lists plain file names inside the state directory and tensor records (name, file among the
rank's files, dtype torch knows, shape of non-negative integers, optional sha256 hex digest);
``tokenizer_files`` are plain file names that exist; ``hf_config`` is an object.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from toolkit.core import validate as v
from toolkit.core.errors import CorruptFileError

from .stored import parse_dtype

MAX_TP = 1 << 12
SHA256 = re.compile(r"[0-9a-f]{64}")


def check_manifest(manifest: dict[str, Any], path: Path) -> None:
    file = str(path)
    v.text(manifest["architecture"], key="architecture", file=file)
    v.mapping(manifest["hf_config"], key="hf_config", file=file)
    if manifest["quant_scheme"] is not None:
        v.text(manifest["quant_scheme"], key="quant_scheme", file=file)
    dtype = _dtype(manifest["params_dtype"], key="params_dtype", file=file)
    if not dtype.is_floating_point:
        raise CorruptFileError(f"params_dtype {manifest['params_dtype']!r} is not a floating-point dtype",
                               file=file, key="params_dtype")
    tp_size = v.integer(manifest["tp_size"], key="tp_size", file=file, maximum=MAX_TP)
    ranks = v.mapping(manifest["ranks"], key="ranks", file=file)
    if sorted(ranks) != sorted(str(rank) for rank in range(tp_size)):
        raise CorruptFileError(f"ranks {sorted(ranks)[:8]} are not exactly 0..{tp_size - 1} for tp_size {tp_size}",
                               file=file, key="ranks")
    for rank, entry in ranks.items():
        _check_rank(entry, path.parent, file=file, key=f"ranks.{rank}")
    for index, name in enumerate(v.sequence(manifest.get("tokenizer_files") or [], key="tokenizer_files", file=file)):
        plain_file(path.parent, name, file=file, key=f"tokenizer_files[{index}]", must_exist=True)


def _check_rank(entry: Any, folder: Path, *, file: str, key: str) -> None:
    entry = v.mapping(entry, key=key, file=file)
    files = v.texts(entry.get("files"), key=f"{key}.files", file=file)
    for index, name in enumerate(files):
        plain_file(folder, name, file=file, key=f"{key}.files[{index}]")
    records = v.sequence(entry.get("tensors"), key=f"{key}.tensors", file=file, max_items=1 << 20)
    if not records:
        raise CorruptFileError("the rank lists no tensors", file=file, key=f"{key}.tensors")
    for index, record in enumerate(records):
        _check_record(record, set(files), file=file, key=f"{key}.tensors[{index}]")


def _check_record(record: Any, files: set[str], *, file: str, key: str) -> None:
    record = v.mapping(record, key=key, file=file)
    v.text(record.get("name"), key=f"{key}.name", file=file)
    if not isinstance(record.get("file"), str) or record["file"] not in files:
        raise CorruptFileError(f"tensor file {record.get('file')!r} is not among the rank's files", file=file,
                               key=f"{key}.file")
    _dtype(record.get("dtype"), key=f"{key}.dtype", file=file)
    shape = v.sequence(record.get("shape"), key=f"{key}.shape", file=file, max_items=8)
    for dim_index, dim in enumerate(shape):
        v.integer(dim, key=f"{key}.shape[{dim_index}]", file=file, minimum=0, maximum=1 << 40)
    if "sha256" in record and not (isinstance(record["sha256"], str) and SHA256.fullmatch(record["sha256"])):
        raise CorruptFileError(f"sha256 {record['sha256']!r} is not a hex digest", file=file, key=f"{key}.sha256")


def _dtype(value: Any, *, key: str, file: str):
    try:
        return parse_dtype(v.text(value, key=key, file=file))
    except ValueError as exc:
        raise CorruptFileError(str(exc), file=file, key=key) from exc


def plain_file(folder: Path, name: Any, *, file: str, key: str, must_exist: bool = False) -> Path:
    """``folder / name`` for a plain file name (no separators, no ``..``, not absolute); refused otherwise."""
    name = v.text(name, key=key, file=file)
    if "/" in name or "\\" in name or name in (".", "..") or "\x00" in name or Path(name).is_absolute():
        raise CorruptFileError(f"{name!r} is not a plain file name inside the state directory; refused",
                               file=file, key=key)
    path = folder / name
    if must_exist and not path.is_file():
        raise CorruptFileError(f"{name!r} does not exist in {folder}", file=file, key=key)
    return path
