"""Helpers shared by the bitsandbytes tests (no tests here): random Llamas written by transformers,
their transformers-bitsandbytes counterparts, and per-rank slices of their weights.

transformers' bitsandbytes path needs ``accelerate``; tests that compare against it are skipped
with that reason where it is missing, while the checks against bitsandbytes' own functions run.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import transformers as tf
from bitsandbytes.functional import dequantize_4bit, int8_vectorwise_dequant

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


def hf_bnb_model(path: Path, kind: str):
    """transformers loading ``path`` with the matching BitsAndBytesConfig (fp32 compute, CPU)."""
    config = tf.BitsAndBytesConfig(bnb_4bit_compute_dtype=torch.float32, **BNB_CONFIGS[kind])
    return tf.AutoModelForCausalLM.from_pretrained(path, quantization_config=config, dtype=torch.float32,
                                                   device_map="cpu").eval()


def hf_logits(model, ids=PROMPT) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def hf_dequantized(module) -> torch.Tensor:
    """The full-precision weight a transformers bitsandbytes Linear computes with."""
    weight = module.weight
    if hasattr(weight, "quant_state") and weight.quant_state is not None:
        return dequantize_4bit(weight.data, weight.quant_state)
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
