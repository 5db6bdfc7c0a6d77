"""bitsandbytes quantization: NF4/FP4 4-bit and LLM.int8, on the fly and from pre-quantized checkpoints.

Everything numeric is bitsandbytes' own (``quantize_4bit``, ``dequantize_4bit``, ``matmul_4bit``,
``int8_vectorwise_quant``, ``bitsandbytes.matmul``); this plugin adds self-sharding parameters
and the mapping to and from transformers' checkpoint layout.

bitsandbytes itself is imported only when a bnb weight is built, read or multiplied: importing
it costs seconds (it pulls in torch's compiler stack), and every toolkit process, every
tensor-parallel worker included, registers this plugin whether or not it uses it.
"""
from toolkit.core.hookspecs import hookimpl
from toolkit.core.lazy import lazy_attributes

from .factory import BnbFactory
from .kernels import register_ops

# Imported on first access: the parameter classes (they import bitsandbytes), and the schemes and
# tensor types, which a load that does not use bnb never needs.
_LAZY = {"Bnb4bitParameter": ".params4", "Bnb8bitParameter": ".params8", "Bnb4bitScheme": ".scheme",
         "Bnb8bitScheme": ".scheme", "Bnb4bitTensor": ".tensors", "Bnb8bitTensor": ".tensors"}  # imported on first use


__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = ["Bnb4bitParameter", "Bnb8bitParameter", "Bnb4bitScheme", "Bnb8bitScheme", "BnbFactory",
           "Bnb4bitTensor", "Bnb8bitTensor"]


@hookimpl
def register_quant_schemes(register):
    register(BnbFactory())


@hookimpl
def register_kernels(register):
    register_ops(register)
