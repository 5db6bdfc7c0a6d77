"""Sizing and binding the paged KV cache: every Attention layer gets k/v tensors of
[num_blocks, block_size, num_kv_heads, head_dim] that the engine's block ids index."""
from __future__ import annotations

import re

import torch
from torch import nn

from ..layers.attention import Attention

CPU_DEFAULT_KV_BYTES = 256 * 2**20  # a modest fixed budget: CPU memory is shared with everything else
_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
          "g": 2**30, "gb": 10**9, "gib": 2**30}


def parse_memory(value: int | float | str | None) -> int | None:
    """Bytes from an int, or a string like ``"512MiB"``, ``"2GB"``, ``"1.5g"``."""
    if value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    match = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", value)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read memory size {value!r} (examples: 536870912, '512MiB', '2GB')")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def attention_layers(model: nn.Module) -> list[Attention]:
    return [module for module in model.modules() if isinstance(module, Attention)]


def cache_dtype(loaded) -> torch.dtype:
    """The activations' dtype: the quant scheme's params dtype, else the first float parameter's."""
    dtype = getattr(loaded.scheme, "params_dtype", None)
    if dtype is not None:
        return dtype
    return next((p.dtype for p in loaded.model.parameters() if p.is_floating_point()), torch.float32)


def bytes_per_block(layers: list[Attention], block_size: int, dtype: torch.dtype) -> int:
    element = torch.empty((), dtype=dtype).element_size()
    return sum(2 * block_size * layer.num_kv_heads * layer.head_dim * element for layer in layers)


def allocate(layers: list[Attention], num_blocks: int, block_size: int, dtype: torch.dtype,
             device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(k, v) caches for each layer, zeroed so that unwritten slots never hold NaN garbage."""
    shapes = [(num_blocks, block_size, layer.num_kv_heads, layer.head_dim) for layer in layers]
    return [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for shape in shapes]


def bind(layers: list[Attention], caches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    for layer, (k_cache, v_cache) in zip(layers, caches):
        layer.k_cache, layer.v_cache = k_cache, v_cache


def is_bound(layers: list[Attention], caches: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
    return bool(layers) and layers[0].k_cache is caches[0][0]


def unbind(layers: list[Attention], caches: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> None:
    """Detach the caches from the layers (only if they are still ``caches``, when given)."""
    if caches is None or is_bound(layers, caches):
        for layer in layers:
            layer.k_cache = layer.v_cache = None


def cuda_budget(device: torch.device, utilization: float, activation_peak: int) -> int:
    """KV bytes that fit: ``utilization`` of the device, less what is in use and the activation peak."""
    free, total = torch.cuda.mem_get_info(device)
    return int(total * utilization - (total - free) - activation_peak)
