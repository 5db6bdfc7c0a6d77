"""GGUF (llama.cpp) models: loader, metadata -> config, tokenizer, and name maps per architecture.

The packed weights are served by the ``gguf`` quant scheme (``toolkit.plugins.quant.gguf``).
"""
from toolkit.core.hookspecs import hookimpl

from .checkpoint import GGUFCheckpoint
from .hybrid import NAME_MAPS as HYBRID_NAME_MAPS
from .loader import GGUFLoader
from .names import NAME_MAPS, GGUFNameMap
from .tensor import GGUFTensor

__all__ = ["GGUFCheckpoint", "GGUFLoader", "GGUFNameMap", "GGUFTensor"]


@hookimpl
def register_loaders(register):
    register(GGUFLoader())


@hookimpl
def register_name_maps(register):
    for name_map in (*NAME_MAPS, *HYBRID_NAME_MAPS):
        register(name_map)
