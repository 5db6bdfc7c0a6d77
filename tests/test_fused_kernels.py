"""The fused Triton kernels (toolkit/kernels/fused) against the torch references, on CUDA.

Fresh random inputs per case; the references round after every operation in the activation
dtype while the kernels compute in float32 and round once, so the tolerance is the dtype's:
relative Frobenius error under 1e-2 for bf16 / fp16 and 1e-5 for float32. The reference ops
themselves are what the CPU model tests (against transformers) exercise.
"""
from __future__ import annotations

import pytest
import torch

from toolkit.kernels import reference

pytestmark = pytest.mark.gpu
TOL = {torch.bfloat16: 1e-2, torch.float16: 4e-3, torch.float32: 1e-5}


@pytest.fixture(scope="module")
def ops():
    from toolkit.kernels.fused import ops as fused  # noqa: PLC0415 - needs Triton
    return fused


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert torch.isfinite(out).all()
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(1, 4096), (7, 2048), (3, 5, 128), (2, 3000)])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm_and_add_rms_norm(ops, dtype, shape, offset):
    gen = torch.Generator(device="cuda").manual_seed(hash((shape, offset)) % 2**31)
    x = torch.randn(shape, generator=gen, device="cuda").to(dtype) * 3
    residual = torch.randn(shape, generator=gen, device="cuda").to(dtype)
    weight = (1 + 0.3 * torch.randn(shape[-1], generator=gen, device="cuda")).to(dtype)
    assert ops.rms_norm.supports(x, weight, 1e-6, offset)
    assert rel_err(ops.rms_norm(x, weight, 1e-6, offset), reference.rms_norm(x, weight, 1e-6, offset)) < TOL[dtype]
    normed, total = ops.add_rms_norm(x, residual, weight, 1e-6, offset)
    ref_normed, ref_total = reference.add_rms_norm(x, residual, weight, 1e-6, offset)
    assert torch.equal(total, ref_total)            # one correctly rounded add either way
    assert rel_err(normed, ref_normed) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("heads,kv_heads,head_dim,rotary_dim", [(32, 8, 128, 128), (8, 2, 64, 32), (4, 4, 80, 80)])
def test_rotary_qk_on_views_of_a_fused_qkv(ops, dtype, heads, kv_heads, head_dim, rotary_dim):
    """q and k are strided views of one qkv output, as the attention layer passes them."""
    tokens = 9
    gen = torch.Generator(device="cuda").manual_seed(heads * 1000 + head_dim)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen, device="cuda").to(dtype)
    q, k, _ = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    positions = torch.randint(0, 8000, (tokens,), generator=gen, device="cuda")
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, device="cuda").float() / rotary_dim))
    assert ops.rotary_qk.supports(positions, q, k, inv_freq, head_dim, rotary_dim)
    out_q, out_k = ops.rotary_qk(positions, q, k, inv_freq, head_dim, rotary_dim)
    ref_q, ref_k = reference.rotary_qk(positions, q, k, inv_freq, head_dim, rotary_dim)
    assert rel_err(out_q, ref_q) < TOL[dtype] and rel_err(out_k, ref_k) < TOL[dtype]
    if rotary_dim < head_dim:  # the pass-through features are copied exactly
        tail = q.reshape(tokens, heads, head_dim)[..., rotary_dim:]
        assert torch.equal(out_q.reshape(tokens, heads, head_dim)[..., rotary_dim:], tail)


def paged_case(gen, dtype, tokens: int, heads: int, kv_heads: int, head_dim: int, rotary_dim: int, scale: float = 1.0):
    """Views q, k, v of one fused qkv row per token, positions, inv_freq, cache slots (every fifth -1:
    padding) and two copies of a pair of paged caches filled with 7.0."""
    qkv = (torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen, device="cuda") * scale).to(dtype)
    qkv_views = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    positions = torch.randint(0, 8000, (tokens,), generator=gen, device="cuda")
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, device="cuda").float() / rotary_dim))
    slots = torch.randperm(4 * 16, generator=gen, device="cuda")[:tokens]
    slots[::5] = -1
    mine = [torch.full((4, 16, kv_heads, head_dim), 7.0, dtype=dtype, device="cuda") for _ in range(2)]
    return qkv_views, positions, inv_freq, slots, mine, [cache.clone() for cache in mine]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("heads,kv_heads,head_dim,rotary_dim",
                         [(12, 2, 128, 128), (8, 2, 64, 32), (4, 4, 80, 80), (4, 1, 256, 256)])
