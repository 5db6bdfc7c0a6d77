"""Tiny random mixture-of-experts models written by transformers' own save_pretrained.

Sizes are chosen to exercise sharding: 4 experts (tp=2 splits each expert's intermediate 32 in
two, or gives each rank 2 whole experts), top-2 routing, a dense layer where the config asks
for one (``mlp_only_layers`` / ``decoder_sparse_step``).
"""
from __future__ import annotations

from pathlib import Path

import torch
import transformers as tf

from hf_fixtures import randomize

VOCAB = 211


def moe_config(kind: str, *, hidden: int = 64, expert_ffn: int = 32, experts: int = 4, layers: int = 3, **extra):
    common = dict(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
                  num_experts_per_tok=2, tie_word_embeddings=False)
    if kind == "qwen3_moe":
        fields = dict(head_dim=16, intermediate_size=96, moe_intermediate_size=expert_ffn, num_experts=experts,
                      norm_topk_prob=True, mlp_only_layers=[1])
        return tf.Qwen3MoeConfig(**{**common, **fields, **extra}), tf.Qwen3MoeForCausalLM
    if kind == "qwen2_moe":
        fields = dict(intermediate_size=96, moe_intermediate_size=expert_ffn, num_experts=experts,
                      shared_expert_intermediate_size=48, decoder_sparse_step=2)
        return tf.Qwen2MoeConfig(**{**common, **fields, **extra}), tf.Qwen2MoeForCausalLM
    if kind == "mixtral":
        fields = dict(intermediate_size=expert_ffn, num_local_experts=experts)
        return tf.MixtralConfig(**{**common, **fields, **extra}), tf.MixtralForCausalLM
    raise ValueError(kind)


def save_moe_model(path: Path, kind: str, *, stacked: bool = False, seed: int = 0, **extra):
    """Write a random model; ``stacked`` keeps transformers' fused 3-D expert tensors
    (``save_original_format=False``) instead of one tensor per expert. Returns the model (fp32, eval)."""
    config, cls = moe_config(kind, **extra)
    torch.manual_seed(seed)
    model = randomize(cls(config), seed).eval()
    model.save_pretrained(path, **({"save_original_format": False} if stacked else {}))
    return model
