"""The gguf quant scheme's self-sharding parameters, checked against gguf-py's own dequantizer.

Each test feeds packed GGUF bytes into a parallel layer as one tensor-parallel rank would
(no process group is needed to load and run one rank's shard) and compares the rank's result
with the matching slice of ``gguf.quants.dequantize`` of the whole tensor.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q, quants

from gguf_fixtures import encode
from toolkit.core.errors import ShardingError, UnsupportedQuantTypeError
from toolkit.core.layers import (MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear,
                                 VocabParallelEmbedding)
from toolkit.core.layers.embedding import ParallelLMHead
from toolkit.core.parallel import ParallelContext
from toolkit.core.registry import default_registry
from toolkit.kernels.gguf import is_supported
from toolkit.plugins.loaders.gguf.tensor import GGUFTensor
from toolkit.plugins.quant.gguf import GGUFParameter, GGUFScheme

SCHEME = GGUFScheme(torch.float32)


@pytest.fixture(autouse=True)
def float_activations(monkeypatch):
    """These tests check the sharding arithmetic to float32 round-off, so the CPU GEMV keeps float32
    activations; its default 8-bit activations have their own bound tests (test_gguf_cpu_kernels)."""
    from toolkit.kernels.gguf_cpu import ops  # noqa: PLC0415

    monkeypatch.setattr(ops, "INT8_ACTIVATIONS", False)


@pytest.fixture(autouse=True, scope="module")
def kernels():
    default_registry()  # installs the gguf kernel ops into the runtime


def packed(rows: int, cols: int, qtype: Q, seed: int = 0) -> tuple[GGUFTensor, torch.Tensor]:
    """A GGUF tensor and its values as gguf-py decodes them (the oracle)."""
    rng = np.random.default_rng(seed)
    data = encode(rng.normal(size=(rows, cols)).astype(np.float32), qtype, rng)
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(rows, -1)
    values = quants.dequantize(raw, qtype) if qtype not in (Q.F32, Q.F16) else data.astype(np.float32)
    tensor = GGUFTensor("t", int(qtype), (rows, cols), torch.from_numpy(raw))
    return tensor, torch.from_numpy(values.reshape(rows, cols))


def rank(r: int, size: int) -> ParallelContext:
    return ParallelContext(tp_rank=r, tp_size=size)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q8_0, Q.F16])
def test_row_parallel_split_on_block_boundaries(qtype):
    tensor, values = packed(8, 1024, qtype)
    x = torch.randn(3, 512)
    for r in range(2):
        layer = RowParallelLinear(1024, 8, quant=SCHEME, parallel=rank(r, 2), prefix="down", reduce_results=False)
        layer.load_weight("weight", tensor, None)
        SCHEME.process_after_loading(layer)
        expected = x @ values[:, r * 512:(r + 1) * 512].T
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)


def test_row_parallel_split_inside_a_block_is_refused():
    tensor, _ = packed(8, 256, Q.Q4_K)  # one 256-element block per row: two ranks would cut it
    layer = RowParallelLinear(256, 8, quant=SCHEME, parallel=rank(1, 2), prefix="down")
    with pytest.raises(ShardingError, match=r"Q4_K blocks of 256 elements"):
        layer.load_weight("weight", tensor, None)


def test_merged_shards_of_different_types():
    gate, gate_values = packed(64, 256, Q.Q4_K, seed=1)
    up, up_values = packed(64, 256, Q.Q6_K, seed=2)
    x = torch.randn(5, 256)
    for r in range(2):
        layer = MergedColumnParallelLinear(256, [64, 64], quant=SCHEME, parallel=rank(r, 2), prefix="gate_up")
        layer.load_weight("weight", gate, 0)
        assert layer.weight.missing_shards() == {1}
        layer.load_weight("weight", up, 1)
        assert layer.weight.missing_shards() == set()
        SCHEME.process_after_loading(layer)
        assert [s.qtype for s in layer.weight.segments] == [Q.Q4_K, Q.Q6_K]
        rows = slice(r * 32, (r + 1) * 32)
        expected = x @ torch.cat([gate_values[rows], up_values[rows]]).T
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)


def test_qkv_with_replicated_kv_heads():
    """tp=4 over 2 KV heads: each KV head serves two ranks; q/k/v of one type form one segment."""
    tensors = [packed(rows, 64, Q.Q8_0, seed=i) for i, rows in enumerate((64, 32, 32))]
    x = torch.randn(2, 64)
    for r in range(4):
        layer = QKVParallelLinear(64, 16, 4, 2, quant=SCHEME, parallel=rank(r, 4), prefix="qkv")
        for shard, (tensor, _) in enumerate(tensors):
            layer.load_weight("weight", tensor, shard)
        SCHEME.process_after_loading(layer)
        assert len(layer.weight.segments) == 1
        kv = r // 2
        weight = torch.cat([tensors[0][1][r * 16:(r + 1) * 16], tensors[1][1][kv * 16:(kv + 1) * 16],
                            tensors[2][1][kv * 16:(kv + 1) * 16]])
        torch.testing.assert_close(layer(x), x @ weight.T, rtol=1e-5, atol=1e-5)


def test_vocab_parallel_embedding_and_tied_head():
    """Vocab 100 over two ranks pads to 128 rows; padding rows read as zero, lookups dequantize rows only."""
    table, values = packed(100, 64, Q.Q5_0)
    ids = torch.tensor([0, 5, 63, 64, 99])
    hidden = torch.randn(3, 64)
    for r in range(2):
        embedding = VocabParallelEmbedding(100, 64, quant=SCHEME, parallel=rank(r, 2), prefix="embed")
        embedding.load_weight("weight", table, None)
        SCHEME.process_after_loading(embedding)
        local = ids - embedding.vocab_start
        inside = (local >= 0) & (local < embedding.rows_per_rank)
        looked_up = SCHEME.embed(embedding, torch.where(inside, local, 0))
        for i in torch.nonzero(inside).flatten().tolist():
            torch.testing.assert_close(looked_up[i], values[ids[i]])
        head = ParallelLMHead(100, 64, quant=SCHEME, parallel=rank(r, 2), prefix="lm_head", tied_to=embedding)
        logits = head.tied_to.project(hidden)
        assert logits.shape == (3, 64)
        real = embedding.num_real_rows
        rows = values[embedding.vocab_start:embedding.vocab_start + real]
        torch.testing.assert_close(logits[:, :real], hidden @ rows.T, rtol=1e-5, atol=1e-5)
        assert torch.count_nonzero(logits[:, real:]) == 0


def unsupported_type() -> Q:
    """A type GGUF defines but the gguf kernels do not decode (they cover nearly all)."""
    return next(t for t in (Q.Q8_K, Q.Q8_1, Q.F64) if not is_supported(int(t)))


def test_unsupported_type_names_the_type():
    qtype = unsupported_type()
    row_bytes = 256 // GGML_QUANT_SIZES[qtype][0] * GGML_QUANT_SIZES[qtype][1]
    tensor = GGUFTensor("blk.0.attn_q.weight", int(qtype), (8, 256), torch.zeros(8, row_bytes, dtype=torch.uint8))
    layer = RowParallelLinear(256, 8, quant=SCHEME, parallel=rank(0, 1), prefix="o")
    with pytest.raises(UnsupportedQuantTypeError, match=qtype.name):
        layer.load_weight("weight", tensor, None)


def test_stored_state_round_trip():
    gate, _ = packed(32, 256, Q.Q4_K, seed=3)
    up, _ = packed(32, 256, Q.Q6_K, seed=4)
    layer = MergedColumnParallelLinear(256, [32, 32], quant=SCHEME, parallel=rank(0, 1), prefix="gate_up")
    layer.load_weight("weight", gate, 0)
    layer.load_weight("weight", up, 1)
    state = layer.weight.stored_state()
    copy = MergedColumnParallelLinear(256, [32, 32], quant=SCHEME, parallel=rank(0, 1), prefix="gate_up")
    for part, tensor in state.items():
        copy.weight.load_stored(tensor.clone(), part=part)
    x = torch.randn(2, 256)
    assert copy.weight.missing_shards() == set()
    torch.testing.assert_close(copy(x), layer(x), rtol=0, atol=0)


def test_parameter_is_lazy_until_finalized():
    param = GGUFParameter.empty(4, 64, shard_ids=(None,))
    assert param.numel() == 0 and param.logical_numel == 256 and param.missing_shards() == {None}


@pytest.mark.parametrize("compute", [torch.bfloat16, torch.float16, torch.float32])
def test_float_tensors_are_cast_to_the_compute_dtype_once_at_load(compute):
    """An F16 weight next to a Q8_0 one (one fused layer): after loading, the F16 segment is stored
    in the compute dtype (no per-forward conversion) and the product equals x @ W.T in that dtype."""
    f16, f16_values = packed(32, 256, Q.F16, seed=3)
    q8, q8_values = packed(32, 256, Q.Q8_0, seed=4)
    scheme = GGUFScheme(compute)
    layer = MergedColumnParallelLinear(256, [32, 32], quant=scheme, parallel=rank(0, 1), prefix="gate_up")
    layer.load_weight("weight", f16, 0)
    layer.load_weight("weight", q8, 1)
    scheme.process_after_loading(layer)
    wanted = {torch.bfloat16: Q.BF16, torch.float16: Q.F16, torch.float32: Q.F32}[compute]
    assert [s.qtype for s in layer.weight.segments] == [wanted, Q.Q8_0]
    stored = layer.weight.segment_data(layer.weight.segments[0]).view(compute)
    assert torch.equal(stored, f16_values.to(torch.float16).to(compute))   # gguf-py's F16 values, cast once
    x = torch.randn(3, 256).to(compute)
    expected = torch.cat([x.double() @ f16_values.to(compute).double().T, x.double() @ q8_values.to(compute).double().T], -1)
    tol = 1e-5 if compute == torch.float32 else 3e-2
    torch.testing.assert_close(layer(x).double(), expected, rtol=tol, atol=tol)


def test_later_segments_launch_as_siblings(monkeypatch):
    """A weight of two quant types is two matmuls of one input: the second is launched inside ``siblings()``
    (``kernels/sibling_launches``: on a GPU it may start before the first ends), the first is not; the result is the
    same as without the marking (``TOOLKIT_PDL_SIBLINGS=0``)."""
    from toolkit.kernels import runtime, sibling_launches  # noqa: PLC0415
    gate, _ = packed(64, 256, Q.Q4_K, seed=1)
    up, _ = packed(64, 256, Q.Q6_K, seed=2)
    layer = MergedColumnParallelLinear(256, [64, 64], quant=SCHEME, parallel=rank(0, 1), prefix="gate_up")
    layer.load_weight("weight", gate, 0)
    layer.load_weight("weight", up, 1)
    SCHEME.process_after_loading(layer)
    x = torch.randn(1, 256)
    marks, call = [], runtime.call

    def recording(name, *args):
        marks.append((name, sibling_launches.in_siblings()))
        return call(name, *args)

    monkeypatch.setattr(runtime, "call", recording)
    marked = layer(x)
    assert [m for m in marks if m[0] == "gguf_matmul"] == [("gguf_matmul", False), ("gguf_matmul", True)]
    assert not sibling_launches.in_siblings()                     # only inside the block
    marks.clear()
    SCHEME.apply_unreduced(layer, x)
    assert [m for m in marks if m[0] == "gguf_matmul_unreduced"] == [("gguf_matmul_unreduced", False),
                                                                    ("gguf_matmul_unreduced", True)]
    monkeypatch.setenv("TOOLKIT_PDL_SIBLINGS", "0")
    marks.clear()
    assert torch.equal(layer(x), marked)
    assert all(not sibling for _, sibling in marks)
