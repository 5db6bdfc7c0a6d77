"""What every per-rank state writer (sharded safetensors, tensorizer) does around its own files.

All ranks call :func:`save_rank_state` together: each checks its model can be saved, writes its
tensors into the staging directory with ``write_entry`` and leaves its manifest piece there;
rank 0 then saves the tokenizer and merges the pieces into the manifest, and the staging
directory is renamed to DEST only when all of that succeeded (see staging.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from . import manifest
from .staging import write_staged
from .stored import check_saveable, model_fields, save_tokenizer


def save_rank_state(loaded, dest, *, tag: str, manifest_name: str,
                    write_entry: Callable[[Path, int], dict[str, Any]], overwrite: bool = False,
                    extra_fields: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Save this rank's state under ``dest`` with ``write_entry(staging, rank) -> manifest entry``.

    :param tag: the manifest's ``format`` field
    :param extra_fields: manifest fields of the writer's own (e.g. ``encrypted``)
    :returns: ``(manifest fields, this rank's entry)``, for the writer's summary facts
    """
    check_saveable(loaded.model)
    fields = {"format": tag, **model_fields(loaded), **(extra_fields or {})}
    rank = loaded.parallel.tp_rank

    def write(staging: Path) -> dict[str, Any]:
        entry = write_entry(staging, rank)
        manifest.write_piece(staging, rank, entry)
        return entry

    def finalize(staging: Path) -> None:
        fields["tokenizer_files"] = save_tokenizer(loaded.tokenizer, staging)
        manifest.merge_pieces(staging, manifest_name, fields)

    entry = write_staged(dest, loaded.parallel, loaded.device, write, finalize, overwrite=overwrite)
    return fields, entry
