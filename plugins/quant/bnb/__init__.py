"""bitsandbytes quantization: NF4/FP4 4-bit and LLM.int8, on the fly and from pre-quantized checkpoints.

Everything numeric is bitsandbytes' own (``quantize_4bit``, ``dequantize_4bit``, ``matmul_4bit``,
``int8_vectorwise_quant``, ``bitsandbytes.matmul``); this plugin adds self-sharding parameters
and the mapping to and from transformers' checkpoint layout.
"""
from toolkit.core.hookspecs import hookimpl

from .kernels import register_ops
from .params4 import Bnb4bitParameter
from .params8 import Bnb8bitParameter
from .scheme import Bnb4bitScheme, Bnb8bitScheme, BnbFactory
from .tensors import Bnb4bitTensor, Bnb8bitTensor

__all__ = ["Bnb4bitParameter", "Bnb8bitParameter", "Bnb4bitScheme", "Bnb8bitScheme", "BnbFactory",
           "Bnb4bitTensor", "Bnb8bitTensor"]


@hookimpl
def register_quant_schemes(register):
    register(BnbFactory())


@hookimpl
def register_kernels(register):
    register_ops(register)
