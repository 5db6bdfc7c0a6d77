"""GGUF metadata -> HF config for the Gated DeltaNet hybrids (``qwen35``, ``qwen3next``, ``qwen35moe``).

Apart from hybrid.py (names and value transforms, with torch and their dataclasses) because
config.py's architecture table reads these rows for every GGUF file, and a dense load must
not import the hybrids' name maps to build it.
"""
from __future__ import annotations

from typing import Any

LINEAR, FULL = "linear_attention", "full_attention"

HYBRID_KEYS = {"ssm.conv_kernel": "linear_conv_kernel_dim", "ssm.state_size": "linear_key_head_dim",
               "ssm.group_count": "linear_num_key_heads", "ssm.time_step_rank": "linear_num_value_heads",
               "ssm.inner_size": "_ssm_inner_size", "attention.recurrent_layers": "_recurrent_layers",
               "full_attention_interval": "full_attention_interval", "rope.dimension_count": "_rope_dim",
               "expert_count": "num_experts"}


def hybrid_derived(config: dict) -> dict:
    """Layer kinds, value head size and partial rotary from what llama.cpp stores."""
    out: dict[str, Any] = {}
    recurrent = config.get("_recurrent_layers")
    if recurrent is not None:
        out["layer_types"] = [LINEAR if bool(flag) else FULL for flag in list(recurrent)[:config["num_hidden_layers"]]]
    if config.get("_ssm_inner_size") and config.get("linear_num_value_heads"):
        out["linear_value_head_dim"] = int(config["_ssm_inner_size"]) // int(config["linear_num_value_heads"])
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if config.get("_rope_dim"):
        out["partial_rotary_factor"] = int(config["_rope_dim"]) / head_dim
    return out
