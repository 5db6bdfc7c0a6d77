"""GGUF leaf names -> Hugging Face module names, as data (no torch: direct.py reads them too).

names.py builds each architecture's GGUFNameMap from these tables; ``DENSE_LEAVES`` lists the
architectures whose map is a plain table (no experts, no namer of its own), which is what lets
direct.py re-quantize their files tensor by tensor under the same names.
"""
from __future__ import annotations

GLOBAL_LEAVES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
LAYER_LEAVES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
# Gemma 3 norms around both sublayers: llama.cpp's ffn_norm is the pre-feedforward one there.
GEMMA3_LAYER_LEAVES = {**LAYER_LEAVES, "ffn_norm": "pre_feedforward_layernorm",
                       "post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
# Tensors llama.cpp writes that no parameter takes: precomputed rope frequency factors.
IGNORED = frozenset({"rope_freqs.weight"})
# Architectures (GGUF general.architecture) whose name map is one plain table of leaves
DENSE_LEAVES = {"llama": LAYER_LEAVES, "qwen2": LAYER_LEAVES, "qwen3": LAYER_LEAVES, "gemma3": GEMMA3_LAYER_LEAVES}
