"""Our K-quant scale search is at least as accurate (weight RMSE) as llama-quantize's on the same
rows, both decoded by gguf-py. The rows and llama-quantize's bytes for them are saved data
(tests/data/llamacpp/make_kquant_reference.py says how they were made)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from toolkit.kernels.gguf_quant import quantize

DATA = np.load(Path(__file__).parent / "data" / "llamacpp" / "kquant_rows.npz")


def _rmse(decoded: np.ndarray, x: np.ndarray) -> float:
    return float(np.sqrt(((decoded.astype(np.float64) - x) ** 2).mean()))


@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q6_K"])
def test_rmse_not_above_llama_quantize(name):
    qtype = GGMLQuantizationType[name]
    x = DATA["x"]
    theirs = _rmse(dequantize(DATA[name], qtype).reshape(x.shape), x)
    ours_bytes = quantize(torch.from_numpy(x.copy()), qtype).numpy()
    assert ours_bytes.shape == DATA[name].shape
    ours = _rmse(dequantize(ours_bytes, qtype).reshape(x.shape), x)
    assert ours <= theirs, f"{name}: ours {ours:.6e} > llama.cpp {theirs:.6e}"


@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q6_K"])
def test_round_trip_is_close(name):
    """Decoding our bytes with gguf-py lands near the input (relative RMSE of random normal rows)."""
    qtype = GGMLQuantizationType[name]
    x = torch.randn(16, 512, generator=torch.Generator().manual_seed(1))
    x[3] = 0.0  # an all-zero row decodes to zeros
    decoded = dequantize(quantize(x, qtype).numpy(), qtype).reshape(x.shape)
    assert np.all(decoded[3] == 0)
    relative = _rmse(decoded, x.numpy()) / float(x.std())
    assert relative < {"Q4_K": 0.12, "Q5_K": 0.06, "Q6_K": 0.03}[name], relative
