"""Helpers shared by the bitsandbytes tests (no tests here): random Llamas written by transformers,
their transformers-bitsandbytes counterparts, and per-rank slices of their weights.

transformers' bitsandbytes path needs ``accelerate``; tests that compare against it are skipped
with that reason where it is missing, while the checks against bitsandbytes' own functions run.
"""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
import transformers as tf
from bitsandbytes.functional import get_4bit_type, int8_vectorwise_dequant

from hf_fixtures import randomize

PROMPT = [1, 5, 7, 9, 100, 3, 44, 12, 600, 2, 77]
HAS_ACCELERATE = importlib.util.find_spec("accelerate") is not None
needs_accelerate = pytest.mark.skipif(not HAS_ACCELERATE, reason="transformers' bitsandbytes path needs accelerate")

# nf4 with double quant at tp=2 on ALIGNED: every rank slice falls on 64-element blocks
ALIGNED = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
# on SMALL, o_proj has 64 input features, 32 per rank at tp=2: half a block, so it is re-quantized
SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
BNB_CONFIGS = {
    "nf4": dict(load_in_4bit=True, bnb_4bit_quant_type="nf4"),
    "nf4-dq": dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True),
    "fp4": dict(load_in_4bit=True, bnb_4bit_quant_type="fp4"),
    "int8": dict(load_in_8bit=True),
}


def write_llama(path: Path, sizes: dict, *, seed: int = 0, vocab: int = 1000) -> tf.LlamaForCausalLM:
    """A random fp32 Llama saved with save_pretrained (every parameter re-drawn, none left constant)."""
    config = tf.LlamaConfig(vocab_size=vocab, num_hidden_layers=2, max_position_embeddings=128,
                            tie_word_embeddings=False, rms_norm_eps=1e-5, **sizes)
    torch.manual_seed(seed)
    model = randomize(tf.LlamaForCausalLM(config), seed).eval()
    model.save_pretrained(path)
    return model


def exact_cpu_path(model):
    """Make transformers' bitsandbytes 4-bit layers compute exactly on every CPU; returns ``model``.

    Two bitsandbytes CPU paths are lossy on CPUs with AVX-512 (the device host's Xeon showed
    both): ``Linear4bit.forward`` repacks its weight on the first call into a layout with bf16
    block scales (logits off by ~1e-3), and the AVX-512 ``dequantize_4bit`` mis-scales weights
    whose rows cut quantization blocks. So each 4-bit layer computes ``linear(x, W)`` with W from
    ``reference_dequantize_4bit`` (plain torch, checked against bitsandbytes on aligned rows in
    test_bnb_blocks.py); everything else stays transformers' own code. int8 layers are untouched.
    """
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if getattr(weight, "quant_state", None) is not None:
            module.forward = _reference_4bit_forward(module)
    return model


def _reference_4bit_forward(module):
    def forward(x: torch.Tensor) -> torch.Tensor:
        dense = reference_dequantize_4bit(module.weight.data, module.weight.quant_state).to(x.dtype)
        return torch.nn.functional.linear(x, dense, None if module.bias is None else module.bias.to(x.dtype))

    return forward


def hf_bnb_model(path: Path, kind: str):
    """transformers loading ``path`` with the matching BitsAndBytesConfig (fp32 compute, CPU)."""
    config = tf.BitsAndBytesConfig(bnb_4bit_compute_dtype=torch.float32, **BNB_CONFIGS[kind])
    return hf_quantized_checkpoint(path, quantization_config=config)


def hf_quantized_checkpoint(path: Path, **kwargs):
    """transformers' own view of a pre-quantized checkpoint on the CPU (what a user of that file gets)."""
    return exact_cpu_path(tf.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, device_map="cpu",
                                                                  **kwargs).eval())


def hf_logits(model, ids=PROMPT) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def reference_dequantize_4bit(packed: torch.Tensor, state) -> torch.Tensor:
    """A plain-torch 4-bit dequantizer written from bitsandbytes' format, for use as an oracle.

    bitsandbytes stores two codes per byte (high nibble first) over the flattened weight, one
    float scale per ``blocksize`` codes (with double quantization: 8-bit scales, each
    ``code2[q] * absmax2[block of 256] + offset``), and maps codes through its NF4/FP4 table
    (``get_4bit_type``). Written out here because bitsandbytes' own AVX-512 CPU kernel mis-scales
    weights whose rows cut blocks, so the library cannot be its own oracle on every CPU.
    """
    shape = tuple(int(n) for n in state.shape)
    numel = math.prod(shape)
    raw = packed.contiguous().view(torch.uint8).reshape(-1)
    codes = torch.stack([raw >> 4, raw & 0x0F], dim=-1).reshape(-1)[:numel].long()
    absmax = state.absmax
    if state.nested:
        inner = state.state2
        scales = inner.absmax.float().repeat_interleave(inner.blocksize)[: absmax.numel()]
        absmax = inner.code.float()[absmax.long()] * scales + state.offset
    per_value = absmax.float().repeat_interleave(state.blocksize)[:numel]
    table = get_4bit_type(state.quant_type, device="cpu").float()
    return (table[codes] * per_value).reshape(shape).to(state.dtype)


def hf_dequantized(module) -> torch.Tensor:
    """The full-precision weight a transformers bitsandbytes Linear computes with."""
    weight = module.weight
    if hasattr(weight, "quant_state") and weight.quant_state is not None:
        return reference_dequantize_4bit(weight.data, weight.quant_state)
    # Linear8bitLt moves SCB from the weight to its matmul state on its first forward
    scb = getattr(weight, "SCB", None) if getattr(weight, "SCB", None) is not None else module.state.SCB
    return int8_vectorwise_dequant(weight.data, scb)


def rank_weights(hf_model, layer: int, rank: int, tp: int) -> dict[str, torch.Tensor]:
    """What rank ``rank`` of ``tp`` must hold for layer ``layer``, cut from transformers' own weights
    (column layers split by rows, row layers by columns; 2 KV heads so tp <= 2 never replicates)."""
    block = hf_model.model.layers[layer]
    attn, mlp = block.self_attn, block.mlp

    def rows(module):
        weight = hf_dequantized(module)
        return weight.chunk(tp, dim=0)[rank]

    def cols(module):
        return hf_dequantized(module).chunk(tp, dim=1)[rank]

    return {"self_attn.qkv_proj": torch.cat([rows(attn.q_proj), rows(attn.k_proj), rows(attn.v_proj)]),
            "self_attn.o_proj": cols(attn.o_proj),
            "mlp.gate_up_proj": torch.cat([rows(mlp.gate_proj), rows(mlp.up_proj)]),
            "mlp.down_proj": cols(mlp.down_proj)}


def our_weights(model, layer: int) -> dict[str, torch.Tensor]:
    block = model.model.layers[layer]
    return {name: block.get_submodule(name).weight.dequantized().float()
            for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")}
