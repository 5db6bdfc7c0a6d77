"""Launch-size helpers shared by the Triton matmul ops (GGUF, bitsandbytes)."""
from __future__ import annotations

import functools

import torch

# Split K only while there are fewer programs than SMs: with 4 or more programs per SM, every split
# the GGUF kernels measured was slower (the partial-sum buffer and its reduction cost more than they hide).
PROGRAMS_PER_SM = 1


@functools.lru_cache(maxsize=None)
def num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def l2_bytes(device: torch.device) -> int:
    """The GPU's L2 cache size in bytes."""
    return torch.cuda.get_device_properties(device).L2_cache_size


def split_k(num_programs: int, k_tiles: int, device: torch.device, programs_per_sm: int = PROGRAMS_PER_SM,
            min_split: int = 1) -> int:
    """Split K until there are about ``programs_per_sm`` programs per SM, and at least ``min_split`` ways,
    never cutting a tile (a divisor of ``k_tiles``): a GEMV with few output tiles (a small projection)
    would otherwise leave SMs idle."""
    target = programs_per_sm * num_sms(device)
    split = max(1, min(k_tiles, max(min_split, target // max(num_programs, 1))))
    while k_tiles % split:
        split -= 1
    return split


def tile_width(cols: int, wanted: int, unit: int = 1) -> int:
    """The widest power-of-two multiple of ``unit``, at most ``max(wanted, unit)``, that divides ``cols``;
    0 if none does (``cols`` not a multiple of ``unit``). The K step of the GGUF and bitsandbytes matmuls."""
    width = max(wanted, unit)
    while width >= unit and cols % width:
        width //= 2
    return width if width >= unit else 0


def launch_numbers(variable: str, text: str, names: tuple[str, ...]) -> dict[str, int]:
    """``text`` (a launch setting from the environment variable ``variable``): comma-separated integers, one
    per name. Anything else: ValueError naming the variable and the form it wants."""
    try:
        values = [int(value) for value in text.split(",")]
    except ValueError:
        values = []
    if len(values) != len(names):
        raise ValueError(f"{variable}: {text!r} is not {','.join(name.upper() for name in names)}")
    return dict(zip(names, values))
