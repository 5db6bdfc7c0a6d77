"""Tensorizer: a loaded model's per-rank stored state serialized with CoreWeave's tensorizer
(``TensorSerializer``/``TensorDeserializer``), optionally encrypted (libsodium) and
hash-verified; loaded back at the same tp with no name mapping, re-sharding or re-quantizing.

Same stored-state protocol and manifest as the ``sharded`` plugin, different container.
"""
from toolkit.core.hookspecs import hookimpl
from toolkit.plugins.loaders.sharded.stored import StoredNameMap

from .checkpoint import DecryptionError, TensorizerCheckpoint
from .loader import TensorizerLoader
from .writer import TensorizerSaveOptions

__all__ = ["DecryptionError", "TensorizerCheckpoint", "TensorizerLoader", "TensorizerSaveOptions"]


@hookimpl
def register_loaders(register):
    register(TensorizerLoader())


@hookimpl
def register_name_maps(register):
    register(StoredNameMap(format="tensorizer"))
