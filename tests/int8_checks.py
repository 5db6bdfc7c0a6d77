"""Shared by the int8-block tests: whether blocks a kernel wrote are ``out``'s rounding."""
from __future__ import annotations

import torch

from toolkit.kernels.int8_blocks import quantize_reference


def assert_blocks(got, out: torch.Tensor, sums: bool) -> None:
    """``got`` = (words, scales, sums or None) are ``out``'s blocks: scales exactly the reference's; values exact
    except within 1e-4 of a rounding tie (``x * (127 / max)`` may take one float32 rounding more or less in the
    division there), where they may differ by one; sums exactly ``d * sum(q)`` of the values got."""
    words, scales, block_sums = got
    flat = out.reshape(-1, out.shape[-1])
    expected = quantize_reference(flat, sums)
    assert torch.equal(scales, expected[1])
    q = words.view(torch.int8).reshape(flat.shape[0], -1, 32).int()
    expected_q = expected[0].view(torch.int8).reshape(q.shape).int()
    blocks = flat.double().reshape(q.shape)
    scaled = blocks * 127 / blocks.abs().amax(-1, keepdim=True).clamp_min(1e-30)
    near_tie = ((scaled.abs() % 1) - 0.5).abs() < 1e-4
    assert torch.equal(q[~near_tie], expected_q[~near_tie])
    assert (q - expected_q).abs().max() <= 1
    if sums:
        assert torch.equal(block_sums, q.sum(-1).float() * scales)
    else:
        assert block_sums is None
    assert q.abs().max() == 127      # the scale maps each block's largest value to ±127
