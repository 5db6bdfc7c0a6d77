"""Tiny random Hugging Face models written with transformers' own save_pretrained.

Every parameter is re-drawn at random (transformers initialises biases and some norms to
constants, which would let a loader that skips them pass).
"""
from __future__ import annotations

from pathlib import Path

import torch
import transformers as tf

VOCAB = 1001  # odd on purpose: no tensor-parallel size divides it


def hf_config(kind: str, *, tied: bool = False, num_kv_heads: int = 2, vocab: int = VOCAB, **extra):
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=num_kv_heads, max_position_embeddings=256,
                  tie_word_embeddings=tied, rms_norm_eps=1e-5, **extra)
    if kind == "llama":
        return tf.LlamaConfig(**common), tf.LlamaForCausalLM
    if kind == "qwen2":
        return tf.Qwen2Config(**common), tf.Qwen2ForCausalLM
    if kind == "qwen3":
        return tf.Qwen3Config(head_dim=16, **common), tf.Qwen3ForCausalLM
    raise ValueError(kind)


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.08)
    return model


def save_hf_model(path: Path, kind: str = "llama", *, tied: bool = False, shard_size: str | None = None,
                  safe: bool = True, seed: int = 0, **config_extra):
    """Write a random model to ``path``; returns the transformers model (fp32, eval)."""
    config, cls = hf_config(kind, tied=tied, **config_extra)
    torch.manual_seed(seed)
    model = randomize(cls(config), seed).eval()
    kwargs = {"max_shard_size": shard_size} if shard_size else {}
    model.save_pretrained(path, **kwargs)
    if not safe:  # transformers 5 only writes safetensors; old checkpoints were torch.save'd dicts
        for file in Path(path).glob("*.safetensors"):
            file.unlink()
        torch.save({k: v.contiguous() for k, v in model.state_dict().items()}, Path(path) / "pytorch_model.bin")
    return model
