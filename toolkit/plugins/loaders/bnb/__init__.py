"""Loader and writer for Hugging Face checkpoints quantized with bitsandbytes (transformers'
``BitsAndBytesConfig``): 4-bit NF4/FP4 with or without double quantization, and LLM.int8."""
from toolkit.core.hookspecs import hookimpl
from toolkit.core.names import HFNameMap

from .loader import FORMAT, BnbLoader

_LAZY = {"BnbCheckpoint": ".checkpoint"}


def __getattr__(name: str):
    """The names in ``_LAZY``, imported on first use: registration needs only the loader and the
    name map, so a load of another format never imports this format's reader and writer."""
    if name in _LAZY:
        import importlib  # noqa: PLC0415

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["BnbCheckpoint", "BnbLoader"]


@hookimpl
def register_loaders(register):
    register(BnbLoader())


@hookimpl
def register_name_maps(register):
    # the checkpoint groups each weight's statistics under the weight's own HF name
    register(HFNameMap(format=FORMAT))
