"""GGUF quantizers in torch: float tensors -> GGUF block bytes, on CPU or GPU.

Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 are byte-identical to gguf-py's numpy quantizer; Q4_K,
Q5_K and Q6_K (which gguf-py cannot produce) use a weighted least-squares scale search in
the spirit of llama.cpp's reference quantizer. Output decodes with ``gguf.quants.dequantize``.

On the CPU the same encoders run compiled (``quant_cpu.cpp`` via ``native.py``; multi-threaded
over blocks, same bytes as the torch code); the torch code serves GPUs and any machine where the
extension cannot be built.
"""
from .api import ENCODERS, as_qtype, quantize

SUPPORTED = tuple(qtype.name for qtype in ENCODERS)

__all__ = ["SUPPORTED", "as_qtype", "quantize"]
