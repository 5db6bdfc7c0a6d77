"""Compiled CPU GGUF kernels (toolkit/kernels/gguf_cpu) against gguf-py, the independent oracle.

``gguf_matmul`` is compared with gguf-py's ``gguf.quants.dequantize`` followed by a float64
matmul. The kernels accumulate in float32 in their own order, so the allowed error is a float32
summation bound: ``TOL * (|x| @ |W|.T)`` element by element. The GEMV's default 8-bit-activation
path is checked twice: against ``x_hat @ W.T`` in float64, with ``x_hat`` the test's own
per-32-block rounding of x (same float32 bound), and against ``x @ W.T`` within the
activation-rounding bound ``|W| @ (d / 2)``, d = max|x| / 127 per block. ``gguf_dequantize`` must
be bit-identical. The first test in a fresh environment compiles the extension (~20 s, once).
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from test_gguf_kernels import quantized, random_blocks

from toolkit.core.plugins import PluginSet
from toolkit.core.registry import Registry
from toolkit.kernels import runtime
from toolkit.kernels.gguf.cpu import gguf_matmul_chunked
from toolkit.kernels.gguf_cpu import HANDLED, build, gguf_dequantize_native, gguf_matmul_native, ops

TYPES = sorted(HANDLED)
GGUF_QUANTIZES = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"}  # gguf-py can make these from floats
TOL = 2e-6 * 32  # a few float32 ulps per 32-element partial sum (cols here <= 768)


@pytest.fixture(scope="module", autouse=True)
def compiled():
    """Both GGUF kernel plugins installed, and the extension built (skip where it cannot be)."""
    plugins = PluginSet()
    plugins.add_module("gguf-kernels", "toolkit.kernels.gguf")
    plugins.add_module("gguf-cpu-kernels", "toolkit.kernels.gguf_cpu")
    runtime.install(Registry(plugins).kernels)
    if build.extension() is None:
        pytest.skip("no C++ toolchain here: the compiled kernels cannot be built")


@pytest.fixture(autouse=True)
def float32_activations(monkeypatch):
    """The float32 GEMV unless a test asks for 8-bit activations (TOOLKIT_GGUF_CPU_INT8)."""
    monkeypatch.setattr(ops, "INT8_ACTIVATIONS", False)


def packed_and_oracle(name: str, rows: int, cols: int, rng) -> tuple[np.ndarray, torch.Tensor]:
    packed = quantized(name, rows, cols, rng) if name in GGUF_QUANTIZES and rows % 2 else random_blocks(
        name, rows, cols, rng)
    weight = torch.from_numpy(np.ascontiguousarray(dequantize(packed, GGMLQuantizationType[name]), np.float32))
    return packed, weight


def assert_matmul_close(got: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    expected = x.double() @ weight.double().T
    bound = TOL * (x.double().abs() @ weight.double().abs().T) + 1e-30
    error = (got.double() - expected).abs()
    assert got.dtype == x.dtype and got.shape == expected.shape
    assert bool((error <= bound).all()), f"max error / bound {float((error / bound).max()):.2f}"


@pytest.mark.parametrize("name", TYPES)
def test_matmul_matches_gguf_py(name):
    rng = np.random.default_rng(HANDLED[name])
    block = 256 if name.endswith("_K") else 32
    for rows, cols, tokens in [(7, block, 1), (33, 2 * block, 2), (5, 3 * block, 5), (130, block, 33),
                               (3, block, 4), (1, 2 * block, 3)]:
        packed, weight = packed_and_oracle(name, rows, cols, rng)
        x = torch.randn(tokens, cols, generator=torch.Generator().manual_seed(rows))
        got = gguf_matmul_native(x, torch.from_numpy(packed), HANDLED[name], cols)
        assert_matmul_close(got, x, weight)


def rounded_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_hat, d) per element: x rounded to d * round(x / d) per 32-element block, d = max|x| / 127."""
    blocks = x.double().reshape(*x.shape[:-1], -1, 32)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    q = torch.where(d > 0, blocks / torch.where(d > 0, d, 1), 0).round().clamp(-127, 127)
    return (q * d).reshape(x.shape), d.expand_as(blocks).reshape(x.shape)


@pytest.mark.parametrize("name", TYPES)
def test_int8_activation_gemv_within_rounding_bound(name, monkeypatch):
    monkeypatch.setattr(ops, "INT8_ACTIVATIONS", True)
    rng = np.random.default_rng(20 + HANDLED[name])
    block = 256 if name.endswith("_K") else 32
    for rows, cols, tokens in [(7, block, 1), (33, 2 * block, 2), (5, 3 * block, 3), (3, block, 4)]:
        packed, weight = packed_and_oracle(name, rows, cols, rng)
        x = torch.randn(tokens, cols, generator=torch.Generator().manual_seed(rows)) * 3
        if cols > 32:
            x[0, :32] = 0  # an all-zero block (d = 0)
        got = gguf_matmul_native(x, torch.from_numpy(packed), HANDLED[name], cols)
        x_hat, d = rounded_activations(x)
        assert_matmul_close(got.double(), x_hat, weight)  # the integer path is exact on x_hat
        error = (got.double() - x.double() @ weight.double().T).abs()
        float_bound = TOL * (x.double().abs() @ weight.double().abs().T)
        assert bool((error.T <= weight.double().abs() @ (d / 2).T + float_bound.T).all())
        assert bool((error > float_bound).any())  # the activations really were rounded


