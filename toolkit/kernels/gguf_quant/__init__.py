"""GGUF quantizers in torch: float tensors -> GGUF block bytes, on CPU or GPU.

Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 are byte-identical to gguf-py's numpy quantizer; Q4_K,
Q5_K and Q6_K (which gguf-py cannot produce) use a weighted least-squares scale search in
the spirit of llama.cpp's reference quantizer. Output decodes with ``gguf.quants.dequantize``.

On the CPU the same encoders run compiled (``quant_cpu.cpp`` via ``native.py``; multi-threaded
over blocks, same bytes as the torch code); the torch code serves GPUs and any machine where the
extension cannot be built. ``plain.py`` builds the same C++ without torch, for numpy callers.

The names below load on first use, so ``toolkit.kernels.gguf_quant.plain`` imports no torch.
"""
from __future__ import annotations

__all__ = ["SUPPORTED", "as_qtype", "quantize"]


def __getattr__(name: str):
    if name in ("as_qtype", "quantize", "ENCODERS"):
        from . import api  # noqa: PLC0415

        return getattr(api, name)
    if name == "SUPPORTED":
        from .api import ENCODERS  # noqa: PLC0415

        return tuple(qtype.name for qtype in ENCODERS)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
