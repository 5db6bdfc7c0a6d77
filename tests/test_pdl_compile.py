"""The kernels of a decode step compile for an H100 (sm_90) with programmatic dependent launch
(``kernels/triton_pdl``), and keep its contract in the code ptxas receives: every kernel waits
(``griddepcontrol.wait``) before its first global store; the small kernels let the next kernel launch
only after that wait, the matmuls (which stream weights over the whole GPU) not at all; the GGUF GEMV
issues its first weight loads before the wait (the point of launching it early), the other kernels read
at most constants (norm weights, rotary frequencies) before it.

Compiled ahead of time without a GPU (Triton's bundled ptxas), in a subprocess so that an
interpreter switch set by another test file does not reach it. Whether the launches overlap and
stay correct on a GPU is checked by tests/test_gguf_kernels.py and tests/test_engine_gpu.py on an
H100, where PDL is on by default. Skipped where Triton is not installed (CI); slow (~20 s)."""
from __future__ import annotations

import importlib.util
import textwrap

import pytest

from triton_interpreter import compile_in_fresh_process

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import json
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from toolkit.kernels.attention.triton_decode import split_decode_kernel
    from toolkit.kernels.attention.triton_kernels import paged_attention_kernel
    from toolkit.kernels.fused.triton_kernels import gated_activation_kernel, rms_norm_kernel, rotary_heads_kernel
    from toolkit.kernels.gguf.triton_dp4a import quantize_activations_kernel
    from toolkit.kernels.gguf.triton_gemv_tokens import gemv_tokens_kernel
    from toolkit.kernels.gguf.triton_mmq import mmq_kernel
    from toolkit.kernels.triton_reduce import sum_middle_kernel

    POINTERS = {"xq_ptr": "*i32", "w_ptr": "*u8", "q_ptr": "*i8", "pos_ptr": "*i64", "slot_ptr": "*i64",
                "query_start_loc_ptr": "*i32", "seq_lens_ptr": "*i32", "block_tables_ptr": "*i32",
                "counts_ptr": "*i32", "acc_part_ptr": "*fp32", "ml_part_ptr": "*fp32"}
    FLOATS = ("eps", "offset", "scale", "softcap")
    BF16 = {"x_ptr", "res_ptr", "out_ptr", "q_ptr_bf16"}

    def ptx(fn, constexprs, num_warps, pointers=()):
        def type_of(name):
            if name in constexprs:
                return "constexpr"
            if name.endswith("_ptr"):
                return dict(POINTERS, **dict(pointers)).get(name, "*bf16" if name in BF16 else "*fp32")
            return "fp32" if name in FLOATS else "i32"
        signature = {name: type_of(name) for name in fn.arg_names}
        kernel = triton.compile(ASTSource(fn, signature, dict(constexprs, PDL=True)),
                                target=GPUTarget("cuda", 90, 32),
                                options={"num_warps": num_warps, "launch_pdl": True})
        return kernel.asm["ptx"]

    cases = {
        "gemv_tokens_kernel": ptx(gemv_tokens_kernel, {"QTYPE": 12, "TS": 144, "BM": 1, "BN": 1, "BK": 2048,
                                                       "DP4A": True, "EVICT": "evict_first"}, 1),
        # a sibling launch (kernels/sibling_launches.py): it waits only before its stores
        "gemv_tokens_kernel late": ptx(gemv_tokens_kernel, {"QTYPE": 12, "TS": 144, "BM": 1, "BN": 1, "BK": 2048,
                                                            "DP4A": True, "EVICT": "", "LATE_WAIT": True}, 1),
        "quantize_activations_kernel": ptx(quantize_activations_kernel, {"BK": 512, "SUMS": True}, 4),
        # as a decode step launches them: reading a projection's split-K partial sums (kernels/split_sums.py)
        "rms_norm_kernel": ptx(rms_norm_kernel, {"HAS_RESIDUAL": True, "HAS_OFFSET": False, "BLOCK": 2048,
                                                 "QUANT": True, "SUMS": False, "SPLITS": 8}, 16),
        "gated_activation_kernel": ptx(gated_activation_kernel, {"ACT": 0, "BLOCK": 1024, "QUANT": True,
                                                                 "SUMS": True, "SPLITS": 4}, 4,
                                       {"q_ptr": "*i8", "x_ptr": "*fp32"}),
        "rotary_heads_kernel": ptx(rotary_heads_kernel, {"HEAD_DIM": 128, "HALF": 64, "BLOCK_HALF": 64, "PASS": 0,
                                                         "BLOCK_PASS": 1, "BLOCK_D": 128, "PAGE": 16,
                                                         "STORE_KV": True, "Q_SPLITS": 3, "K_SPLITS": 3,
                                                         "V_SPLITS": 1}, 1,
                                   {"q_ptr": "*fp32", "k_ptr": "*fp32", "v_ptr": "*bf16", "q_out_ptr": "*bf16",
                                    "k_out_ptr": "*bf16", "v_out_ptr": "*bf16", "qw_ptr": "*bf16",
                                    "kw_ptr": "*bf16"}),
        "paged_attention_kernel": ptx(paged_attention_kernel, {"HEAD_DIM": 128, "BLOCK_D": 128, "GROUP": 4,
                                                               "GROUP_PAD": 16, "BLOCK_Q": 1, "BLOCK_N": 64,
                                                               "PAGE": 16, "USE_SOFTCAP": False,
                                                               "USE_WINDOW": False, "PRECISION": "tf32"}, 4,
                                      {"q_ptr": "*bf16", "k_cache_ptr": "*bf16", "v_cache_ptr": "*bf16"}),
        "split_decode_kernel": ptx(split_decode_kernel, {"HEAD_DIM": 128, "BLOCK_D": 128, "GROUP": 4,
                                                         "GROUP_PAD": 16, "ROWS": 4, "BLOCK_N": 32, "PAGE": 16,
                                                         "SPLITS": 16, "USE_SOFTCAP": False, "USE_WINDOW": False,
                                                         "PRECISION": "tf32", "QUANT": True, "SUMS": True}, 4,
                                   {"q_ptr": "*bf16", "k_cache_ptr": "*bf16", "v_cache_ptr": "*bf16",
                                    "q8_ptr": "*i8"}),
        "sum_middle_kernel": ptx(sum_middle_kernel, {"S": 2, "BN": 1024}, 4),
        "mmq_kernel": ptx(mmq_kernel, {"QTYPE": 12, "TS": 144, "BM": 8, "BN": 32, "EVICT": "evict_first",
                                       "ROWS_FIRST": True}, 2,
                          {"xq_ptr": "*i8"}),
    }
    print(json.dumps(cases))
