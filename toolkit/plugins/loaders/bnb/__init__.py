"""Loader and writer for Hugging Face checkpoints quantized with bitsandbytes (transformers'
``BitsAndBytesConfig``): 4-bit NF4/FP4 with or without double quantization, and LLM.int8."""
from toolkit.core.hookspecs import hookimpl
from toolkit.core.names import HFNameMap

from .checkpoint import FORMAT, BnbCheckpoint
from .loader import BnbLoader

__all__ = ["BnbCheckpoint", "BnbLoader"]


@hookimpl
def register_loaders(register):
    register(BnbLoader())


@hookimpl
def register_name_maps(register):
    # the checkpoint groups each weight's statistics under the weight's own HF name
    register(HFNameMap(format=FORMAT))
