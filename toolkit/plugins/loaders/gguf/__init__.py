"""GGUF (llama.cpp) models: loader, metadata -> config, tokenizer, and name maps per architecture.

The packed weights are served by the ``gguf`` quant scheme (``toolkit.plugins.quant.gguf``).
The classes below load on first use, so torch-free modules of this package (direct.py and what
it reads) can be imported without the loader's torch-based ones.
"""
from toolkit.core.hookspecs import hookimpl
from toolkit.core.lazy import lazy_attributes

__all__ = ["GGUFCheckpoint", "GGUFLoader", "GGUFNameMap", "GGUFTensor"]
_LAZY = {"GGUFCheckpoint": ".checkpoint", "GGUFLoader": ".loader", "GGUFNameMap": ".names", "GGUFTensor": ".tensor"}


__getattr__ = lazy_attributes(__name__, _LAZY)


@hookimpl
def register_loaders(register):
    from .loader import GGUFLoader  # noqa: PLC0415

    register(GGUFLoader())


@hookimpl
def register_name_maps(register):
    from .hybrid import NAME_MAPS as HYBRID_NAME_MAPS  # noqa: PLC0415
    from .names import NAME_MAPS  # noqa: PLC0415

    for name_map in (*NAME_MAPS, *HYBRID_NAME_MAPS):
        register(name_map)
