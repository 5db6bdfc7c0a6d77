"""Tensorizer: a loaded model's per-rank stored state serialized with CoreWeave's tensorizer
(``TensorSerializer``/``TensorDeserializer``), optionally encrypted (libsodium) and
hash-verified; loaded back at the same tp with no name mapping, re-sharding or re-quantizing.

Same stored-state protocol and manifest as the ``sharded`` plugin, different container.
"""
from toolkit.core.deferred import Deferred
from toolkit.core.hookspecs import hookimpl
from toolkit.core.lazy import lazy_attributes

from .loader import TensorizerLoader

# Imported on first use: registration needs only the loader and the name map (Deferred, see
# names.py), so a load of another format never imports this format's reader, writer or stored.py.
_LAZY = {"DecryptionError": ".checkpoint", "TensorizerCheckpoint": ".checkpoint", "TensorizerSaveOptions": ".writer"}


__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = ["DecryptionError", "TensorizerCheckpoint", "TensorizerLoader", "TensorizerSaveOptions"]


@hookimpl
def register_loaders(register):
    register(TensorizerLoader())


@hookimpl
def register_name_maps(register):
    register(Deferred(f"{__name__}.names:NAMES", format="tensorizer", architecture="*"))
