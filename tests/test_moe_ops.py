"""MoE ops and layer contracts: routing against transformers' routers, sharding errors."""
from __future__ import annotations

import pytest
import torch
import transformers as tf
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

from toolkit.core.errors import ShardingError
from toolkit.core.layers.moe import FusedMoE
from toolkit.core.parallel import ParallelContext
from toolkit.kernels import runtime
from toolkit.plugins.quant.unquantized import UnquantizedScheme


@pytest.mark.parametrize("renormalize", [True, False])
def test_route_matches_transformers_router(renormalize):
    config = tf.Qwen3MoeConfig(hidden_size=32, num_experts=8, num_experts_per_tok=3, norm_topk_prob=renormalize)
    router = Qwen3MoeTopKRouter(config)
    torch.nn.init.normal_(router.weight)
    x = torch.randn(21, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, expected_weights, expected_ids = router(x)
    weights, ids = runtime.call("moe_route", logits, 3, renormalize)
    assert torch.equal(ids, expected_ids)
    torch.testing.assert_close(weights, expected_weights.float(), atol=1e-6, rtol=0)


def test_tp_split_that_does_not_divide_an_expert_is_a_sharding_error():
    with pytest.raises(ShardingError, match="expert intermediate size = 30"):
        FusedMoE(4, 16, 30, quant=UnquantizedScheme(torch.float32), parallel=ParallelContext(0, 4), prefix="m")


def test_expert_parallel_needs_experts_divisible_by_ranks():
    with pytest.raises(ShardingError, match="experts = 6"):
        FusedMoE(6, 16, 32, quant=UnquantizedScheme(torch.float32), parallel=ParallelContext(0, 4), prefix="m",
                 expert_parallel=True)


def test_tp_split_cutting_gguf_blocks_is_a_sharding_error():
    """Q4_K blocks hold 256 elements: splitting an expert's 256 intermediate columns over 2 ranks cuts them."""
    from gguf import GGMLQuantizationType as Q  # noqa: PLC0415

    from toolkit.kernels.gguf_quant import quantize  # noqa: PLC0415
    from toolkit.plugins.loaders.gguf.tensor import GGUFTensor  # noqa: PLC0415
    from toolkit.plugins.quant.gguf.scheme import GGUFScheme  # noqa: PLC0415

    layer = FusedMoE(2, 64, 256, quant=GGUFScheme(torch.float32), parallel=ParallelContext(0, 2), prefix="m")
    down = quantize(torch.randn(2, 64, 256), Q.Q4_K)  # [E, H, I] stacked, as ffn_down_exps
    tensor = GGUFTensor("blk.0.ffn_down_exps.weight", int(Q.Q4_K), (2, 64, 256), down.reshape(128, -1))
    with pytest.raises(ShardingError, match="cuts Q4_K blocks of 256"):
        layer.load_weight("down_proj", tensor, None)
