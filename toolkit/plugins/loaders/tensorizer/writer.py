"""Save a loaded model's per-rank stored state through tensorizer's TensorSerializer.

Layout of DEST (a directory)::

    toolkit-tensorizer.json        manifest (the sharded writer's fields, plus "encrypted")
    model-rank-{rank}.tensors      each rank's parameters as they sit in memory (tensorizer
                                   writes a crc32 and sha256 per tensor; optionally encrypted)
    tokenizer.json, ...            the model's tokenizer, saved by transformers
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolkit.plugins.loaders.sharded.rank_save import save_rank_state
from toolkit.plugins.loaders.sharded.stored import dtype_name, iter_stored

from .crypt import Key, encryption_params

from .tags import MANIFEST, TAG


@dataclass(frozen=True)
class TensorizerSaveOptions:
    """:param encryption_key: passphrase (str) or raw 32-byte key (bytes); None writes plain data
    :param overwrite: replace an existing DEST (only once the new state is complete)"""

    encryption_key: Key | None = None
    overwrite: bool = False


def rank_file(rank: int) -> str:
    return f"model-rank-{rank}.tensors"


def save_rank(loaded, dest, options: TensorizerSaveOptions) -> dict[str, Any]:
    """Every rank of ``loaded`` calls this together (tp=1: just this process); returns summary facts."""
    fields, entry = save_rank_state(
        loaded, dest, tag=TAG, manifest_name=MANIFEST, overwrite=options.overwrite,
        extra_fields={"encrypted": options.encryption_key is not None},
        write_entry=lambda staging, rank: serialize(loaded.model, staging / rank_file(rank), options.encryption_key))
    return {"format": "tensorizer", "tp": fields["tp_size"], "rank_tensors": len(entry["tensors"]),
            "encrypted": fields["encrypted"]}


def serialize(model, path: Path, key: Key | None) -> dict[str, Any]:
    """Write the model's stored tensors to one tensorizer file; the rank's manifest entry."""
    from tensorizer import TensorSerializer  # noqa: PLC0415 - optional dependency
    from tensorizer.serialization import TensorType  # noqa: PLC0415

    records = []
    serializer = TensorSerializer(str(path), encryption=encryption_params(key))
    try:
        for stored in iter_stored(model):  # module index 0: names are unique
            serializer.write_tensor(0, stored.name, TensorType.PARAM, stored.tensor)
            records.append({"name": stored.name, "file": path.name, "dtype": dtype_name(stored.tensor.dtype),
                            "shape": list(stored.tensor.shape)})
    finally:
        serializer.close()
    return {"files": [path.name], "tensors": records}