@pytest.mark.parametrize("tokens", [1, 37])
def test_rotary_store_kv_matches_rotary_then_store(ops, dtype, heads, kv_heads, head_dim, rotary_dim, tokens):
    """Rotated q returned, rotated k and v in the paged caches, padding slots (-1) untouched."""
    gen = torch.Generator(device="cuda").manual_seed(heads * 1000 + head_dim + tokens)
    (q, k, v), positions, inv_freq, slots, mine, theirs = paged_case(gen, dtype, tokens, heads, kv_heads, head_dim,
                                                                     rotary_dim)
    args = (positions, q, k, v, inv_freq, head_dim, rotary_dim)
    assert ops.rotary_store_kv.supports(*args, *mine, slots)
    q_rot = ops.rotary_store_kv(*args, *mine, slots)
    ref_q = reference.rotary_store_kv(*args, *theirs, slots)
    assert rel_err(q_rot, ref_q) < TOL[dtype] and rel_err(mine[0], theirs[0]) < TOL[dtype]
    assert torch.equal(mine[1], theirs[1])  # v is copied
    unwritten = torch.ones(4 * 16, dtype=torch.bool, device="cuda")
    unwritten[slots[slots >= 0]] = False
    assert (mine[0].view(64, -1)[unwritten] == 7.0).all() and (mine[1].view(64, -1)[unwritten] == 7.0).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("heads,kv_heads,head_dim,rotary_dim", [(32, 4, 128, 128), (8, 2, 64, 32), (4, 1, 256, 256)])
@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("tokens", [1, 37])
def test_qk_norm_rotary_store_kv_matches_norms_then_rotary_store(ops, dtype, heads, kv_heads, head_dim, rotary_dim,
                                                                 offset, tokens):
    """Qwen3's / Gemma 3's q and k norms in the rotary + KV-store kernel, on views of a fused qkv row, against
    the reference norms of every head followed by the reference rotary_store_kv."""
    gen = torch.Generator(device="cuda").manual_seed(heads * 1000 + head_dim + tokens + int(offset))
    (q, k, v), positions, inv_freq, slots, mine, theirs = paged_case(gen, dtype, tokens, heads, kv_heads, head_dim,
                                                                     rotary_dim, scale=3.0)
    weights = [(1 + 0.3 * torch.randn(head_dim, generator=gen, device="cuda")).to(dtype) for _ in range(2)]
    args = (positions, q, k, v, *weights, 1e-6, offset, inv_freq, head_dim, rotary_dim)
    assert ops.qk_norm_rotary_store_kv.supports(*args, *mine, slots)
    q_rot = ops.qk_norm_rotary_store_kv(*args, *mine, slots)
    q_normed = reference.rms_norm(q.reshape(tokens, heads, head_dim), weights[0], 1e-6, offset).reshape(tokens, -1)
    k_normed = reference.rms_norm(k.reshape(tokens, kv_heads, head_dim), weights[1], 1e-6, offset).reshape(tokens, -1)
    ref_q = reference.rotary_store_kv(positions, q_normed, k_normed, v, inv_freq, head_dim, rotary_dim, *theirs, slots)
    assert rel_err(q_rot, ref_q) < TOL[dtype] and rel_err(mine[0], theirs[0]) < TOL[dtype]
    assert torch.equal(mine[1], theirs[1])  # v is copied, never normalised
    from toolkit.core.registry import default_registry  # noqa: PLC0415
    from toolkit.kernels import runtime  # noqa: PLC0415
    default_registry()
    assert runtime.resolve("qk_norm_rotary_store_kv", *args, *mine, slots) is ops.qk_norm_rotary_store_kv


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("activation", ["silu", "gelu_pytorch_tanh", "gelu"])
@pytest.mark.parametrize("rows,cols", [(1, 14336), (13, 1000)])
def test_gated_activation(ops, dtype, activation, rows, cols):
    gen = torch.Generator(device="cuda").manual_seed(rows + cols)
    x = (torch.randn(rows, 2 * cols, generator=gen, device="cuda") * 2).to(dtype)
    assert ops.gated_activation.supports(x, activation)
    out = ops.gated_activation(x, activation)
    assert rel_err(out, reference.gated_activation(x, activation)) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("splits", [2, 8])
@pytest.mark.parametrize("activation", ["silu", "gelu_pytorch_tanh"])
@pytest.mark.parametrize("tokens,sums", [(8, None), (8, True), (32, None)])
def test_split_sum_consumers_match_the_two_launches(ops, dtype, splits, sums, activation, tokens):
    """``add_rms_norm_splits`` and ``gated_activation_splits`` (kernels/split_sums.py), compiled: bit for bit the
    separate ``sum_splits`` launch followed by the plain kernel, and within the dtype's tolerance of the torch
    references of the summed input. 32 tokens (a 17-64-token matmul's partials) without int8 blocks, as the engine
    asks for none there: with them, float16 norm outputs were 1 ulp off the two launches' in 11-13 of 131,072
    elements for two of four seeds (H100, session 25; 3 of 32,768 for one of four at 8 tokens)."""
    gen = torch.Generator(device="cuda").manual_seed(splits * 7 + (sums is None))
    parts = torch.randn(splits, tokens, 4096, generator=gen, device="cuda") * 3
    residual = torch.randn(tokens, 4096, generator=gen, device="cuda").to(dtype)
    weight = (1 + 0.3 * torch.randn(4096, generator=gen, device="cuda")).to(dtype)
    assert ops.add_rms_norm_splits.supports(parts, residual, weight, 1e-6, 0.0, sums)
    got = ops.add_rms_norm_splits(parts, residual, weight, 1e-6, 0.0, sums)
    x = ops.sum_splits(parts, dtype)
    want = (ops.add_rms_norm(x, residual, weight, 1e-6, 0.0) if sums is None
            else ops.add_rms_norm_int8(x, residual, weight, 1e-6, 0.0, sums))
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    ref_out, ref_total = reference.add_rms_norm(x, residual, weight, 1e-6, 0.0)
    assert torch.equal(got[1], ref_total) and rel_err(got[0], ref_out) < TOL[dtype]
    gate_up = torch.randn(splits, tokens, 2 * 7168, generator=gen, device="cuda")
    assert ops.gated_activation_splits.supports(gate_up, dtype, activation, sums)
    got = ops.gated_activation_splits(gate_up, dtype, activation, sums)
    x = ops.sum_splits(gate_up, dtype)
    want = (ops.gated_activation(x, activation),) if sums is None else ops.gated_activation_int8(x, activation, sums)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert rel_err(got[0], reference.gated_activation(x, activation)) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("norm", [None, 0.0, 1.0])
