"""Activations rounded to int8 blocks of 32, carried with the tensor they round.

The GGUF decode kernels (dp4a GEMV, int8 tensor-core mmq, the MoE route kernels) read activations as
llama.cpp's q8_1 does: per row, blocks of 32 values ``x ~ d * q`` with ``d = max|x| / 127`` and ``q`` in
-127..127 rounded half away from zero, plus (for the types with a minimum term) ``d * sum(q)`` per block.
Rounding them is one more launch per matmul. At batch 1 that launch costs about as much as a small
matmul, so the op that *produces* the activations (a layer's RMSNorm, the gated activation) can write
the blocks in its own kernel instead and hand them on with its output:

- a consumer says what it reads with ``int8_input(tokens) -> Int8Input | None`` (linear layers ask their
  quant scheme; None: float activations);
- the producer then calls its ``*_int8`` op and ``attach``es the blocks to its output tensor;
- the consumer's kernel takes ``attached(x, sums)`` when present, else rounds ``x`` itself. Every matmul
  reading the tensor takes the same blocks (the Q4_K and Q6_K segments of a Q4_K_M q/k/v projection:
  the request merges their needs).

Blocks are attached as a Python attribute of the tensor object, only by the producer, to the fresh
output its kernel just wrote: a consumer never attaches what it rounded, because the tensor it reads may
be a buffer that kernels rewrite unseen (a CUDA graph's static output replays into the same object).
Where the tensor counts versions (outside inference mode), an in-place change makes the blocks stale and
``attached`` ignores them. Nothing here is CUDA-specific; ``quantize_reference`` is the torch oracle.
"""
from __future__ import annotations

import os

import torch

from . import runtime
from ..core.records import FrozenRecord
from .split_sums import SplitSums, unpieced

_ATTRIBUTE = "_toolkit_int8_blocks"


# Int8Input and Int8Blocks are hand-written records, not dataclasses: every load imports this module, and defining a
# dataclass costs ~0.5-1 ms (core/records.py).
class Int8Input(FrozenRecord):
    """What a consumer reads: int8 blocks of 32, with the per-block sums ``d * sum(q)`` when ``sums``."""

    sums: bool

    def __init__(self, sums: bool):
        self.__dict__.update(sums=sums)


class Int8Blocks(FrozenRecord):
    """``x [T, K]`` rounded: ``words [T, K / 4]`` int32 (byte i of word w is column 4w + i, so
    ``words.view(torch.int8)`` is ``q [T, K]``), ``scales [T, K / 32]`` float32, ``sums [T, K / 32]``
    float32 or None."""

    words: torch.Tensor
    scales: torch.Tensor
    sums: torch.Tensor | None
    version: int | None

    def __init__(self, words: torch.Tensor, scales: torch.Tensor, sums: torch.Tensor | None, version: int | None = -1):
        self.__dict__.update(words=words, scales=scales, sums=sums, version=version)


def merge(*requests: Int8Input | None) -> Int8Input | None:
    """One request serving every consumer of the same tensor (None where no consumer reads int8)."""
    wanted = [request for request in requests if request is not None]
    return Int8Input(sums=any(request.sums for request in wanted)) if wanted else None


def _version(x: torch.Tensor) -> int | None:
    # inference-mode tensors (the engine's) keep no version counter: their blocks cannot be checked for
    # staleness, which is why only producers attach, to the fresh tensor their kernel just wrote
    return None if x.is_inference() else x._version


def attach(x: torch.Tensor, words: torch.Tensor, scales: torch.Tensor, sums: torch.Tensor | None) -> torch.Tensor:
    """Hand ``x``'s blocks on with ``x`` (returns ``x``). For producers: ``x`` is the output they just wrote."""
    setattr(x, _ATTRIBUTE, Int8Blocks(words, scales, sums, _version(x)))
    return x


def attached(x: torch.Tensor, sums: bool) -> Int8Blocks | None:
    """``x``'s attached blocks if they hold what is asked (sums when ``sums``) and, where ``x`` counts
    versions, ``x`` was not changed in place since."""
    blocks = getattr(x, _ATTRIBUTE, None)
    if blocks is None or blocks.version != _version(x) or (sums and blocks.sums is None):
        return None
    return blocks


def handoff_enabled() -> bool:
    """``TOOLKIT_INT8_HANDOFF=0`` turns producers' blocks off (consumers then round x themselves): for A/B runs."""
    return os.environ.get("TOOLKIT_INT8_HANDOFF", "1") != "0"


def scheme_request(module, method: str, *args) -> Int8Input | None:
    """``module.scheme.<method>(module, *args)`` (a quant scheme's ``int8_input`` / ``moe_int8_input``), asked
    once per arguments and kept on the module (call it after loading: the answer follows the loaded weights);
    None where the scheme has no such method."""
    cache = module.__dict__.setdefault("_int8_inputs", {})
    key = (method, *args)
    if key not in cache:
        ask = getattr(module.scheme, method, None)
        cache[key] = ask(module, *args) if ask is not None else None
    return cache[key]


def requested(consumer, tokens: int) -> Int8Input | None:
    """``consumer.int8_input(tokens)``, or None: no consumer, one without the method, hand-off turned off, or
    under ``torch.compile`` (a compiled region carries no tensor attributes)."""
    ask = getattr(consumer, "int8_input", None)
    if ask is None or torch.compiler.is_compiling() or not handoff_enabled():
        return None
    return ask(tokens)


def gated(x, activation: str, request: Int8Input | None) -> torch.Tensor:
    """``act(gate) * up`` (the ``gated_activation`` op), with its int8 blocks attached when ``request``
    asks for them (one kernel on CUDA: ``gated_activation_int8``). ``x``: a tensor, or a projection's split-K
    partial sums (``split_sums.SplitSums``), added up in the same kernel (``gated_activation_splits``), or
    ``split_sums.Columns`` (reduced first)."""
    x = unpieced(x)
    if isinstance(x, SplitSums):
        out, *blocks = runtime.call("gated_activation_splits", x.parts, x.dtype, activation,
                                    None if request is None else request.sums)
        return out if request is None else attach(out, *blocks)
    if request is None:
        return runtime.call("gated_activation", x, activation)
    out, words, scales, sums = runtime.call("gated_activation_int8", x, activation, request.sums)
    return attach(out, words, scales, sums)


def quantize_reference(x: torch.Tensor, sums: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The rounding in torch, for ``x [T, K]`` (K a multiple of 32): ``(words, scales, sums or None)``."""
    rows, cols = x.shape
    blocks = x.float().reshape(rows, cols // 32, 32)
    amax = blocks.abs().amax(-1)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros((), device=x.device))
    scaled = blocks * inv.unsqueeze(-1)
    q = torch.where(scaled >= 0, scaled + 0.5, scaled - 0.5).to(torch.int32)    # half away from zero
    scales = amax / 127.0
    block_sums = q.sum(-1).float() * scales if sums else None
    words = q.to(torch.int8).reshape(rows, cols).view(torch.int32)
    return words, scales, block_sums