@pytest.mark.parametrize("name", TYPES)
def test_int8_gemm_within_rounding_bound(name, monkeypatch):
    """More than GEMV_MAX_ROWS tokens: the packed int8 GEMM (gemm.h) on AVX2 builds, the same two
    checks as the GEMV (exact on x_hat up to float32 order; x within the rounding bound). Odd row
    counts leave partial row tiles, token counts partial micro-tiles and a second token block; two
    threads split the rows."""
    monkeypatch.setattr(ops, "INT8_ACTIVATIONS", True)
    if "avx2" not in build.extension().isa():
        pytest.skip("no AVX2: many-token calls use the dequantized-tile float GEMM")
    rng = np.random.default_rng(40 + HANDLED[name])
    block = 256 if name.endswith("_K") else 32
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    build.extension().set_gemm_chunk(1)  # one 8-row tile per chunk: both threads claim chunks of every matrix
    try:
        for rows, cols, tokens in [(7, block, 5), (33, 2 * block, 16), (5, 3 * block, 33), (67, block, 128)]:
            packed, weight = packed_and_oracle(name, rows, cols, rng)
            x = torch.randn(tokens, cols, generator=torch.Generator().manual_seed(rows)) * 3
            if cols > 32:
                x[1, 32:64] = 0  # an all-zero block (d = 0)
            got = gguf_matmul_native(x, torch.from_numpy(packed), HANDLED[name], cols)
            x_hat, d = rounded_activations(x)
            assert_matmul_close(got.double(), x_hat, weight)
            error = (got.double() - x.double() @ weight.double().T).abs()
            float_bound = TOL * (x.double().abs() @ weight.double().abs().T)
            assert bool((error.T <= weight.double().abs() @ (d / 2).T + float_bound.T).all())
            assert bool((error > float_bound).any())  # the activations really were rounded
    finally:
        torch.set_num_threads(previous)
        build.extension().set_gemm_chunk(1 << 21)


# Packed bytes that decode to the largest |value| of each type, all of one sign (the fp16 and
# K-quant scale fields left as random_blocks made them): (first byte, end byte, fill) per block.
EXTREME_FILL = {"Q8_0": (2, 34, 0x80), "Q4_0": (2, 18, 0x00), "Q4_1": (4, 20, 0xFF), "Q5_0": (2, 22, 0x00),
                "Q5_1": (4, 24, 0xFF), "Q4_K": (16, 144, 0xFF), "Q5_K": (16, 176, 0xFF), "Q6_K": (0, 192, 0x00)}


