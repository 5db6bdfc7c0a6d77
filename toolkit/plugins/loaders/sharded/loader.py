"""The ``sharded`` loader: detects a sharded-state directory, opens its rank, saves a loaded model."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from toolkit.core.checkpoint import Source

from .manifest_find import find
from .tags import MANIFEST, TAG

# The reader and the writer (safetensors, staging, the manifest's checks, stored.py) are imported by
# open() / save(), not at registration: detect() runs on every load of every format.


def state_folder(source: Source) -> Path:
    return source.path if source.is_dir else source.path.parent


def save_everywhere(save_rank_fn, loaded_model, dest, options) -> dict[str, Any]:
    """Run ``save_rank_fn(local_model, dest, options)`` on every rank; rank 0's facts.

    A multi-process handle (``toolkit.load(..., tp=N)`` from one process) runs it in each worker
    through ``run_all``; an in-process model (tp=1, or one rank under torchrun) runs it here.
    """
    if hasattr(loaded_model, "run_all"):
        return loaded_model.run_all(save_rank_fn, str(Path(dest).absolute()), options)[0]
    return save_rank_fn(loaded_model, dest, options)


class ShardedLoader:
    name = "sharded"

    def detect(self, source: Source) -> float | None:
        return 1.0 if find(state_folder(source), MANIFEST, TAG) else None

    def open(self, source: Source, load_config) -> "ShardedCheckpoint":
        from .checkpoint import ShardedCheckpoint  # noqa: PLC0415

        return ShardedCheckpoint(state_folder(source), tp_rank=load_config.tp_rank, tp_size=load_config.tp_size)

    def save(self, loaded_model, dest, options=None) -> dict[str, Any]:
        """Write each rank's parameters as stored (see writer.py); options: ShardedSaveOptions or a mapping."""
        from .options import resolve_options  # noqa: PLC0415
        from .writer import ShardedSaveOptions, save_rank  # noqa: PLC0415

        return save_everywhere(save_rank, loaded_model, dest, resolve_options(ShardedSaveOptions, options))

    def quant_for_target(self, kind: str | None) -> str | None:
        """``--to sharded:SPEC`` quantizes on the fly with SPEC before saving."""
        return kind
