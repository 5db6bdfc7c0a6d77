"""The JSON manifest of a per-rank stored state (shared by the sharded and tensorizer writers).

::

    {"format": "<tag>", "version": 1, "architecture": ..., "hf_config": {...},
     "quant_scheme": ..., "quant_metadata": ..., "params_dtype": ..., "tp_size": N,
     "tokenizer_files": [...], "ranks": {"0": {"files": [...], "tensors": [{"name", "file",
     "dtype", "shape", "sha256"?}, ...]}, ...}, ...writer-specific keys}

Each rank writes its own entry as ``rank-R.json`` in the staging directory; rank 0 merges the
entries into the manifest once every rank finished.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from toolkit.core.errors import CorruptFileError, MissingMetadataError

from .errors import TensorParallelMismatchError
from .manifest_checks import check_manifest
from .stored import json_text

VERSION = 1
REQUIRED = ("format", "version", "architecture", "hf_config", "quant_scheme", "params_dtype", "tp_size", "ranks")


def piece_path(folder: Path, rank: int) -> Path:
    return folder / f"rank-{rank}.json"


def write_piece(folder: Path, rank: int, entry: dict[str, Any]) -> None:
    piece_path(folder, rank).write_text(json_text(entry))


def merge_pieces(folder: Path, name: str, fields: dict[str, Any]) -> dict[str, Any]:
    """Write ``name`` = fields + every rank's piece (then delete the pieces); returns the manifest."""
    ranks = {}
    for rank in range(fields["tp_size"]):
        piece = piece_path(folder, rank)
        ranks[str(rank)] = json.loads(piece.read_text())
        piece.unlink()
    manifest = dict(fields, version=VERSION, ranks=ranks)
    (folder / name).write_text(json_text(manifest))
    return manifest


def read(path: Path, tag: str) -> dict[str, Any]:
    """The parsed, checked manifest (see manifest_checks.py); typed errors naming the file and key."""
    try:
        manifest = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise CorruptFileError(f"cannot read the manifest: {exc}", file=str(path)) from exc
    if not isinstance(manifest, dict) or manifest.get("format") != tag:
        raise CorruptFileError(f"not a {tag} manifest", file=str(path))
    missing = [key for key in REQUIRED if key not in manifest]
    if missing:
        raise MissingMetadataError(f"manifest lacks {', '.join(missing)}", file=str(path))
    if manifest["version"] != VERSION:
        raise CorruptFileError(f"manifest version {manifest['version']!r} is not supported (expected {VERSION})",
                               file=str(path))
    check_manifest(manifest, path)
    return manifest


def rank_entry(manifest: dict[str, Any], *, tp_rank: int, tp_size: int, path: Path) -> dict[str, Any]:
    """This rank's files and tensors; TensorParallelMismatchError when the tp size differs."""
    saved = int(manifest["tp_size"])
    if tp_size != saved:
        raise TensorParallelMismatchError(
            f"this state was saved at tp={saved} and holds each rank's shard as stored; it loads only at "
            f"tp={saved}, not tp={tp_size} (load the original checkpoint to re-shard)", file=str(path))
    entry = manifest["ranks"].get(str(tp_rank))
    if entry is None:
        raise MissingMetadataError(f"manifest has no entry for rank {tp_rank}", file=str(path))
    return entry
