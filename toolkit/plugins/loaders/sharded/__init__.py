"""Sharded state: a loaded model saved per tensor-parallel rank exactly as it sits in memory
(already sharded, already quantized) and loaded back at the same tp with no name mapping,
re-sharding or re-quantizing: the fastest path into a running model.

``registry.loader("sharded").save(loaded_model, dest, options)`` writes it;
``toolkit.load(dest, tp=N)`` reads it. Parameters take part through the stored-state
protocol (``stored_state()`` / ``load_stored()``, see ``toolkit.core.params``).
"""
from toolkit.core.hookspecs import hookimpl

from .errors import ChecksumMismatchError, TensorParallelMismatchError
from .loader import ShardedLoader
from .stored import StoredNameMap

_LAZY = {"ShardedCheckpoint": ".checkpoint", "ShardedSaveOptions": ".writer"}


def __getattr__(name: str):
    """The names in ``_LAZY``, imported on first use: registration needs only the loader and the
    name map, so a load of another format never imports this format's reader and writer."""
    if name in _LAZY:
        import importlib  # noqa: PLC0415

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ChecksumMismatchError", "ShardedCheckpoint", "ShardedLoader", "ShardedSaveOptions",
           "TensorParallelMismatchError"]


@hookimpl
def register_loaders(register):
    register(ShardedLoader())


@hookimpl
def register_name_maps(register):
    register(StoredNameMap(format="sharded"))