""")


def _first(lines: list[str], *needles: str) -> int:
    return next((i for i, line in enumerate(lines) if any(n in line for n in needles)), len(lines))


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_decode_kernels_wait_before_they_write_and_the_gemv_loads_weights_first():
    cases = compile_in_fresh_process(SCRIPT)
    assert len(cases) == 10
    for name, ptx in cases.items():
        lines = ptx.splitlines()
        wait, launch = _first(lines, "griddepcontrol.wait"), _first(lines, "griddepcontrol.launch_dependents")
        store = _first(lines, "st.global", "atom.global")
        assert wait < len(lines), f"{name}: no griddepcontrol.wait"
        assert wait < store < len(lines), f"{name}: a global store or atomic before the wait"
        if name in ("gemv_tokens_kernel", "gemv_tokens_kernel late", "mmq_kernel"):
            assert launch == len(lines), f"{name}: a matmul lets the next kernel launch early"
        else:
            assert wait < launch < len(lines), f"{name}: the next kernel may launch before this one waited"
    gemv = cases["gemv_tokens_kernel"].splitlines()
    assert _first(gemv, "ld.global") < _first(gemv, "griddepcontrol.wait"), "the GEMV's weights load after the wait"
    # the sibling GEMV runs its whole K loop (every load) before its wait
    late = cases["gemv_tokens_kernel late"].splitlines()
    wait = _first(late, "griddepcontrol.wait")
    assert max(i for i, line in enumerate(late) if "ld.global" in line) < wait, "a sibling GEMV loads after its wait"
    # the split decode attention loads its first K/V tile (earlier positions of the cache) before the wait
    attention = cases["split_decode_kernel"].splitlines()
    wait = _first(attention, "griddepcontrol.wait")
    assert sum("ld.global" in line for line in attention[:wait]) >= 8, "K/V tile loads after the wait"
