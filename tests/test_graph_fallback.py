"""Which schemes the engine decodes without CUDA graphs, and why (the capture itself needs a GPU:
tests/test_bnb_gpu.py runs the engine both ways; these check the decision on any machine)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from toolkit.core.engine.model_runner import graph_blockers, graph_token_limit
from toolkit.plugins.quant.bnb.scheme import BnbFactory


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA kernels of bnb_int8_matmul register on a GPU")
def test_int8_with_an_outlier_threshold_cannot_be_captured_without_a_cuda_kernel_and_says_why():
    factory = BnbFactory()
    with_outliers = factory.from_spec("bnb-int8", params_dtype=torch.bfloat16)
    assert "threshold 6" in with_outliers.cuda_graph_blocker
    assert factory.from_spec("bnb-int8:threshold=0", params_dtype=torch.bfloat16).cuda_graph_blocker is None
    assert getattr(factory.from_spec("bnb-nf4", params_dtype=torch.bfloat16), "cuda_graph_blocker", None) is None


def test_int8_with_an_outlier_threshold_limits_graphs_to_the_small_batch_kernel():
    factory = BnbFactory()
    assert factory.from_spec("bnb-int8", params_dtype=torch.bfloat16).cuda_graph_max_tokens == 16
    assert factory.from_spec("bnb-int8:threshold=0", params_dtype=torch.bfloat16).cuda_graph_max_tokens is None
    assert getattr(factory.from_spec("bnb-nf4", params_dtype=torch.bfloat16), "cuda_graph_max_tokens", None) is None


def test_graph_token_limit_is_the_smallest_any_layer_asks_for():
    class Scheme:
        def __init__(self, limit):
            self.cuda_graph_max_tokens = limit

    class Layer(nn.Module):
        def __init__(self, limit):
            super().__init__()
            self.scheme = Scheme(limit)

    assert graph_token_limit(nn.Sequential(Layer(None), Layer(32), Layer(16), nn.Linear(2, 2))) == 16
    assert graph_token_limit(nn.Sequential(Layer(None), nn.Linear(2, 2))) is None


def test_graph_blockers_collects_each_distinct_note_of_the_model_layers():
    class Scheme:
        def __init__(self, note):
            self.cuda_graph_blocker = note

    class Layer(nn.Module):
        def __init__(self, note):
            super().__init__()
            self.scheme = Scheme(note)

    model = nn.Sequential(Layer(None), Layer("host sync in A"), Layer("host sync in A"), nn.Linear(2, 2),
                          Layer("B waits"))
    assert graph_blockers(model) == "host sync in A; B waits"
    assert graph_blockers(nn.Sequential(Layer(None), nn.Linear(2, 2))) is None
