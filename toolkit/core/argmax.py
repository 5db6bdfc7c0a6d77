"""Greedy token choice over a vocabulary: ``argmax_rows`` (used by the engine's sampler and
``LoadedModel.generate``)."""
from __future__ import annotations

import numpy as np
import torch


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)`` (int64), for CPU float rows through numpy: torch's CPU argmax over one
    row of a 262k vocabulary took ~1 ms (one thread, not vectorized), numpy's ~60 us, and greedy
    decode takes one per token. Same answer: both return the first maximum, and the first NaN."""
    if (logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64) and logits.dim() >= 1
            and logits.shape[-1] > 0 and not logits.requires_grad):
        return torch.from_numpy(np.asarray(np.argmax(logits.numpy(), axis=-1), dtype=np.int64))
    return logits.argmax(-1)
