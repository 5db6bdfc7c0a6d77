"""GGUF kernels against gguf-py (``gguf.quants.quantize`` / ``dequantize``), the independent oracle.

CPU: the torch reference must be bit-identical to gguf-py for every supported type, on data
quantized by gguf-py where it can quantize, and on random blocks otherwise (random bytes are
valid for these layouts; fp16 scale fields are set finite so the matmul checks are meaningful).
GPU (``-m gpu``): the Triton kernels against the torch reference.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize, quantize

from toolkit.core.errors import ShapeMismatchError, UnsupportedQuantTypeError
from toolkit.core.plugins import PluginSet
from toolkit.core.registry import Registry
from toolkit.kernels import runtime
from toolkit.kernels.gguf import (SUPPORTED_TYPES, block_size, gguf_dequantize, gguf_embedding, gguf_matmul,
                                  is_supported, type_size)

TYPES = sorted(SUPPORTED_TYPES)


def plugin_registry() -> Registry:
    """A registry holding just this plugin, loaded through the hook as the entry point would be."""
    plugins = PluginSet()
    plugins.add_module("gguf-kernels", "toolkit.kernels.gguf")
    return Registry(plugins)


@pytest.fixture(scope="module", autouse=True)
def gguf_ops_installed():
    """runtime.call finds the ops even where entry points are stale (install() skips duplicates)."""
    runtime.install(plugin_registry().kernels)


FLOAT_TYPES = {"F32", "F16", "BF16"}
# Byte offsets of each type's fp16 scale fields (ggml's block structs), set finite in random data.
FP16_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "IQ4_NL": (0,),
               "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
               "IQ4_XS": (0,), "TQ1_0": (52,), "TQ2_0": (64,), "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,),
               "IQ3_XXS": (0,), "IQ3_S": (0,), "IQ1_S": (0,)}


def qtype_of(name: str) -> GGMLQuantizationType:
    return GGMLQuantizationType[name]


def can_quantize(name: str) -> bool:
    try:
        quantize(np.zeros((1, GGML_QUANT_SIZES[qtype_of(name)][0]), np.float32), qtype_of(name))
    except NotImplementedError:
        return False
    return True


def quantized(name: str, rows: int, cols: int, rng) -> np.ndarray:
    """gguf-py's own quantization of normal values, as uint8 ``[rows, bytes_per_row]``."""
    packed = quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype_of(name))
    return np.ascontiguousarray(packed).view(np.uint8).reshape(rows, -1)


