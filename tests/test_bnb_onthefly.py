"""On-the-fly bitsandbytes quantization (``quant="bnb-nf4"`` ...) of a full-precision checkpoint.

Oracles: transformers loading the same checkpoint with the matching BitsAndBytesConfig (logits),
and bitsandbytes' own quantize/dequantize applied to each rank's slice of the checkpoint weights
(per-layer weights, exact).

Tolerance for logits: both sides quantize the same fp32 weights with the same bitsandbytes
calls, so the packed data is identical and only float32 summation order differs: logits are
below 0.3 in magnitude and differ by < 1e-7 (observed). ATOL = 1e-6 is more than 100x below
the quantization's own effect on the logits (1e-3 to 1e-2, asserted per case), so a wrong block
size, quant type, threshold or a skipped double quantization cannot pass.
"""
from __future__ import annotations

import pytest
import torch
from bitsandbytes.functional import int8_vectorwise_dequant, int8_vectorwise_quant, quantize_4bit

import toolkit
from toolkit.core.config import LoadConfig
from toolkit.core.load import load_local
from toolkit.core.parallel import ParallelContext

from test_bnb_fixtures import (ALIGNED, PROMPT, SMALL, hf_bnb_model, hf_logits, needs_accelerate, our_weights, rank_weights,
                               reference_dequantize_4bit, write_llama)

ATOL = 1e-6
SPECS = {"nf4": "bnb-nf4", "nf4-dq": "bnb-nf4:double_quant=true", "fp4": "bnb-fp4", "int8": "bnb-int8"}


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    path = tmp_path_factory.mktemp("bnb-small")
    return path, write_llama(path, SMALL, seed=1)


@pytest.fixture(scope="module")
def aligned(tmp_path_factory):
    path = tmp_path_factory.mktemp("bnb-aligned")
    return path, write_llama(path, ALIGNED, seed=2)


def _bnb_roundtrip(weight: torch.Tensor, kind: str, block_size: int = 64) -> torch.Tensor:
    """bitsandbytes' quantize then dequantize of one tensor (the reference for our stored weights)."""
    if kind == "int8":
        data, scb, _ = int8_vectorwise_quant(weight.half().contiguous())
        return int8_vectorwise_dequant(data, scb)
    packed, state = quantize_4bit(weight.contiguous(), blocksize=block_size, quant_type=kind[:3],
                                  compress_statistics=kind.endswith("-dq"))
    return reference_dequantize_4bit(packed, state)


def _expected_rank(dense_model, layer: int, rank: int, tp: int, kind: str, block_size: int = 64):
    """Each checkpoint tensor's rank slice, quantized on its own by bitsandbytes (as the scheme must)."""
    block = dense_model.model.layers[layer]
    attn, mlp = block.self_attn, block.mlp

    def rows(module):
        return _bnb_roundtrip(module.weight.detach().chunk(tp, 0)[rank], kind, block_size)

    def cols(module):
        return _bnb_roundtrip(module.weight.detach().chunk(tp, 1)[rank], kind, block_size)

    return {"self_attn.qkv_proj": torch.cat([rows(attn.q_proj), rows(attn.k_proj), rows(attn.v_proj)]),
            "self_attn.o_proj": cols(attn.o_proj),
            "mlp.gate_up_proj": torch.cat([rows(mlp.gate_proj), rows(mlp.up_proj)]),
            "mlp.down_proj": cols(mlp.down_proj)}


@pytest.mark.parametrize("kind", list(SPECS))
@pytest.mark.parametrize("tp", [1, 2])
def test_each_rank_holds_its_slice_quantized_by_bitsandbytes(small, kind, tp):
    path, dense = small
    for rank in range(tp):
        model = load_local(path, LoadConfig(quant=SPECS[kind]), parallel=ParallelContext(rank, tp))[0]
        expected = _expected_rank(dense, 1, rank, tp, kind)
        for name, weight in our_weights(model, 1).items():
            torch.testing.assert_close(weight, expected[name].float(), rtol=0, atol=0, msg=f"{name} rank {rank}")


def test_block_size_option_reaches_bitsandbytes(small):
    path, dense = small
    model = toolkit.load(path, quant="bnb-fp4:block_size=128", device="cpu").model
    packed_state = model.model.layers[0].mlp.down_proj.weight.quant_states[0]
    assert packed_state.blocksize == 128
    expected = _expected_rank(dense, 0, 0, 1, "fp4", block_size=128)["mlp.down_proj"]
    torch.testing.assert_close(our_weights(model, 0)["mlp.down_proj"], expected, rtol=0, atol=0)


def test_embedding_head_and_norms_stay_full_precision(small):
    path, dense = small
    model = toolkit.load(path, quant="bnb-nf4", device="cpu").model
    assert model.lm_head.weight.dtype == torch.float32
    torch.testing.assert_close(model.lm_head.weight[:1000], dense.lm_head.weight)
    torch.testing.assert_close(model.model.embed_tokens.weight[:1000], dense.model.embed_tokens.weight)
    torch.testing.assert_close(model.model.norm.weight, dense.model.norm.weight)


def test_quantized_weights_take_a_quarter_of_the_bytes(aligned):
    path, _ = aligned
    dense = toolkit.load(path, device="cpu").model.model.layers[0].mlp.gate_up_proj.weight
    nf4 = toolkit.load(path, quant="bnb-nf4", device="cpu").model.model.layers[0].mlp.gate_up_proj.weight
    assert nf4.nbytes * 8 == dense.nbytes  # fp32 -> 4 bits, statistics kept beside


@needs_accelerate
@pytest.mark.parametrize("kind", list(SPECS))
def test_logits_match_transformers_bitsandbytes(small, kind):
    path, dense = small
    ours = toolkit.load(path, quant=SPECS[kind], device="cpu")
    assert ours.report.scheme == SPECS[kind].split(":")[0]
    reference = hf_logits(hf_bnb_model(path, kind))
    torch.testing.assert_close(ours.logits(PROMPT), reference,
                               rtol=0, atol=ATOL)
    assert (reference - hf_logits(dense)).abs().max() > 100 * ATOL  # the quantization is really there


@needs_accelerate
def test_weights_match_transformers_quantization(small):
    """transformers quantizes each nn.Linear whole; at tp=1 our segments are exactly those."""
    path, _ = small
    ours = toolkit.load(path, quant="bnb-nf4:double_quant=true", device="cpu").model
    expected = rank_weights(hf_bnb_model(path, "nf4-dq"), 0, 0, 1)
    for name, weight in our_weights(ours, 0).items():
        torch.testing.assert_close(weight, expected[name], rtol=0, atol=0, msg=name)