@pytest.mark.parametrize("name", TYPES)
def test_int8_gemm_extreme_values_do_not_overflow(name, monkeypatch):
    """The GEMM adds several maddubs pair sums in int16 before widening (gemm.h, groups16): with
    every weight at its type's largest magnitude and every activation at +127 after rounding, all
    products share one sign and those sums reach their bound. gguf-py's dequantization is the oracle."""
    monkeypatch.setattr(ops, "INT8_ACTIVATIONS", True)
    if "avx2" not in build.extension().isa():
        pytest.skip("no AVX2: many-token calls use the dequantized-tile float GEMM")
    block = 256 if name.endswith("_K") else 32
    rows, cols, tokens = 9, 2 * block, 6
    packed = random_blocks(name, rows, cols, np.random.default_rng(60 + HANDLED[name]))
    first, end, fill = EXTREME_FILL[name]
    blocks = packed.reshape(rows * cols // block, -1)
    blocks[:, first:end] = fill
    weight = torch.from_numpy(np.ascontiguousarray(dequantize(packed, GGMLQuantizationType[name]), np.float32))
    x = torch.full((tokens, cols), 0.5)  # every block's max: rounds to exactly 127
    got = gguf_matmul_native(x, torch.from_numpy(packed), HANDLED[name], cols)
    assert_matmul_close(got, x, weight)  # x is exact on the int8 grid here (x_hat == x)


@pytest.mark.parametrize("name", TYPES)
def test_dequantize_bit_exact(name):
    rng = np.random.default_rng(10 + HANDLED[name])
    packed, weight = packed_and_oracle(name, 9, 512, rng)
    got = gguf_dequantize_native(torch.from_numpy(packed), HANDLED[name], 512, torch.float32)
    torch.testing.assert_close(got, weight, rtol=0, atol=0)


def test_rows_split_over_threads_and_row_slices():
    """Two threads split the rows (an odd count, chunks of uneven size); a row slice of a
    bigger tensor (what a fused layer's segment passes) reads the right bytes; 3-D input keeps
    its shape."""
    rng = np.random.default_rng(5)
    packed, weight = packed_and_oracle("Q6_K", 601, 256, rng)
    data = torch.from_numpy(packed)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for tokens in (1, 4, 6):
            x = torch.randn(tokens, 256)
            assert_matmul_close(gguf_matmul_native(x, data, HANDLED["Q6_K"], 256), x, weight)
        x = torch.randn(2, 1, 256)
        got = gguf_matmul_native(x, data[100:301], HANDLED["Q6_K"], 256)
        assert got.shape == (2, 1, 201)
        assert_matmul_close(got.reshape(2, 201), x.reshape(2, 256), weight[100:301])
    finally:
        torch.set_num_threads(previous)


@pytest.mark.skipif(not getattr(torch._C, "has_openmp", False), reason="torch without OpenMP")
def test_parallel_for_really_uses_the_threads():
    """The extension is built with OpenMP: without it at::parallel_for ran every kernel on one thread."""
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert build.extension().parallel_threads() == 2
    finally:
        torch.set_num_threads(previous)


def test_decode_gemv_pool_uses_torch_threads():
    """The help-first pool of the decode GEMVs (pool.h) runs on torch.get_num_threads() threads."""
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert build.extension().pool_threads_used(32768, 640) == 2
        torch.set_num_threads(1)
        assert build.extension().pool_threads_used(32768, 640) == 1
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("int8", [False, True])
def test_pool_gemv_same_bits_on_any_threads_and_concurrent_callers(monkeypatch, int8):
    """Each output row is computed by one thread in a fixed order, so the pool's split changes no
    bit: 1 thread, 2 threads, and 3 Python threads calling at once (the GIL is released; only one
    caller gets the pool, the others run alone) all give the same result."""
    import threading  # noqa: PLC0415

    monkeypatch.setattr(ops, "INT8_ACTIVATIONS", int8)
    packed, weight = packed_and_oracle("Q4_K", 1500, 512, np.random.default_rng(11))
    data = torch.from_numpy(packed)
    xs = [torch.randn(m, 512, generator=torch.Generator().manual_seed(m)) for m in (1, 2, 4)]
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = [gguf_matmul_native(x, data, HANDLED["Q4_K"], 512) for x in xs]
        torch.set_num_threads(2)
        for x, expected in zip(xs, alone):
            assert torch.equal(gguf_matmul_native(x, data, HANDLED["Q4_K"], 512), expected)
        results: dict[tuple[int, int], torch.Tensor] = {}

        def worker(index: int) -> None:
            for repeat in range(20):
                results[index, repeat] = gguf_matmul_native(xs[index], data, HANDLED["Q4_K"], 512)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert all(torch.equal(got, alone[index]) for (index, _), got in results.items())
        assert len(results) == 60
    finally:
        torch.set_num_threads(previous)
    if not int8:
        assert_matmul_close(alone[0], xs[0], weight)


def test_registry_picks_the_compiled_op_on_cpu():
    packed, _ = packed_and_oracle("Q8_0", 4, 64, np.random.default_rng(6))
    x = torch.randn(1, 64)
    assert runtime.resolve("gguf_matmul", x, torch.from_numpy(packed), HANDLED["Q8_0"], 64) is gguf_matmul_native
    # 16-bit activations keep the reference's contract (weights rounded to x.dtype): torch path
    assert runtime.resolve("gguf_matmul", x.bfloat16(), torch.from_numpy(packed), HANDLED["Q8_0"],
                           64) is gguf_matmul_chunked
    # a type the extension does not decode goes to the chunked torch path
    iq4 = random_blocks("IQ4_NL", 4, 64, np.random.default_rng(7))
    iq4_type = int(GGMLQuantizationType.IQ4_NL)
    assert runtime.resolve("gguf_matmul", x, torch.from_numpy(iq4), iq4_type, 64) is gguf_matmul_chunked


def test_failed_build_warns_once_and_falls_back(tmp_path, monkeypatch):
    broken = tmp_path / "broken.cpp"
    broken.write_text("#error forced failure for the fallback test\n")
    monkeypatch.setattr(build, "SOURCES", [broken])
    monkeypatch.setenv("TOOLKIT_KERNEL_CACHE", str(tmp_path / "cache"))
    build.reset()
    try:
        packed, weight = packed_and_oracle("Q8_0", 4, 64, np.random.default_rng(8))
        x = torch.randn(1, 64)
        with pytest.warns(RuntimeWarning, match="compiled CPU GGUF kernels unavailable"):
            chosen = runtime.resolve("gguf_matmul", x, torch.from_numpy(packed), HANDLED["Q8_0"], 64)
        assert chosen is gguf_matmul_chunked
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the failure is remembered: no second warning, no rebuild
            assert runtime.resolve("gguf_matmul", x, torch.from_numpy(packed), HANDLED["Q8_0"], 64) is chosen
        assert_matmul_close(runtime.call("gguf_matmul", x, torch.from_numpy(packed), HANDLED["Q8_0"], 64), x, weight)
    finally:
        build.reset()


def test_build_key_tracks_cpu_and_compiler(monkeypatch):
    key = build.build_key()
    monkeypatch.setattr(build, "_cpu_flags", lambda: "flags : fpu sse2")
    assert build.build_key() != key
    monkeypatch.undo()
    monkeypatch.setattr(build, "_compiler_version", lambda: "g++ (other) 99")
    assert build.build_key() != key
