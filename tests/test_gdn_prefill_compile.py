"""The Gated DeltaNet prefill Triton kernels compile for an H100 (sm_90) as the wrappers launch them,
without a GPU: Triton compiles ahead of time to a cubin with its bundled ptxas. The interpreter
tests (test_gdn_prefill_triton.py) check the arithmetic, this checks what the interpreter cannot:
that the kernels lower (dot shapes, layouts, loops with loaded bounds) and that each launch fits in
an H100's shared memory. Runs in a subprocess, so the interpreter switch of the other file does
not reach it. Skipped where Triton is not installed (CI); slow (about a minute of compiling)."""
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
    from toolkit.kernels.recurrent import triton_prefill as tp

    POINTERS = {"qsl_ptr": "*i32", "seq_of_ptr": "*i32", "chunk_seq_ptr": "*i32", "chunk_first_ptr": "*i32",
                "slots_ptr": "*i64", "fresh_ptr": "*i8"}
    FLOAT32 = {"w_ptr", "u_ptr", "gcum_ptr", "g_ptr", "beta_ptr", "state_ptr"}

    def compile_one(fn, dtype, constexprs, num_warps, num_stages):
        def type_of(name):
            if name in constexprs:
                return "constexpr"
            if name in POINTERS:
                return POINTERS[name]
            if name.endswith("_ptr"):
                return "*fp32" if fn.__name__.startswith("_gdr") and name in FLOAT32 else "*" + dtype
            return "fp32" if name == "scale" else "i32"
        signature = {name: type_of(name) for name in fn.arg_names}
        kernel = triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", 90, 32),
                                options={"num_warps": num_warps, "num_stages": num_stages})
        return {"kernel": fn.__name__, "dtype": dtype, "shared": kernel.metadata.shared}

    results = []
    for dtype, precision in (("bf16", "tf32"), ("fp32", "tf32x3")):
        dims = {"BDK": 128, "PRECISION": precision}
        results.append(compile_one(tp._gdr_chunk_prep, dtype, {**dims, "BDV": 128}, tp.PREP_WARPS, 1))
        results.append(compile_one(tp._gdr_chunk_scan, dtype, {**dims, "BT": tp.CHUNK, "BV": tp.SCAN_BLOCK_V,
                                                               "HAS_STATE": True}, tp.SCAN_WARPS, tp.SCAN_STAGES))
        results.append(compile_one(tp._conv_prefill_kernel, dtype, {
            "WIDTH": 4, "BLOCK_T": tp.CONV_BLOCK_T, "BLOCK_C": tp.CONV_BLOCK_C, "HAS_STATE": True,
            "HAS_BIAS": False, "ACTIVATION": True}, 4, 3))
        results.append(compile_one(tp._conv_state_kernel, dtype, {
            "WIDTH": 4, "BLOCK_C": tp.CONV_STATE_BLOCK_C, "BLOCK_W": 4}, 4, 3))
    print(json.dumps(results))
""")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_prefill_kernels_compile_for_sm90_within_shared_memory():
    results = compile_in_fresh_process(SCRIPT)
    assert len(results) == 8
    for result in results:
        assert result["shared"] <= H100_SHARED_BYTES, result
