"""Llama 3.1-style rotary scaling from llama.cpp's ``rope_freqs.weight``.

llama.cpp does not store Llama 3's ``rope_scaling`` in the metadata; its converter bakes it into
a small tensor of per-frequency divisors. The published Llama 3.x models all use one shape of
ramp (low/high frequency factors 1 and 4 around an 8192-token original context) with a model-
specific ``factor`` (the largest divisor); those parameters are recovered here and accepted only
if they reproduce every stored divisor. Anything else is reported, never guessed.
"""
from __future__ import annotations

import math
import warnings

import numpy as np

# (low_freq_factor, high_freq_factor, original_max_position_embeddings) of the Llama 3.x releases
KNOWN_RAMPS = ((1.0, 4.0, 8192),)


def llama3_divisors(rotary_dim: int, base: float, factor: float, low: float, high: float,
                    original: int) -> np.ndarray:
    """What each inverse frequency is divided by under Llama 3 scaling (1 = unchanged)."""
    inv_freq = 1.0 / base ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)
    wavelen = 2 * math.pi / inv_freq
    smooth = (original / wavelen - low) / (high - low)
    blended = 1.0 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < original / high, 1.0, np.where(wavelen > original / low, factor, blended))


def scaling_from_divisors(divisors: np.ndarray, *, rotary_dim: int, base: float, file: str) -> dict | None:
    """The HF ``rope_scaling`` dict these divisors encode, or None (with a warning) if none fits."""
    divisors = np.asarray(divisors, dtype=np.float64).reshape(-1)
    factor = float(divisors.max())
    for low, high, original in KNOWN_RAMPS:
        if divisors.shape[0] == rotary_dim // 2 and np.allclose(
                llama3_divisors(rotary_dim, base, factor, low, high, original), divisors, rtol=1e-4, atol=1e-6):
            return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
                    "original_max_position_embeddings": original}
    warnings.warn(f"{file}: rope_freqs.weight does not match Llama 3 rotary scaling; it is ignored "
                  "(pass a config override with rope_scaling to set it)", stacklevel=2)
    return None
