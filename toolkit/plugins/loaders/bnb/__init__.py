"""Loader and writer for Hugging Face checkpoints quantized with bitsandbytes (transformers'
``BitsAndBytesConfig``): 4-bit NF4/FP4 with or without double quantization, and LLM.int8."""
from toolkit.core.hookspecs import hookimpl
from toolkit.core.lazy import lazy_attributes
from toolkit.core.names import HFNameMap

from .loader import FORMAT, BnbLoader

# Imported on first use: registration needs only the loader and the name map, so a load of another
# format never imports this format's reader and writer.
_LAZY = {"BnbCheckpoint": ".checkpoint"}


__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = ["BnbCheckpoint", "BnbLoader"]


@hookimpl
def register_loaders(register):
    register(BnbLoader())


@hookimpl
def register_name_maps(register):
    # the checkpoint groups each weight's statistics under the weight's own HF name
    register(HFNameMap(format=FORMAT))
