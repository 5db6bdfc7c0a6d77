"""GGUF names of mixture-of-experts tensors, as data (llama.cpp's ``blk.{i}.ffn_*_exps`` family).

llama.cpp stacks each projection's experts into one 3-D tensor (``ffn_gate_exps`` ``[E, I, H]``,
``ffn_up_exps``, ``ffn_down_exps`` ``[E, H, I]``; or gate and up together as
``ffn_gate_up_exps`` ``[E, 2I, H]``), keeps the router ``ffn_gate_inp`` in F32, and names a
shared expert's projections ``*_shexp`` with its sigmoid gate ``ffn_gate_inp_shexp``.
An MoE architecture's GGUF name map is ``GGUFNameMap(arch, leaves=MOE_LAYER_LEAVES,
experts=EXPERT_LEAVES)``: nothing else changes for a new one.
"""
from __future__ import annotations

# leaf -> (stacked expert parameter inside model.layers.{i}, shard id: gate 0, up 1, None both/whole)
EXPERT_LEAVES = {
    "ffn_gate_exps": ("mlp.experts.gate_up_proj", 0),
    "ffn_up_exps": ("mlp.experts.gate_up_proj", 1),
    "ffn_gate_up_exps": ("mlp.experts.gate_up_proj", None),
    "ffn_down_exps": ("mlp.experts.down_proj", None),
}
# plain (per-layer) leaves of MoE blocks -> HF module, on top of the dense decoder's
MOE_LEAVES = {
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
# routers: plain tensors in the model (and F32 in files, as llama.cpp keeps them)
ROUTER_LEAVES = frozenset({"ffn_gate_inp", "ffn_gate_inp_shexp"})
# metadata "{arch}.<suffix>" -> HF config key
MOE_KEYS = {
    "expert_count": "num_experts",
    "expert_used_count": "num_experts_per_tok",
    "expert_feed_forward_length": "moe_intermediate_size",
    "expert_shared_feed_forward_length": "shared_expert_intermediate_size",
}
# Mixtral is llama.cpp's "llama" with experts; its expert size is the feed-forward length
MIXTRAL_KEYS = {"expert_count": "num_local_experts", "expert_used_count": "num_experts_per_tok"}


def mixtral_if_experts(config: dict) -> dict:
    """A ``llama`` file with experts is a Mixtral."""
    if config.get("num_local_experts"):
        return {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"]}
    return {}


def qwen2moe_qkv_bias(config: dict) -> dict:
    """Qwen2-MoE configs name q/k/v biases ``qkv_bias``; the file says it by having them."""
    return {"qkv_bias": bool(config.get("attention_bias"))}