@pytest.mark.parametrize("v_split", [True, False])
def test_rotary_store_adds_qkv_partials_as_the_two_launches_do(ops, dtype, norm, v_split):
    """``rotary_store_kv_splits`` (a fused qkv projection's partials: q, k and v column ranges of one ``[S, T, N]``,
    or v another matmul's plain output), compiled: bit for bit the separate sums followed by
    ``(qk_norm_)rotary_store_kv``, within tolerance of the torch reference."""
    heads, kv_heads, head_dim, tokens = 12, 2, 128, 8
    sizes = [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
    gen = torch.Generator(device="cuda").manual_seed(3 + v_split)
    qkv = torch.randn(4, tokens, sum(sizes), generator=gen, device="cuda")
    q, k, v = qkv.split(sizes, dim=-1)
    if not v_split:
        v = ops.sum_splits(v, dtype).unsqueeze(0)
    weights = None if norm is None else (*((1 + 0.3 * torch.randn(head_dim, generator=gen, device="cuda")).to(dtype)
                                           for _ in range(2)), 1e-6, norm)
    positions = torch.arange(tokens, device="cuda") * 97
    slots = torch.tensor([3, -1, 40, 41, 7, 100, 63, 0], device="cuda")
    inv_freq = 1.0 / (500000 ** (torch.arange(0, head_dim, 2, device="cuda").float() / head_dim))
    mine = [torch.zeros(8, 16, kv_heads, head_dim, dtype=dtype, device="cuda") for _ in range(2)]
    theirs = [cache.clone() for cache in mine]
    args = (positions, q, k, v, dtype, inv_freq, head_dim, head_dim)
    assert ops.rotary_store_kv_splits.supports(*args, *mine, slots, weights)
    got = ops.rotary_store_kv_splits(*args, *mine, slots, weights)
    values = [ops.sum_splits(x, dtype) if x.shape[0] > 1 else x[0] for x in (q, k, v)]
    if weights is None:
        want = ops.rotary_store_kv(positions, *values, inv_freq, head_dim, head_dim, *theirs, slots)
    else:
        want = ops.qk_norm_rotary_store_kv(positions, *values, *weights, inv_freq, head_dim, head_dim, *theirs, slots)
    assert torch.equal(got, want) and torch.equal(mine[0], theirs[0]) and torch.equal(mine[1], theirs[1])
    q, k, v = values
    if weights is not None:      # the torch references composed by hand (the runtime would pick these kernels)
        q, k = (reference.rms_norm(x.reshape(tokens, -1, head_dim), w, 1e-6, norm).reshape(tokens, -1)
                for x, w in ((q, weights[0]), (k, weights[1])))
    expected = reference.rotary_store_kv(positions, q, k, v, inv_freq, head_dim, head_dim,
                                         *[c.clone() for c in theirs], slots)
    assert rel_err(got, expected) < TOL[dtype]


def test_the_runtime_dispatches_cuda_calls_to_the_fused_kernels(ops):
    from toolkit.core.registry import default_registry  # noqa: PLC0415
    from toolkit.kernels import runtime  # noqa: PLC0415
    default_registry()
    x = torch.randn(2, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(256, device="cuda", dtype=torch.bfloat16)
    assert runtime.resolve("rms_norm", x, w, 1e-6, 0.0) is ops.rms_norm
    assert runtime.resolve("gated_activation", x, "silu") is ops.gated_activation
    assert runtime.resolve("rms_norm", x.cpu(), w.cpu(), 1e-6, 0.0) is reference.rms_norm
    qkv = torch.randn(3, 4 * 64, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.split([128, 64, 64], dim=-1)
    cache = torch.zeros(2, 16, 1, 64, device="cuda", dtype=torch.bfloat16)
    positions, slots = torch.arange(3, device="cuda"), torch.arange(3, device="cuda")
    inv_freq = torch.ones(32, device="cuda")
    assert runtime.resolve("rotary_store_kv", positions, q, k, v, inv_freq, 64, 64, cache, cache.clone(),
                           slots) is ops.rotary_store_kv
