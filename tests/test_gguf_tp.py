"""Tensor parallelism over packed GGUF weights: tp=2 (two CPU worker processes, gloo) gives tp=1's logits.

The models stress what sharding packed bytes involves: Q4_K_M-style mixed types inside fused
qkv/gate_up shards, row-parallel splits on K-quant block boundaries (down_proj: 2 x 256) and on
Q8_0 ones (o_proj), one KV head replicated over both ranks, a vocabulary no tp size divides
(padded last rank), a tied head projecting through the quantized embedding, and a split
output head.
"""
from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as Q

import toolkit
from gguf_fixtures import Spec, write_model

MIX = {"attn_v": Q.Q6_K, "ffn_up": Q.Q6_K, "ffn_down": Q.Q6_K, "attn_output": Q.Q8_0, "token_embd": Q.Q8_0}
MODELS = {
    "llama-q4_k_m-kv1-tied": Spec("llama", Q.Q4_K, types=MIX, hidden=256, ffn=512, heads=4, kv_heads=1, tied=True),
    "gemma3-q4_k_m-untied": Spec("gemma3", Q.Q4_K, types=MIX | {"output": Q.Q6_K}, hidden=256, ffn=512, heads=2,
                                 kv_heads=1, head_dim=256, layers=6),
}


def _packed_rows(loaded) -> tuple[int, int, int]:
    """(rank, rows of the fused qkv shard, bytes of down_proj's shard): runs in each worker."""
    layer = loaded.model.model.layers[0]
    return loaded.parallel.tp_rank, layer.self_attn.qkv_proj.weight.logical_shape[0], \
        layer.mlp.down_proj.weight.data.numel()


PROMPT = torch.randint(0, 300, (9,), generator=torch.Generator().manual_seed(3)).tolist()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_tp2_matches_tp1(name, tmp_path):
    path = write_model(tmp_path / f"{name}.gguf", MODELS[name])
    single = toolkit.load(str(path), device="cpu")
    expected = single.logits(PROMPT)
    with toolkit.load(str(path), tp=2, device="cpu") as parallel:
        logits = parallel.logits(PROMPT)
        generated = parallel.generate(PROMPT, max_new_tokens=4, stop_token_ids=[])
        shards = parallel.run_all(_packed_rows)
    down_bytes = single.model.model.layers[0].mlp.down_proj.weight.data.numel()
    spec = MODELS[name]  # every model has one KV head: q is split in two, k and v replicated
    assert [rows for _, rows, _ in shards] == [spec.heads * spec.dim // 2 + 2 * spec.dim] * 2
    assert [size for _, _, size in shards] == [down_bytes // 2] * 2
    # the only difference is the order of the partial sums reduced across ranks
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    assert generated == single.generate(PROMPT, max_new_tokens=4, stop_token_ids=[])
