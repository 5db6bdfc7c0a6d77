"""``quantize(tensor, qtype)``: float rows -> GGUF block bytes, in torch on the tensor's device."""
from __future__ import annotations

from typing import Callable

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from toolkit.core.errors import ConversionError, ShapeMismatchError, UnsupportedQuantTypeError

from . import kquants, legacy, native

Q = GGMLQuantizationType
ENCODERS: dict[GGMLQuantizationType, Callable[[torch.Tensor], torch.Tensor]] = {
    Q.Q8_0: legacy.q8_0, Q.Q4_0: legacy.q4_0, Q.Q4_1: legacy.q4_1, Q.Q5_0: legacy.q5_0, Q.Q5_1: legacy.q5_1,
    Q.Q4_K: kquants.q4_k, Q.Q5_K: kquants.q5_k, Q.Q6_K: kquants.q6_k,
}
# Elements encoded per step. On CPU, steps of a few MB keep the temporaries near cache size and
# their allocations reused (one huge step pays a page fault per 4 KiB of every temporary); on GPU,
# large steps amortize kernel launches. K-quant searches hold ~20 candidate codes per element.
CPU_STEP_ELEMENTS = {Q.Q4_K: 1 << 16, Q.Q5_K: 1 << 16, Q.Q6_K: 1 << 16}
CPU_DEFAULT_STEP_ELEMENTS = 1 << 20
GPU_STEP_ELEMENTS = 1 << 22


def as_qtype(qtype: GGMLQuantizationType | str | int) -> GGMLQuantizationType:
    """A GGMLQuantizationType from the enum itself, its name (``"Q4_K"``) or its number."""
    try:
        if isinstance(qtype, str):
            return GGMLQuantizationType[qtype.upper()]
        return GGMLQuantizationType(qtype)
    except (KeyError, ValueError):
        raise UnsupportedQuantTypeError(f"unknown GGML quantization type {qtype!r}") from None


def quantize(tensor: torch.Tensor, qtype: GGMLQuantizationType | str | int, *, name: str | None = None,
             compiled: bool | None = None, check_finite: bool = False) -> torch.Tensor:
    """Encode ``tensor`` [..., cols] as GGUF ``qtype`` blocks along its last dimension.

    :param tensor: any float dtype, any device (the work runs there, in float32)
    :param qtype: one of Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (byte-identical to gguf-py's
        ``gguf.quants.quantize``) or Q4_K, Q5_K, Q6_K (our own scale search)
    :param name: tensor name for error messages
    :param compiled: on the CPU, the compiled quantizer (native.py: the same encoders in C++,
        multi-threaded) when True, the torch code when False; None (default) picks the compiled
        one when it builds and ``TOOLKIT_GGUF_QUANT_COMPILED`` is not ``0``
    :param check_finite: raise ConversionError (naming ``name``) if any value is NaN or infinite
        (free on the compiled path, which checks each block as it encodes it)
    :returns: uint8 [..., cols // block_size * type_size] on the tensor's device
    """
    qtype = as_qtype(qtype)
    if qtype not in ENCODERS:
        raise UnsupportedQuantTypeError(f"quantizing to {qtype.name} is not implemented; "
                                        f"supported: {', '.join(t.name for t in ENCODERS)}", tensor=name)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if tensor.ndim == 0 or tensor.shape[-1] % block_size:
        raise ShapeMismatchError(f"{qtype.name} needs rows that are a multiple of {block_size} elements, "
                                 f"got shape {tuple(tensor.shape)}", tensor=name)
    blocks = tensor.reshape(-1, block_size)
    if tensor.device.type == "cpu" and _use_compiled(compiled, qtype):
        out, finite = native.quantize_blocks(blocks, qtype, type_size)
        if check_finite and not finite:
            raise _non_finite(name)
        return out.reshape(*tensor.shape[:-1], tensor.shape[-1] // block_size * type_size)
    if check_finite and not bool(torch.isfinite(tensor).all()):
        raise _non_finite(name)
    out = torch.empty(blocks.shape[0], type_size, dtype=torch.uint8, device=tensor.device)
    step = _step_elements(qtype, tensor.device) // block_size
    encode = ENCODERS[qtype]
    for start in range(0, blocks.shape[0], step):
        out[start:start + step] = encode(blocks[start:start + step].to(torch.float32))
    return out.reshape(*tensor.shape[:-1], tensor.shape[-1] // block_size * type_size)


def _non_finite(name: str | None) -> ConversionError:
    return ConversionError(f"tensor {name or '?'!r} holds non-finite values; refusing to quantize it")


def _use_compiled(compiled: bool | None, qtype: GGMLQuantizationType) -> bool:
    if compiled is False or int(qtype) not in native.HANDLED:
        return False
    if compiled is None and not native.enabled():
        return False
    return native.available()  # asked for but not buildable: the torch path (after one warning)


def _step_elements(qtype: GGMLQuantizationType, device: torch.device) -> int:
    if device.type == "cpu":
        return CPU_STEP_ELEMENTS.get(qtype, CPU_DEFAULT_STEP_ELEMENTS)
    return GPU_STEP_ELEMENTS
