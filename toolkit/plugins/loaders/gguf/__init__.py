"""GGUF (llama.cpp) models: loader, metadata -> config, tokenizer, and name maps per architecture.

The packed weights are served by the ``gguf`` quant scheme (``toolkit.plugins.quant.gguf``).
The classes below load on first use, so torch-free modules of this package (direct.py and what
it reads) can be imported without the loader's torch-based ones.
"""
from toolkit.core.deferred import Deferred
from toolkit.core.hookspecs import hookimpl
from toolkit.core.lazy import lazy_attributes

__all__ = ["GGUFCheckpoint", "GGUFLoader", "GGUFNameMap", "GGUFTensor"]
_LAZY = {"GGUFCheckpoint": ".checkpoint", "GGUFLoader": ".loader", "GGUFNameMap": ".names", "GGUFTensor": ".tensor"}


__getattr__ = lazy_attributes(__name__, _LAZY)


@hookimpl
def register_loaders(register):
    from .loader import GGUFLoader  # noqa: PLC0415

    register(GGUFLoader())


# The Gated DeltaNet hybrids' name maps (hybrid.py: torch, two dataclasses, the writer's tables) are
# registered Deferred (core/deferred.py), so only a hybrid load imports them: hybrid.py ATTRIBUTE -> architecture.
_HYBRID_NAME_MAPS = {"QWEN35_NAMES": "qwen3_5", "QWEN3NEXT_NAMES": "qwen3_next", "QWEN35MOE_NAMES": "qwen3_5_moe"}


@hookimpl
def register_name_maps(register):
    from .names import NAME_MAPS  # noqa: PLC0415

    for name_map in NAME_MAPS:
        register(name_map)
    for attribute, architecture in _HYBRID_NAME_MAPS.items():
        register(Deferred(f"{__name__}.hybrid:{attribute}", format="gguf", architecture=architecture))
