"""The int8 tensor-core GGUF kernels compile for an H100 (sm_90) as their wrappers launch them, without a
GPU (Triton compiles ahead of time with its bundled ptxas): the grouped MoE kernel (``gguf_moe_mmq_kernel``)
for every type at its launch (``MMQ_ROUTE``) with route blocks of 16 and 64, and the dense ``mmq_kernel``
for Q5_K (new to ``mmq_tile``). test_gguf_mmq_triton.py checks their arithmetic in the interpreter; this
checks what the interpreter cannot (int8 dot layouts, shared memory). Runs in a subprocess, so that file's
interpreter switch does not reach it. Skipped where Triton is not installed (CI); slow (~30 s compiling)."""
from __future__ import annotations

import importlib.util
import textwrap

import pytest

from triton_interpreter import compile_in_fresh_process

pytestmark = pytest.mark.slow

H100_SHARED_BYTES = 232448  # the opt-in maximum of shared memory per block on sm_90

SCRIPT = textwrap.dedent("""
    import json
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from toolkit.kernels.gguf import triton_mmq
    from toolkit.kernels.gguf.types import type_size
    from toolkit.kernels.gguf_moe import triton_moe

    TYPES = {"Q4_0": 2, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
    POINTERS = {"xq_ptr": "*i8", "w_ptr": "*u8", "out_ptr": "*bf16", "route_ptr": "*i32", "block_expert_ptr": "*i32"}

    def compile_one(fn, constexprs, num_warps, num_stages):
        def type_of(name):
            if name in constexprs:
                return "constexpr"
            return POINTERS.get(name, "*fp32" if name.endswith("_ptr") else "i32")
        signature = {name: type_of(name) for name in fn.arg_names}
        kernel = triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", 90, 32),
                                options={"num_warps": num_warps, "num_stages": num_stages})
        return {"kernel": fn.__name__, "constexprs": constexprs, "shared": kernel.metadata.shared}

    results = []
    for name, qtype in TYPES.items():
        bn, warps, stages = triton_moe.MMQ_ROUTE.get(name, triton_moe.MMQ_ROUTE["default"])
        for bm, per_route in ((16, False), (64, True)):
            results.append(compile_one(triton_moe.gguf_moe_mmq_kernel, {
                "K": 768 if per_route else 2048, "TOP_K": 8, "PER_ROUTE_X": per_route, "MUL_WEIGHT": per_route,
                "QTYPE": qtype, "TS": type_size(qtype), "BM": bm, "BN": bn}, warps, stages))
    for rows_first in (False, True):
        results.append(compile_one(triton_mmq.mmq_kernel, {"QTYPE": 13, "TS": type_size(13), "BM": 16, "BN": 32,
                                                           "EVICT": "evict_first", "ROWS_FIRST": rows_first}, 2, 3))
    print(json.dumps(results))
""")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_mmq_kernels_compile_for_sm90_within_shared_memory():
    results = compile_in_fresh_process(SCRIPT)
    assert len(results) == 12
    for result in results:
        assert result["shared"] <= H100_SHARED_BYTES, result
