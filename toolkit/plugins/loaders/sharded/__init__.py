"""Sharded state: a loaded model saved per tensor-parallel rank exactly as it sits in memory
(already sharded, already quantized) and loaded back at the same tp with no name mapping,
re-sharding or re-quantizing: the fastest path into a running model.

``registry.loader("sharded").save(loaded_model, dest, options)`` writes it;
``toolkit.load(dest, tp=N)`` reads it. Parameters take part through the stored-state
protocol (``stored_state()`` / ``load_stored()``, see ``toolkit.core.params``).
"""
from toolkit.core.deferred import Deferred
from toolkit.core.hookspecs import hookimpl
from toolkit.core.lazy import lazy_attributes

from .errors import ChecksumMismatchError, TensorParallelMismatchError
from .loader import ShardedLoader

# Imported on first use: registration needs only the loader and the name map (Deferred, see
# names.py), so a load of another format never imports this format's reader, writer or stored.py.
_LAZY = {"ShardedCheckpoint": ".checkpoint", "ShardedSaveOptions": ".writer", "StoredNameMap": ".stored"}


__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = ["ChecksumMismatchError", "ShardedCheckpoint", "ShardedLoader", "ShardedSaveOptions",
           "TensorParallelMismatchError"]


@hookimpl
def register_loaders(register):
    register(ShardedLoader())


@hookimpl
def register_name_maps(register):
    register(Deferred(f"{__name__}.names:NAMES", format="sharded", architecture="*"))
