"""On a CUDA device: the one-launch partial-sum kernels (``kernels/triton_reduce``) against a float32
sum taken in the same order with torch, and the activation quantizer's per-block sums against torch's
sum of its own int8 output. Skipped without CUDA."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_sum_middle_and_splits_equal_an_in_order_float32_sum(dtype):
    from toolkit.kernels.triton_reduce import sum_middle, sum_splits
    g = torch.Generator(device="cuda").manual_seed(0)
    for rows, parts, cols in ((3, 4, 50), (8, 8, 2048), (1, 2, 5000)):
        x = torch.randn(rows, parts, cols, device="cuda", generator=g)
        ordered = x[:, 0].clone()
        for s in range(1, parts):
            ordered += x[:, s]
        assert torch.equal(sum_middle(x, dtype), ordered.to(dtype))
        splits = x.permute(1, 0, 2).contiguous()                         # [S, T, N], as a split-K matmul writes
        assert torch.equal(sum_splits(splits, dtype), ordered.to(dtype))


def test_quantized_activation_block_sums():
    from toolkit.kernels.gguf.triton_ops import quantize_activations
    x = torch.randn(5, 1024, device="cuda").to(torch.bfloat16)
    words, scales, sums = quantize_activations(x, sums=True)
    quants = words.view(torch.int8).view(5, 32, 32)
    assert torch.equal(sums, quants.sum(-1, dtype=torch.int32).float() * scales)
    plain_words, plain_scales = quantize_activations(x)
    assert torch.equal(plain_words, words) and torch.equal(plain_scales, scales)
