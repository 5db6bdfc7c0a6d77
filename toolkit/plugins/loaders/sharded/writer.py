"""Save a loaded model's per-rank stored state as safetensors parts plus a manifest.

Layout of DEST (a directory)::

    toolkit-sharded.json                       manifest (see manifest.py), sha256 per tensor
    model-rank-{rank}-part-{part}.safetensors  each rank's parameters as they sit in memory
    tokenizer.json, tokenizer_config.json ...  the model's tokenizer, saved by transformers
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from .rank_save import save_rank_state
from .stored import StoredTensor, dtype_name, iter_stored, sha256

from .tags import MANIFEST, TAG


@dataclass(frozen=True)
class ShardedSaveOptions:
    """:param max_part_bytes: start a new part file once a part holds this many bytes
    :param overwrite: replace an existing DEST (only once the new state is complete)"""

    max_part_bytes: int = 2 * 2**30
    overwrite: bool = False


def save_rank(loaded, dest, options: ShardedSaveOptions) -> dict[str, Any]:
    """Every rank of ``loaded`` calls this together (tp=1: just this process); returns summary facts."""
    fields, entry = save_rank_state(
        loaded, dest, tag=TAG, manifest_name=MANIFEST, overwrite=options.overwrite,
        write_entry=lambda staging, rank: write_parts(loaded.model, staging, rank, options.max_part_bytes))
    return {"format": "sharded", "tp": fields["tp_size"], "rank_files": len(entry["files"]),
            "rank_tensors": len(entry["tensors"])}


def write_parts(model, folder: Path, rank: int, max_part_bytes: int) -> dict[str, Any]:
    """This rank's stored tensors in size-capped safetensors files; the rank's manifest entry."""
    files: list[str] = []
    records: list[dict[str, Any]] = []
    batch: list[StoredTensor] = []
    for stored in iter_stored(model):
        if batch and sum(s.tensor.nbytes for s in batch) + stored.tensor.nbytes > max_part_bytes:
            _flush(batch, folder, rank, files, records)
        batch.append(stored)
    if batch or not files:
        _flush(batch, folder, rank, files, records)
    return {"files": files, "tensors": records}


def _flush(batch: list[StoredTensor], folder: Path, rank: int, files: list[str], records: list[dict]) -> None:
    name = f"model-rank-{rank}-part-{len(files)}.safetensors"
    save_file({stored.name: stored.tensor for stored in batch}, str(folder / name), metadata={"format": "pt"})
    files.append(name)
    records.extend({"name": s.name, "file": name, "dtype": dtype_name(s.tensor.dtype), "shape": list(s.tensor.shape),
                    "sha256": sha256(s.tensor)} for s in batch)
    batch.clear()
