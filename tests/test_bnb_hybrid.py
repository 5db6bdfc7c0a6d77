"""bitsandbytes on the fly (``quant="bnb-nf4"``, ``"bnb-int8"``) for Qwen3.5 / Qwen3-Next.

The Gated DeltaNet projections are ordinary linears: our fused ``[q|k|v|z|b|a]`` projection is
quantized as one tensor, transformers quantizes Qwen3.5's four (or Qwen3-Next's two) separately.
With hidden size 64 every row is exactly one 64-element nf4 block (and int8 scales are per row),
so both sides quantize identical blocks: the oracle is transformers loading the same checkpoint
with the matching BitsAndBytesConfig. Tolerance as in test_bnb_onthefly.py (float ordering only).
"""
from __future__ import annotations

import pytest
import torch
from hybrid_fixtures import KINDS, prompt, save_hybrid
from test_bnb_fixtures import hf_bnb_model, hf_logits, needs_accelerate

import toolkit

SPECS = {"nf4": "bnb-nf4", "int8": "bnb-int8"}


@needs_accelerate
@pytest.mark.parametrize("kind", list(SPECS))
@pytest.mark.parametrize("family", list(KINDS))
def test_logits_match_transformers_bitsandbytes(family, kind, tmp_path):
    dense = save_hybrid(tmp_path, family, seed=6)
    ids = prompt(20).tolist()
    ours = toolkit.load(tmp_path, quant=SPECS[kind], device="cpu")
    reference = hf_logits(hf_bnb_model(tmp_path, kind), ids)
    got = ours.logits(ids)
    tolerance = 1e-5 * reference.abs().max().item()
    assert (got - reference).abs().max().item() <= tolerance
    assert (reference - hf_logits(dense, ids)).abs().max().item() > 100 * tolerance  # really quantized