def random_blocks(name: str, rows: int, cols: int, rng, finite: bool = True) -> np.ndarray:
    """Random valid blocks; with ``finite``, scales are small finite numbers (no inf/NaN weights)."""
    if name in FLOAT_TYPES:
        return quantized(name, rows, cols, rng)
    size, nbytes = GGML_QUANT_SIZES[qtype_of(name)]
    blocks = rng.integers(0, 256, (rows * cols // size, nbytes), dtype=np.uint8)
    if finite:
        for offset in FP16_FIELDS.get(name, ()):
            scale = rng.uniform(-0.02, 0.02, (blocks.shape[0], 1)).astype(np.float16)
            blocks[:, offset:offset + 2] = scale.view(np.uint8)
        if name == "MXFP4":  # e8m0 exponent byte: keep 2**(e-128) near 1
            blocks[:, 0] = rng.integers(120, 132, blocks.shape[0])
        if name == "IQ1_M":  # fp16 scale spread over nibbles; its top one (sign, exponent) sits here
            blocks[:, 49] = (blocks[:, 49] & 0x0F) | 0x20
    return blocks.reshape(rows, -1)


def shapes(name: str) -> list[tuple[int, int]]:
    size = GGML_QUANT_SIZES[qtype_of(name)][0]
    return [(1, size), (3, 2 * size), (5, max(512, 3 * size))] if size > 1 else [(1, 1), (4, 96), (3, 512)]


def oracle(packed: np.ndarray, name: str) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(dequantize(packed, qtype_of(name)), dtype=np.float32))


def assert_bit_equal(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.dtype == expected.dtype and got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("name", TYPES)
def test_dequantize_random_blocks_bit_exact(name):
    rng = np.random.default_rng(1)
    for rows, cols in shapes(name):
        packed = random_blocks(name, rows, cols, rng)
        expected = oracle(packed, name)
        got = gguf_dequantize(torch.from_numpy(packed), int(qtype_of(name)), cols, torch.float32)
        assert_bit_equal(got, expected)
        assert_bit_equal(gguf_dequantize(torch.from_numpy(packed), int(qtype_of(name)), cols, torch.bfloat16),
                         expected.to(torch.bfloat16))


@pytest.mark.parametrize("name", [n for n in TYPES if n not in FLOAT_TYPES])
def test_dequantize_any_bytes_matches(name):
    """Every byte pattern, including inf/NaN scales, decodes as gguf-py decodes it."""
    cols = 2 * block_size(qtype_of(name))
    packed = random_blocks(name, 4, cols, np.random.default_rng(2), finite=False)
    assert packed.shape[1] == 2 * type_size(qtype_of(name))
    got = gguf_dequantize(torch.from_numpy(packed), int(qtype_of(name)), cols, torch.float32)
    assert_bit_equal(got, oracle(packed, name))


@pytest.mark.parametrize("name", [n for n in TYPES if can_quantize(n)])
def test_dequantize_gguf_quantized_bit_exact(name):
    rng = np.random.default_rng(3)
    for rows, cols in shapes(name):
        packed = quantized(name, rows, cols, rng)
        got = gguf_dequantize(torch.from_numpy(packed), int(qtype_of(name)), cols, torch.float32)
        assert_bit_equal(got, oracle(packed, name))


@pytest.mark.parametrize("name", TYPES)
def test_matmul_matches_numpy(name):
    rng = np.random.default_rng(4)
    rows, cols = 6, max(256, GGML_QUANT_SIZES[qtype_of(name)][0])
    packed = random_blocks(name, rows, cols, rng)
    x = rng.standard_normal((5, cols)).astype(np.float32)
    expected = torch.from_numpy(x @ dequantize(packed, qtype_of(name)).T)
    got = gguf_matmul(torch.from_numpy(x), torch.from_numpy(packed), int(qtype_of(name)), cols)
    # float32 sums in a different order: error far below 1e-5 of the magnitude of the terms
    scale = torch.from_numpy(np.abs(x) @ np.abs(dequantize(packed, qtype_of(name))).T)
    assert got.dtype == torch.float32 and got.shape == (5, rows)
    assert ((got - expected).abs() <= 1e-5 * scale + 1e-30).all()


@pytest.mark.parametrize("name", ["Q8_0", "Q5_0", "Q4_K", "Q6_K", "IQ4_XS", "F16"])
@pytest.mark.parametrize("chunk_elements", [1, 600, 1 << 20])  # one row, a ragged split, one chunk
def test_cpu_chunked_matmul_matches_numpy(name, chunk_elements, monkeypatch):
    """The CPU op walks the rows in chunks; every chunking gives numpy's product (any batch shape)."""
    from toolkit.kernels.gguf import cpu  # noqa: PLC0415

    monkeypatch.setattr(cpu, "CHUNK_ELEMENTS", chunk_elements)
    rng = np.random.default_rng(8)
    rows, cols = 7, 256
    packed = random_blocks(name, rows, cols, rng)
    weight = dequantize(packed, qtype_of(name))
    x = rng.standard_normal((2, 3, cols)).astype(np.float32)
    got = cpu.gguf_matmul_chunked(torch.from_numpy(x), torch.from_numpy(packed), int(qtype_of(name)), cols)
    scale = torch.from_numpy(np.abs(x) @ np.abs(weight).T)
    assert got.dtype == torch.float32 and got.shape == (2, 3, rows)
    assert ((got - torch.from_numpy(x @ weight.T)).abs() <= 1e-5 * scale + 1e-30).all()
    as_bf16 = cpu.gguf_matmul_chunked(torch.from_numpy(x).bfloat16(), torch.from_numpy(packed),
                                      int(qtype_of(name)), cols)
    assert as_bf16.dtype == torch.bfloat16 and ((as_bf16.float() - got).abs() <= 2e-2 * scale + 1e-30).all()
    # above the reference on CPU; the compiled kernels (gguf_cpu, when installed) take float32
    # activations and decline 16-bit ones, which come here
    assert runtime.resolve("gguf_matmul", torch.zeros(1, cols, dtype=torch.bfloat16), torch.from_numpy(packed), 8,
                           cols) is cpu.gguf_matmul_chunked


@pytest.mark.parametrize("name", ["Q8_0", "Q4_K", "Q6_K", "IQ4_NL", "F16"])
def test_embedding_unpacks_looked_up_rows(name):
    rng = np.random.default_rng(5)
    cols = 256
    packed = random_blocks(name, 10, cols, rng)
    ids = torch.tensor([[3, 0, 9], [3, 3, 1]])
    got = gguf_embedding(ids, torch.from_numpy(packed), int(qtype_of(name)), cols, torch.float32)
    assert_bit_equal(got, oracle(packed, name)[ids])


def test_float_reinterpretation_keeps_values():
    values = np.random.default_rng(6).standard_normal((3, 8)).astype(np.float32)
    got = gguf_dequantize(torch.from_numpy(values.view(np.uint8).reshape(3, -1)), 0, 8, torch.float32)
    assert torch.equal(got, torch.from_numpy(values))


@pytest.mark.parametrize("qtype, name", [(15, "Q8_K"), (9, "Q8_1"), (24, "I8"), (999, "999")])
def test_unsupported_type_names_the_type(qtype, name):
    assert not is_supported(qtype)
    data = torch.zeros(2, 64, dtype=torch.uint8)
    for op, args in (("gguf_dequantize", (data, qtype, 256, torch.float32)),
                     ("gguf_matmul", (torch.zeros(1, 256), data, qtype, 256)),
                     ("gguf_embedding", (torch.tensor([0]), data, qtype, 256, torch.float32))):
        with pytest.raises(UnsupportedQuantTypeError, match=name):
            runtime.call(op, *args)


def test_wrong_row_bytes_is_a_shape_error():
    with pytest.raises(ShapeMismatchError, match="Q4_K"):
        gguf_dequantize(torch.zeros(2, 100, dtype=torch.uint8), int(GGMLQuantizationType.Q4_K), 256, torch.float32)
    with pytest.raises(ShapeMismatchError, match="Q8_0"):
        gguf_dequantize(torch.zeros(2, 34, dtype=torch.uint8), int(GGMLQuantizationType.Q8_0), 40, torch.float32)


def test_helpers_and_registration():
    assert (block_size(12), type_size(12)) == GGML_QUANT_SIZES[GGMLQuantizationType.Q4_K]
    assert {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
            "Q6_K", "IQ4_NL", "IQ4_XS"} <= SUPPORTED_TYPES
    registered = {(op, device): fn for op, fn, device, _, _ in plugin_registry().kernels}
    for op, fn in (("gguf_dequantize", gguf_dequantize), ("gguf_matmul", gguf_matmul),
                   ("gguf_embedding", gguf_embedding)):
        assert registered[(op, "any")] is fn
        assert runtime.reference(op) is fn


# --- GPU: Triton kernels against the torch reference -------------------------------------------

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def triton_types() -> list[str]:
    if not torch.cuda.is_available():
        return ["Q8_0"]  # keeps the parametrized ids; skipped anyway
    from toolkit.kernels.gguf.triton_ops import TRITON_TYPES
    return sorted(TRITON_TYPES)


def cuda_case(name: str, rows: int, cols: int, seed: int):
    packed = torch.from_numpy(random_blocks(name, rows, cols, np.random.default_rng(seed))).cuda()
    return packed, int(qtype_of(name))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("name", triton_types())
def test_triton_dequantize_matches_reference(name):
    from toolkit.kernels.gguf import triton_ops
    for rows, cols in ((33, 256), (64, 768), (5, 2048)):
        packed, qtype = cuda_case(name, rows, cols, 7)
        assert triton_ops.gguf_dequantize.supports(packed, qtype, cols, torch.float32)
        expected = gguf_dequantize(packed, qtype, cols, torch.float32)
        got = triton_ops.gguf_dequantize(packed, qtype, cols, torch.float32)
        # ggml's float32 formula, but the compiler may fuse d * q - m into one FMA: one rounding
        # fewer, an ulp of d * q, which is at most twice the largest |w| (q = 0 occurs: |m| <= max|w|)
        atol = 2 ** -21 * expected.abs().max().item()
        torch.testing.assert_close(got, expected, rtol=2e-7, atol=atol)
        got16 = triton_ops.gguf_dequantize(packed, qtype, cols, torch.bfloat16)
        torch.testing.assert_close(got16.float(), expected, rtol=2 ** -8, atol=atol)
        ids = torch.tensor([rows - 1, 0, rows // 2, 0], device="cuda")
        torch.testing.assert_close(runtime.call("gguf_embedding", ids, packed, qtype, cols, torch.float32),
                                   expected[ids], rtol=2e-7, atol=atol)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("name", triton_types())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_matmul_within_rounding_bound(name, dtype):
    """|y - exact| <= 3u * sum_k |x_k w_k|, u the unit roundoff of ``dtype``: W is rounded to
    ``dtype`` once (<= u per product), the output once (<= u of |y| <= the sum), and float32
    accumulation adds ~K * 2**-24, well inside the third u. x is already in ``dtype``."""
    from toolkit.kernels.gguf import triton_ops
    unit = {torch.bfloat16: 2 ** -8, torch.float16: 2 ** -11}[dtype]
    rows, cols = 96, 1024
    packed, qtype = cuda_case(name, rows, cols, 8)
    weight = gguf_dequantize(packed, qtype, cols, torch.float32)
    for tokens in (1, 3, 8, 16, 17, 64, 65, 100):
        x = torch.randn(tokens, cols, device="cuda").to(dtype)
        assert runtime.resolve("gguf_matmul", x, packed, qtype, cols) is triton_ops.gguf_matmul
        got = runtime.call("gguf_matmul", x, packed, qtype, cols)
        assert got.dtype == dtype and got.shape == (tokens, rows)
        exact = x.double() @ weight.double().T
        bound = x.double().abs() @ weight.double().abs().T
        if triton_ops.int8_activations(qtype, cols, tokens, packed):  # 8-bit activations (dp4a, mmq)
            bound = 3 * unit * bound + activation_rounding_bound(x, weight)
        else:
            bound = 3 * unit * bound
        assert ((got.double() - exact).abs() <= bound).all(), (name, tokens)
        if tokens in (1, 8):  # the other kernel variants: split K, element-wise tiles, wide tiles
            for config, split, words in ((triton_ops.DECODE_CONFIG, 2, False), (triton_ops.SMALL_BATCH_CONFIG, 2, False),
                                         (triton_ops.MatmulConfig(1, 8, 512), None, True),
                                         (triton_ops.MatmulConfig(16, 16, 512), 2, True)):
                other = triton_ops.fused_matmul(x, packed, qtype, cols, config, split=split, words=words)
                assert ((other.double() - exact).abs() <= 3 * unit * (x.double().abs() @ weight.double().abs().T)).all(), \
                    (name, tokens, config)


def activation_rounding_bound(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """What rounding x to int8 blocks of 32 (scale d = max|x_block| / 127, |x - d q| <= d / 2) can
    move ``x @ W.T`` by, per output: sum over blocks of d / 2 * sum |w| (1% slack for the float32
    scale and reciprocal). ``x [T, K]``, ``weight [N, K]`` -> ``[T, N]``."""
    half_step = x.double().reshape(x.shape[0], -1, 32).abs().amax(2) / 127 / 2           # [T, K / 32]
    per_block = weight.double().abs().reshape(weight.shape[0], -1, 32).sum(2)             # [N, K / 32]
    return 1.01 * half_step @ per_block.T


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("name", ["Q4_0", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"])
def test_tokens_gemv_within_activation_rounding(name):
    """The token-unrolled dp4a GEMV (triton_gemv_tokens) against float64 on the dequantized weight:
    within the activation rounding bound for 1 to the most tokens gguf_matmul sends it (4 or 8), rows off the
    program size, several launches (with programmatic dependent launch on an H100: ``kernels/triton_pdl``).
    Larger token counts are not dispatched, and their 8-token Q6_K kernels alone take ~25 s to compile."""
    from toolkit.kernels.gguf import gemv_launch, triton_ops
    configs = (None, triton_ops.GemvConfig(bn=2, bk=256, split=2, num_warps=2),   # one to eight steps per program
               triton_ops.GemvConfig(bn=1, bk=256, split=1, num_warps=1),
               *{rule.config for rules in gemv_launch.SHAPE_RULES.values() for rule in rules})  # by weight shape
    for rows, cols in ((37, 1024), (130, 2048), (3, 256)):
        packed, qtype = cuda_case(name, rows, cols, 17)
        weight = gguf_dequantize(packed, qtype, cols, torch.float32)
        for tokens in (1, 3, triton_ops.TOKENS_MAX_TOKENS[name]):
            x = torch.randn(tokens, cols, device="cuda").to(torch.bfloat16)
            exact = x.double() @ weight.double().T
            bound = 3 * 2 ** -8 * (x.double().abs() @ weight.double().abs().T) + activation_rounding_bound(x, weight)
            for config in configs:
                got = triton_ops.dp4a_tokens_matmul(x, packed, qtype, cols, config)
                assert got.shape == (tokens, rows) and got.dtype == torch.bfloat16
                assert ((got.double() - exact).abs() <= bound).all(), (name, rows, cols, tokens, config)
    zero = torch.zeros(2, 256, device="cuda", dtype=torch.bfloat16)   # all-zero blocks: scale 0, no NaN
    packed, qtype = cuda_case(name, 8, 256, 12)
    assert torch.equal(triton_ops.dp4a_tokens_matmul(zero, packed, qtype, 256),
                       torch.zeros(2, 8, device="cuda", dtype=torch.bfloat16))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["Q4_0", "Q8_0", "Q4_K", "Q6_K"])
def test_dot16_within_weight_rounding(name, dtype):
    """The 16-bit tensor-core kernel (triton_dot16) against float64 on the dequantized weight (the Triton
    dequantizer, bit-equal to gguf-py's above): each weight rounded once to x's dtype, float32 sums, the
    result in x's dtype. Rows and tokens off the tile sizes, several launches (the default ones by type and
    tokens, ``DOT16_RULES``, among them); and gguf_matmul sends it 17-64 tokens."""
    from toolkit.kernels.gguf import dot16_ops, triton_ops
    eps = 2 ** -8 if dtype == torch.bfloat16 else 2 ** -10
    # 8192 columns: Q6_K's launch rule at 33-64 tokens; 8200 rows: a tall weight (row tiles over several waves)
    for rows, cols in ((37, 512), (130, 2048), (66, 8192), (8200, 512)):
        packed, qtype = cuda_case(name, rows, cols, 17)
        weight = gguf_dequantize(packed, qtype, cols, torch.float32).double()
        for tokens in (17, 33, 64):
            x = torch.randn(tokens, cols, device="cuda").to(dtype)
            exact = x.double() @ weight.T
            bound = eps * (x.double().abs() @ weight.abs().T + exact.abs())
            for bm, bn, warps, stages, split in ((None, None, None, None, None), (16, 64, 4, 2, 1),
                                                 (32, 128, 8, 3, 2), (64, 64, 4, 4, 4)):
                got = dot16_ops.dot16_matmul(x, packed, qtype, cols, bm=bm, bn=bn, num_warps=warps,
                                             num_stages=stages, split=split)
                assert got.shape == (tokens, rows) and got.dtype == dtype
                assert ((got.double() - exact).abs() <= bound).all(), (name, rows, cols, tokens, bm, bn, split)
            assert dot16_ops.dot16_takes(packed, qtype, cols, tokens)
            assert torch.equal(triton_ops.gguf_matmul(x, packed, qtype, cols),
                               dot16_ops.dot16_matmul(x, packed, qtype, cols))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("name", ["Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"])
def test_mmq_within_activation_rounding(name):
    """The int8 tensor-core kernel (triton_mmq) against float64 on the dequantized weight: within the
    activation rounding bound, for row and token counts off the tile sizes and several tile shapes."""
    from toolkit.kernels.gguf import triton_ops
    for rows, cols in ((37, 512), (130, 2048), (64, 256)):
        packed, qtype = cuda_case(name, rows, cols, 13)
        weight = gguf_dequantize(packed, qtype, cols, torch.float32)
        for tokens in (2, 5, 16, 33, 64):
            x = torch.randn(tokens, cols, device="cuda").to(torch.bfloat16)
            exact = x.double() @ weight.double().T
            bound = 3 * 2 ** -8 * (x.double().abs() @ weight.double().abs().T) + activation_rounding_bound(x, weight)
            for bm, bn, warps, split, stages in ((None, 64, 4, None, 2), (16, 32, 4, 1, 3), (32, 128, 8, 2, 2),
                                                 (64, 16, 4, 3, 2), (16, 16, 1, 4, 4)):
                got = triton_ops.mmq_matmul(x, packed, qtype, cols, bm=bm, bn=bn, num_warps=warps, split=split,
                                            num_stages=stages)
                assert got.shape == (tokens, rows) and got.dtype == torch.bfloat16
                assert ((got.double() - exact).abs() <= bound).all(), (name, rows, cols, tokens, bm, bn, split)
