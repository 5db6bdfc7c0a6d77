"""Tiny random Qwen3.5 / Qwen3-Next (dense and MoE) / Qwen3.5-MoE checkpoints written by
transformers' save_pretrained.

Key heads != value heads (2 vs 4, so grouped and tiled value-head orders differ), attention
on every 3rd layer, untied LM head. The MoE kinds have 4 experts, top-2, and a shared expert
behind its sigmoid gate on every layer (as the released models; ``MIXED_NEXT`` adds dense
layers through ``mlp_only_layers``); save_pretrained writes experts one by one. Every parameter is re-drawn (norm weights too, which
transformers initialises to zero); ``A_log`` stays the log of a positive decay rate.
"""
from __future__ import annotations

from pathlib import Path

import torch
import transformers as tf

VOCAB = 1001
LINEAR, FULL = "linear_attention", "full_attention"
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
              linear_key_head_dim=8, linear_value_head_dim=12, linear_conv_kernel_dim=4,
              layer_types=[LINEAR, LINEAR, FULL, LINEAR], tie_word_embeddings=False, max_position_embeddings=512,
              rms_norm_eps=1e-6)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48)
NO_DENSE = {k: v for k, v in COMMON.items() if k != "intermediate_size"}  # Qwen3.5-MoE has no dense MLP
KINDS = {
    "qwen3_5": (lambda: tf.Qwen3_5TextConfig(**COMMON), tf.Qwen3_5ForCausalLM),
    # dense MLP on every layer (mlp_only_layers), so no sparse-MoE block is built
    "qwen3_next": (lambda: tf.Qwen3NextConfig(**COMMON, mlp_only_layers=[0, 1, 2, 3], num_experts=0),
                   tf.Qwen3NextForCausalLM),
    "qwen3_next_moe": (lambda: tf.Qwen3NextConfig(**COMMON, **MOE, norm_topk_prob=True), tf.Qwen3NextForCausalLM),
    "qwen3_5_moe": (lambda: tf.Qwen3_5MoeTextConfig(**NO_DENSE, **MOE), tf.Qwen3_5MoeForCausalLM),
}
MOE_KINDS = ("qwen3_next_moe", "qwen3_5_moe")
# Qwen3-Next with dense layers among sparse ones (safetensors only: GGUF's qwen3next is all-MoE)
MIXED_NEXT = (lambda: tf.Qwen3NextConfig(**COMMON, **MOE, norm_topk_prob=False, mlp_only_layers=[1],
                                         decoder_sparse_step=1), tf.Qwen3NextForCausalLM)


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("A_log"):
                param.copy_((torch.rand(param.shape, generator=generator) * 2 + 0.05).log())
            else:
                std = 0.3 if "norm" in name else 0.1
                param.copy_(torch.randn(param.shape, generator=generator) * std)
    return model


def save_hybrid(path: Path, kind: str, seed: int = 0, **save_options):
    """Write a random model to ``path``; returns transformers' model re-read from it (fp32, eval).

    :param kind: a KINDS key, or "qwen3_next_mixed" (MIXED_NEXT)
    :param save_options: passed to save_pretrained (``save_original_format=False``: stacked experts)
    """
    make_config, cls = MIXED_NEXT if kind == "qwen3_next_mixed" else KINDS[kind]
    torch.manual_seed(seed)
    randomize(cls(make_config()), seed).save_pretrained(path, **save_options)
    return cls.from_pretrained(path).eval()


def prompt(length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(seed))


def hf_greedy(model, ids: torch.Tensor, new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(ids[None], max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             pad_token_id=0)
    return out[0, ids.shape[0]:].tolist()
