"""Tensorizer: a loaded model's per-rank stored state serialized with CoreWeave's tensorizer
(``TensorSerializer``/``TensorDeserializer``), optionally encrypted (libsodium) and
hash-verified; loaded back at the same tp with no name mapping, re-sharding or re-quantizing.

Same stored-state protocol and manifest as the ``sharded`` plugin, different container.
"""
from toolkit.core.hookspecs import hookimpl
from toolkit.plugins.loaders.sharded.stored import StoredNameMap

from .loader import TensorizerLoader

_LAZY = {"DecryptionError": ".checkpoint", "TensorizerCheckpoint": ".checkpoint", "TensorizerSaveOptions": ".writer"}


def __getattr__(name: str):
    """The names in ``_LAZY``, imported on first use: registration needs only the loader and the
    name map, so a load of another format never imports this format's reader and writer."""
    if name in _LAZY:
        import importlib  # noqa: PLC0415

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DecryptionError", "TensorizerCheckpoint", "TensorizerLoader", "TensorizerSaveOptions"]


@hookimpl
def register_loaders(register):
    register(TensorizerLoader())


@hookimpl
def register_name_maps(register):
    register(StoredNameMap(format="tensorizer"))
