"""The one-token Gluon GEMV (``kernels/gguf/gluon_gemv``: Q4_K and Q5_K, ``gluon_gemv_q6k``: Q6_K, ``gluon_gemv_q4_0``:
Q4_0; host side
``gluon_gemv_ops``): which calls it takes, its compiled form for an H100 (no GPU needed), and its numbers against
gguf-py's dequantization (on an H100/H200 only: no interpreter runs Gluon)."""
from __future__ import annotations

import importlib.util
import re
import textwrap

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from toolkit.kernels.gguf import gluon_gemv_ops
from triton_interpreter import compile_in_fresh_process, ptx_loop

HAS_GLUON = importlib.util.find_spec("triton") is not None and \
    importlib.util.find_spec("triton.experimental.gluon") is not None


def _packed(name: str, rows: int, cols: int) -> torch.Tensor:
    size, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
    return torch.zeros(rows, cols // size * nbytes, dtype=torch.uint8)


@pytest.mark.parametrize("name, rows, cols, launch", [
    ("Q4_K", 28672, 4096, (8, 4, 1, 0, 0)), ("Q4_K", 16384, 2048, (8, 2, 4, 1, 0)),
    ("Q4_K", 32000, 2048, (8, 2, 4, 1, 0)),
    ("Q4_K", 4096, 4096, (8, 2, 1, 0, 0)), ("Q4_K", 2048, 2048, (8, 4, 1, 0, 0)), ("Q4_K", 2560, 2048, (8, 4, 1, 0, 0)),
    ("Q4_K", 2048, 1536, (8, 4, 4, 1, 0)), ("Q4_K", 256, 2048, (8, 2, 1, 0, 0)),
    ("Q4_K", 4096, 14336, (8, 4, 4, 1, 0)), ("Q4_K", 2048, 8192, None),
    ("Q6_K", 4096, 14336, (1, 1, 1, 7, 0)), ("Q6_K", 128256, 4096, (1, 1, 1, 7, 255)),
    ("Q6_K", 14336, 4096, (1, 1, 1, 7, 0)), ("Q6_K", 16384, 2048, (1, 2, 1, 7, 255)),
    ("Q6_K", 32000, 2048, (1, 1, 1, 7, 255)), ("Q6_K", 8192, 6144, (1, 1, 1, 7, 0)), ("Q6_K", 4096, 4096, None),
    ("Q6_K", 1024, 4096, None),
    ("Q6_K", 151936, 1536, None), ("Q6_K", 1536, 8960, None),
    ("Q4_0", 4096, 4096, (8, 2, 4, 0, 0)), ("Q4_0", 16384, 2048, (8, 2, 4, 0, 0)),
    ("Q4_0", 2048, 2048, (8, 4, 4, 0, 0)),
    ("Q4_0", 3072, 2048, (8, 4, 4, 0, 0)), ("Q4_0", 256, 2048, (8, 2, 4, 0, 0)),
    ("Q4_0", 4096, 14336, (8, 1, 1, 0, 0)), ("Q4_0", 2048, 8192, (8, 2, 1, 2, 0)), ("Q4_0", 4096, 6144, None),
    ("Q4_0", 4096, 2080, None),
    ("Q8_0", 4096, 4096, None), ("Q5_K", 4096, 4096, (8, 2, 4, 0, 0)),
    ("Q5_K", 4096, 14336, (8, 2, 4, 0, 0)), ("Q5_K", 2048, 8192, (8, 2, 4, 2, 0))])
def test_launch_by_type_and_shape(monkeypatch, name, rows, cols, launch):
    """Q4_K, Q5_K, Q6_K and Q4_0 at the shapes the sweeps measured them faster (``GEMV_RULES``); Q6_K only of
    16-byte-aligned rows (2,048-column multiples), Q4_0 and Q5_K of whole super-blocks / groups of eight blocks
    (256-column multiples)."""
    monkeypatch.delenv("TOOLKIT_GGUF_GLUON_GEMV", raising=False)
    monkeypatch.delenv("TOOLKIT_GGUF_GLUON_GEMV_LAUNCH", raising=False)
    monkeypatch.setattr(gluon_gemv_ops, "_runs_on", lambda device, kernels=None: True)
    assert gluon_gemv_ops.gemv_launch(name, _packed(name, rows, cols), cols) == launch


@pytest.mark.parametrize("name, rows, cols, h100, h200", [
    ("Q4_0", 2048, 2048, (8, 4, 4, 0, 0), (8, 4, 4, 0, 0)), ("Q4_0", 32000, 2048, (8, 2, 4, 0, 0), (8, 4, 4, 0, 0)),
    ("Q4_0", 16384, 2048, (8, 2, 4, 0, 0), (8, 4, 4, 0, 0)), ("Q4_0", 4096, 14336, (8, 1, 1, 0, 0), (8, 2, 4, 2, 0)),
    ("Q4_0", 2048, 8192, (8, 2, 1, 2, 0), (8, 2, 1, 2, 0)), ("Q4_0", 14336, 4096, (8, 2, 4, 0, 0), (8, 2, 4, 0, 0)),
    ("Q4_0", 256, 2048, (8, 2, 4, 0, 0), (8, 2, 4, 0, 0)),
    ("Q4_K", 32000, 2048, (8, 2, 4, 1, 0), (8, 2, 4, 1, 0)), ("Q4_K", 4096, 14336, (8, 4, 4, 1, 0), (8, 4, 4, 1, 0)),
    ("Q5_K", 32000, 2048, (8, 2, 4, 0, 0), (8, 4, 1, 0, 0)), ("Q5_K", 14336, 4096, (8, 2, 4, 0, 0), (8, 4, 1, 0, 0)),
    ("Q5_K", 4096, 14336, (8, 2, 4, 0, 0), (8, 2, 4, 0, 0)), ("Q5_K", 2048, 8192, (8, 2, 4, 2, 0), (8, 2, 4, 2, 0)),
    ("Q5_K", 1024, 4096, (8, 2, 4, 0, 0), (8, 2, 4, 0, 0)),
    ("Q6_K", 32000, 2048, (1, 1, 1, 7, 255), (1, 1, 1, 7, 255)),
    ("Q6_K", 4096, 14336, (1, 1, 1, 7, 0), (1, 1, 1, 7, 0))])
def test_h200_launches_where_its_sweep_measured_them(monkeypatch, name, rows, cols, h100, h200):
    """On an H200 the shapes ``DEVICE_GEMV_RULES`` bounds take its launches, the others ``GEMV_RULES``'; on an H100,
    or with ``TOOLKIT_GGUF_GLUON_DEVICE_RULES=0``, every shape takes ``GEMV_RULES``'."""
    monkeypatch.delenv("TOOLKIT_GGUF_GLUON_GEMV", raising=False)
    monkeypatch.delenv("TOOLKIT_GGUF_GLUON_GEMV_LAUNCH", raising=False)
    monkeypatch.delenv("TOOLKIT_GGUF_GLUON_DEVICE_RULES", raising=False)
    monkeypatch.setattr(gluon_gemv_ops, "_runs_on", lambda device, kernels=None: True)
    data = _packed(name, rows, cols)
    monkeypatch.setattr(gluon_gemv_ops, "_device_name", lambda device: "NVIDIA H200")
    assert gluon_gemv_ops.gemv_launch(name, data, cols) == h200
    monkeypatch.setenv("TOOLKIT_GGUF_GLUON_DEVICE_RULES", "0")
    assert gluon_gemv_ops.gemv_launch(name, data, cols) == h100
    monkeypatch.delenv("TOOLKIT_GGUF_GLUON_DEVICE_RULES")
    monkeypatch.setattr(gluon_gemv_ops, "_device_name", lambda device: "NVIDIA H100 80GB HBM3")
    assert gluon_gemv_ops.gemv_launch(name, data, cols) == h100


def test_not_taken_off_the_gpu_turned_off_or_unaligned(monkeypatch):
    data = _packed("Q4_K", 64, 4096)
    monkeypatch.delenv("TOOLKIT_GGUF_GLUON_GEMV", raising=False)
    monkeypatch.delenv("TOOLKIT_GGUF_GLUON_GEMV_LAUNCH", raising=False)
    assert gluon_gemv_ops.gemv_launch("Q4_K", data, 4096) is None                    # a CPU tensor
    monkeypatch.setattr(gluon_gemv_ops, "_runs_on", lambda device, kernels=None: True)
    assert gluon_gemv_ops.gemv_launch("Q4_K", data, 4096) is not None
    monkeypatch.setenv("TOOLKIT_GGUF_GLUON_GEMV", "0")
    assert gluon_gemv_ops.gemv_launch("Q4_K", data, 4096) is None
    monkeypatch.delenv("TOOLKIT_GGUF_GLUON_GEMV")
    flat = torch.zeros(64 * 2304 + 4, dtype=torch.uint8)
    assert gluon_gemv_ops.gemv_launch("Q4_K", flat[4:].view(64, 2304), 4096) is None   # rows off a 16-byte boundary
    scales = torch.zeros(129, dtype=torch.float32)[1:]                              # activation blocks too
    assert gluon_gemv_ops.gemv_launch("Q4_K", data, 4096, scales) is None


def test_forced_launch_reaches_every_type_with_a_kernel(monkeypatch):
    """``TOOLKIT_GGUF_GLUON_GEMV_LAUNCH`` (benchmarks) sets the launch of any shape, also of Q8_0, which has no rule yet,
    and still only for types with a Gluon kernel, rows of whole units and a run that has not turned the GEMV off."""
    monkeypatch.delenv("TOOLKIT_GGUF_GLUON_GEMV", raising=False)
    monkeypatch.setattr(gluon_gemv_ops, "_runs_on", lambda device, kernels=None: True)
    monkeypatch.delenv("TOOLKIT_GGUF_GLUON_GEMV_LAUNCH", raising=False)
    assert gluon_gemv_ops.gemv_launch("Q8_0", _packed("Q8_0", 4096, 4096), 4096) is None
    monkeypatch.setenv("TOOLKIT_GGUF_GLUON_GEMV_LAUNCH", "8,2,1,2")
    assert gluon_gemv_ops.gemv_launch("Q8_0", _packed("Q8_0", 4096, 4096), 4096) == (8, 2, 1, 2, 0)
    assert gluon_gemv_ops.gemv_launch("Q4_K", _packed("Q4_K", 2048, 8192), 8192) == (8, 2, 1, 2, 0)
    assert gluon_gemv_ops.gemv_launch("Q8_0", _packed("Q8_0", 64, 2080), 2080) is None      # not whole groups
    assert gluon_gemv_ops.gemv_launch("Q5_0", _packed("Q5_0", 64, 4096), 4096) is None      # no Gluon kernel
    monkeypatch.setenv("TOOLKIT_GGUF_GLUON_GEMV", "0")
    assert gluon_gemv_ops.gemv_launch("Q8_0", _packed("Q8_0", 4096, 4096), 4096) is None


def _compile_script(module: str, kernel: str, step: str, launches: tuple, extra: dict | None = None,
                    options: dict | None = None) -> str:
    """A script compiling ``module.kernel`` for sm_90 at each ``(step, rows per thread, warps)`` of ``launches``
    (``step`` the kernel's constexpr for it; ``extra``: more constexprs; ``options``: more compile options), printing
    each launch's PTX as JSON."""
    return textwrap.dedent(f"""
        import json
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.experimental.gluon._runtime import GluonASTSource
        from toolkit.kernels.gguf.{module} import {kernel} as kernel

        cases = {{}}
        for step, rpt, warps in {launches!r}:
            # Q4_0's defaults (gluon_gemv_ops)
            shipped = {{"EARLY": True, "Q8": False}} if "EARLY" in kernel.arg_names else {{}}
            constexprs = {{"{step}": step, "RPT": rpt, "num_warps": warps, "PDL": True, **shipped, **{extra or {}!r}}}
            signature = {{arg: "constexpr" if arg in constexprs else "*i32" if arg == "xq_ptr" else "*u8"
                         if arg == "w_ptr" else "*bf16" if arg == "out_ptr" else "*fp32" if arg.endswith("_ptr")
                         else "i32" for arg in kernel.arg_names}}
            aligned = {{(kernel.arg_names.index(arg),): [["tt.divisibility", 16]] for arg in kernel.arg_names
                       if arg.endswith("_ptr") or arg in ("row_bytes", "K_SPLIT")}}
            compiled = triton.compile(GluonASTSource(kernel, signature, constexprs, aligned),
                                      target=GPUTarget("cuda", 90, 32),
                                      options={{"num_warps": warps, "launch_pdl": True, **{options or {}!r}}})
            cases[f"{{step}} {{rpt}} {{warps}}"] = {{"ptx": compiled.asm["ptx"], "rpt": rpt}}
        print(json.dumps(cases))
    """)


def _before_pdl_wait(ptx: str) -> list[str]:
    """The PDL contract (``triton_pdl``) both kernels keep, asserted: nothing stored before ``griddepcontrol.wait``,
    the next kernel let in after it (``GLUON_GEMV_EARLY_LAUNCH``), not before. Returns the lines before the wait."""
    lines = ptx.splitlines()
    gdc = next(i for i, line in enumerate(lines) if "griddepcontrol.wait" in line)
    assert not any("st.global" in line for line in lines[:gdc]), "out written before the wait"
    launch = [i for i, line in enumerate(lines) if "griddepcontrol.launch_dependents" in line]
    assert launch and min(launch) > gdc, "the next kernel must launch after the wait"
    return lines[:gdc]



def _compiled_loops(script: str, launches: int):
    """``(launch, ptx, rows per thread, main loop)`` of each of the ``launches`` compiles ``script`` prints, after
    asserting what both kernels keep: nothing in the loop crosses threads (no shuffle, no shared memory), and the PDL
    contract (``_before_pdl_wait``)."""
    cases = compile_in_fresh_process(script)
    assert len(cases) == launches
    for launch, case in cases.items():
        loop = ptx_loop(case["ptx"])
        assert not any("shfl" in line or "ld.shared" in line or "bar.sync" in line for line in loop), launch
        _before_pdl_wait(case["ptx"])
        yield launch, case["ptx"], case["rpt"], loop


def _assert_one_header_load_per_row(loop: list[str], rpt: int, launch: str) -> None:
    """A Q4_K/Q5_K super-block's 16-byte header reaches each row's thread as one vector load (``_header16``), and the
    loop's only narrower loads are the two 8-byte loads of the activations' block scales (``xd``, ``xs``)."""
    headers = [line for line in loop if re.match(r"ld\.global\.L1::evict_first\.v4\.u32", line)]
    assert len(headers) == rpt, (launch, headers)
    narrow = [line.split()[0] for line in loop if line.startswith("ld.global") and ".v4." not in line.split()[0]]
    assert narrow == ["ld.global.b64"] * 2, (launch, narrow)


def _assert_block_group_loads(launch: str, ptx: str, loop: list[str], rpt: int, vectors: int) -> None:
    """What the Q4_0 kernel keeps for its groups of eight blocks (Q4_0's, and Q8_0's with ``Q8``): each row's
    ``vectors`` 16-byte weight vectors of a thread loaded before the PDL wait for the first group and in the loop for
    the next, the activations as four vectors for all the thread's rows, and only one narrower load (their two block
    scales in 64 bits)."""
    early = [line for line in _before_pdl_wait(ptx) if "ld.global" in line]
    assert len(early) == vectors * rpt and all("ld.global.v4.b32" in line for line in early), (launch, early)
    loaded = [line for line in loop if re.match(r"ld\.global\.v4\.b32", line)]
    assert len(loaded) == vectors * rpt + 4, (launch, len(loaded))
    scalar = [line.split()[0] for line in loop if line.startswith("ld.global") and ".v" not in line.split()[0]]
    assert scalar == ["ld.global.b64"], (launch, scalar)


def _ptxas_report(ptx: str) -> str:
    """ptxas' ``-v`` report (registers, spills) for ``ptx``, compiled for sm_90a by Triton's own ptxas."""
    import subprocess

    from triton import knobs
    return subprocess.run([knobs.nvidia.ptxas.path, "-arch=sm_90a", "-v", "-", "-o", "/dev/null"], input=ptx,
                          capture_output=True, text=True, check=True).stderr


SCRIPT = _compile_script("gluon_gemv", "gluon_gemv_q4k_kernel", "SB_STEP",
                         ((4, 1, 1), (2, 1, 1), (1, 1, 1), (4, 2, 4)), {"Q5": False})


@pytest.mark.slow
@pytest.mark.skipif(not HAS_GLUON, reason="Triton with Gluon is not installed")
def test_compiled_for_sm90_each_thread_sums_its_group_alone():
    """What the kernel is for, in the code ptxas receives: per step a thread loads its group's 32 quant bytes of each
    of its rows as two 16-byte vectors, the super-block's 16-byte header (d, dmin, scales) as one more, and their
    activations once as four, runs 16 dp4a per row, and nothing in the loop crosses threads (no shuffle, no shared
    memory); and the PDL contract (``triton_pdl``): weights load before
    ``griddepcontrol.wait``, nothing is stored before it, and the next kernel is let in after it, not before."""
    for launch, ptx, rpt, loop in _compiled_loops(SCRIPT, 4):
        vectors = [line for line in loop if re.match(r"ld\.global(\.\S+)*\.v4\.b32", line)]
        assert len(vectors) == 2 * rpt + 4, (launch, vectors)     # quants of each row, activations once
        _assert_one_header_load_per_row(loop, rpt, launch)
        assert sum(line.startswith("dp4a.s32.s32") for line in loop) == 16 * rpt, launch
        assert any("ld.global" in line for line in _before_pdl_wait(ptx)), "weights load after the wait"


SCRIPT_Q5K = _compile_script("gluon_gemv", "gluon_gemv_q4k_kernel", "SB_STEP", ((4, 1, 1), (8, 2, 1), (4, 4, 4)),
                             {"Q5": True})


@pytest.mark.slow
@pytest.mark.skipif(not HAS_GLUON, reason="Triton with Gluon is not installed")
def test_q5k_compiled_for_sm90_adds_its_fifth_bits_in_thread():
    """Q5_K through the Q4_K kernel: per step and row a thread loads its group's 32 quant bytes and the super-block's
    32 bytes of fifth bits as four 16-byte vectors (the activations once, four more), ORs a fifth bit into each byte of
    its 16 quant words (16 ``or`` per row at least; Q4_K's loop has 8) and runs 16 dp4a per row; nothing in the loop
    crosses threads; the PDL contract."""
    for launch, ptx, rpt, loop in _compiled_loops(SCRIPT_Q5K, 3):
        vectors = [line for line in loop if re.match(r"ld\.global(\.\S+)*\.v4\.b32", line)]
        assert len(vectors) == 4 * rpt + 4, (launch, vectors)
        _assert_one_header_load_per_row(loop, rpt, launch)
        assert sum(line.startswith("or.b32") for line in loop) >= 16 * rpt, launch
        assert sum(line.startswith("dp4a.s32.s32") for line in loop) == 16 * rpt, launch
        assert any("ld.global" in line for line in _before_pdl_wait(ptx)), "weights load after the wait"


SCRIPT_Q6K = {windows: _compile_script("gluon_gemv_q6k", "gluon_gemv_q6k_kernel", "GROUPS",
                                       ((1, 1, 1), (1, 2, 1), (2, 2, 4)), {"SCALE_WINDOWS": windows})
              for windows in (True, False)}


@pytest.mark.slow
@pytest.mark.skipif(not HAS_GLUON, reason="Triton with Gluon is not installed")
@pytest.mark.parametrize("windows", [True, False])
def test_q6k_compiled_for_sm90_reads_its_2_aligned_fields_as_16_byte_vectors(windows):
    """The Q6_K kernel's point, in the code ptxas receives: each of the three 16-byte fields a thread reads per row and
    super-block (two ql, one qh) is loaded as 16-byte vectors, one where the super-block sits on a 16-byte boundary
    (the first of each group of eight), two and a funnel shift elsewhere, never as 16-bit pieces; the scales and d
    (``SCALE_WINDOWS``) as the two 16-byte vectors around them, funnel-shifted as the fields are, and nothing narrower,
    else four byte loads and a 16-bit one; 16 dp4a per row and super-block plus 16 for the activation sums the rows
    share; nothing in the loop crosses threads; the PDL contract (nothing stored before ``griddepcontrol.wait``, the
    next kernel let in after it)."""
    for launch, _, rpt, loop in _compiled_loops(SCRIPT_Q6K[windows], 3):
        vectors = [line for line in loop if re.match(r"ld\.global\.v4\.b32", line)]
        scale_vectors = 2 * 8 * rpt if windows else 0
        assert len(vectors) == (3 + 7 * 6) * rpt + 4 * 8 + scale_vectors, (launch, len(vectors))  # x once for all rows
        narrow = [line for line in loop if re.match(r"ld\.global(\.\S+)*\.b(8|16) ", line)]
        assert len(narrow) == (0 if windows else 5 * 8 * rpt), (launch, len(narrow))   # 4 scales and d per row and sb
        fields = 4 if windows else 3                          # 4-word funnels at the 4 odd-offset super-blocks
        assert sum(line.count("shf.r.clamp.b32") for line in loop) == 4 * fields * 4 * rpt, launch
        assert sum(line.startswith("dp4a.s32.s32") for line in loop) == 8 * 16 * (rpt + 1), launch


SCRIPT_Q6K_CAPPED = _compile_script("gluon_gemv_q6k", "gluon_gemv_q6k_kernel", "GROUPS", ((1, 1, 1),),
                                    {"SCALE_WINDOWS": False}, options={"maxnreg": gluon_gemv_ops.Q6K_REGISTERS})


@pytest.mark.slow
@pytest.mark.skipif(not HAS_GLUON, reason="Triton with Gluon is not installed")
def test_q6k_register_cap_holds_without_spilling():
    """The Q6_K register cap of 2,048-column weights (``gluon_gemv_ops.Q6K_REGISTERS``) lets 32 one-warp programs
    share an SM: ptxas (Triton's own, for sm_90a) must fit the kernel at the rules' launch under it with nothing
    spilled to local memory, which would trade the extra programs for memory traffic."""
    cases = compile_in_fresh_process(SCRIPT_Q6K_CAPPED)
    ptx = cases["1 1 1"]["ptx"]
    assert f".maxnreg {gluon_gemv_ops.Q6K_REGISTERS}" in ptx
    report = _ptxas_report(ptx)
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    assert registers <= gluon_gemv_ops.Q6K_REGISTERS, report
    assert "0 bytes spill stores, 0 bytes spill loads" in report and "0 bytes stack frame" in report, report

SCRIPT_Q4_0 = _compile_script("gluon_gemv_q4_0", "gluon_gemv_q4_0_kernel", "GROUPS", ((8, 1, 1), (8, 2, 1), (4, 4, 4)))


@pytest.mark.slow
@pytest.mark.skipif(not HAS_GLUON, reason="Triton with Gluon is not installed")
def test_q4_0_compiled_for_sm90_reads_its_blocks_as_16_byte_vectors():
    """The Q4_0 kernel's point, in the code ptxas receives: per step a thread loads its two blocks of each of its rows
    (36 bytes, 2-byte aligned) as three 16-byte vectors and nothing narrower, picks its nine words out with 30 selects
    per row and takes the first block's quant words out with four funnel shifts; it loads the activations (four
    vectors) and their two scales (one 64-bit load) once for all its rows and runs 16 dp4a per row plus 16 for the
    activation sums; nothing in the loop crosses threads; the PDL contract, with the first group's three vectors of
    each row loaded before the wait (``EARLY``, the default: session 38, H200, 14336x4096 12.3 -> 10.8 us)."""
    for launch, ptx, rpt, loop in _compiled_loops(SCRIPT_Q4_0, 3):
        _assert_block_group_loads(launch, ptx, loop, rpt, 3)
        assert sum(line.count("selp.b32") for line in loop) == 30 * rpt, launch
        assert sum(line.count("shf.r.clamp.b32") for line in loop) == 4 * rpt, launch
        assert sum(line.startswith("dp4a.s32.s32") for line in loop) == 16 * (rpt + 1), launch


def _h100() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and HAS_GLUON


def _random_blocks(name: str, rows: int, cols: int, rng, fp16: slice, scale: float) -> np.ndarray:
    """Random packed rows of type ``name`` whose fp16 fields (bytes ``fp16`` of each block) hold values in
    ``+-scale``, the rest random bytes."""
    size, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
    blocks = rng.integers(0, 256, (rows * cols // size, nbytes), dtype=np.uint8)
    fields = (fp16.stop - fp16.start) // 2
    blocks[:, fp16] = rng.uniform(-scale, scale, (blocks.shape[0], fields)).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


def _check_against_gguf_py(name: str, fp16: slice, scale: float, shapes, launches, seed: int, taken=None):
    """Each launch of the Gluon GEMV on random ``name`` weights of ``shapes`` against float64 on gguf-py's
    dequantization, within what rounding x to int8 blocks of 32 can move the result (the bound of the Triton GEMV's
    test); then the dispatch: where ``gemv_launch`` takes the weight (with ``taken``, exactly where ``taken(rows)``
    says), ``gguf_matmul`` gives the Gluon GEMV's bits."""
    from test_gguf_kernels import activation_rounding_bound
    from toolkit.kernels.gguf import dp4a_ops, gemv_launch, triton_ops
    qtype, rng = GGMLQuantizationType[name], np.random.default_rng(seed)
    for rows, cols in shapes:
        packed = _random_blocks(name, rows, cols, rng, fp16, scale)
        weight = torch.from_numpy(dequantize(packed, qtype).astype(np.float64)).cuda()
        data = torch.from_numpy(packed).cuda()
        x = torch.randn(1, cols, device="cuda").to(torch.bfloat16)
        exact = x.double() @ weight.T
        bound = 3 * 2 ** -8 * (x.double().abs() @ weight.abs().T) + activation_rounding_bound(x, weight)
        words, scales, *sums = dp4a_ops.quantize_activations(x, sums=name in ("Q4_K", "Q5_K"))
        sums = sums[0] if sums else None
        for launch in launches:
            got = gluon_gemv_ops.gluon_gemv(name, words, scales, sums, data, cols, x, launch, None)
            assert got.shape == (1, rows) and got.dtype == torch.bfloat16
            assert ((got.double() - exact).abs() <= bound).all(), (rows, cols, launch)
        launch = gluon_gemv_ops.gemv_launch(name, data, cols, words, scales, *([] if sums is None else [sums]))
        if taken is not None:
            assert (launch is not None) == taken(rows), (rows, cols)
        if launch is None:
            continue
        split = gemv_launch.tokens_config(name, 1, rows, cols).split
        assert torch.equal(triton_ops.gguf_matmul(x, data, int(qtype), cols),
                           gluon_gemv_ops.gluon_gemv(name, words, scales, sums, data, cols, x, launch, split))


@pytest.mark.gpu
@pytest.mark.skipif(not _h100(), reason="needs an H100/H200 (sm_90) and Triton with Gluon")
def test_within_activation_rounding_of_gguf_py():
    """Q4_K (``_check_against_gguf_py``): rows off the program size, K split and not, 1-8 super-blocks per step, 1-4
    rows per thread, 1 and 4 warps; the dispatch sends one-token Q4_K calls to it."""
    _check_against_gguf_py("Q4_K", slice(0, 4), 0.02,
                           ((37, 1024), (130, 2048), (1000, 4096), (8200, 4096), (64, 14336), (8200, 2048)),
                           ((4, 1, 1, 0), (2, 1, 1, 1), (1, 1, 1, 2), (4, 2, 4, 0), (2, 2, 1, 4), (8, 2, 1, 0),
                            (4, 4, 1, 2), (8, 4, 1, 0), (8, 4, 2, 1), (8, 2, 4, 1)), seed=7)


@pytest.mark.gpu
@pytest.mark.skipif(not _h100(), reason="needs an H100/H200 (sm_90) and Triton with Gluon")
def test_q6k_within_activation_rounding_of_gguf_py():
    """Q6_K as Q4_K: rows off the program size, one and two groups per step, 1-2 rows per thread, 1 and 4 warps, K split
    and not, the scales from windows (uncapped, and the heads' explicit 255-register ceiling) and from byte loads (the
    64-register cap); the dispatch sends one-token Q6_K calls of 2,048-column multiples to it, at
    8,192 rows and more here."""
    _check_against_gguf_py("Q6_K", slice(208, 210), 0.002, ((37, 2048), (130, 4096), (1000, 14336), (8200, 4096)),
                           ((1, 1, 1, 0), (1, 2, 1, 1), (2, 2, 1, 0), (1, 2, 4, 0), (1, 1, 1, 7), (2, 1, 4, 2),
                            (1, 1, 1, 7, gluon_gemv_ops.Q6K_REGISTERS), (1, 1, 1, 7, 255),
                            (1, 2, 1, 7, 255)),
                           seed=11, taken=lambda rows: rows >= 8192)


@pytest.mark.gpu
@pytest.mark.skipif(not _h100(), reason="needs an H100/H200 (sm_90) and Triton with Gluon")
@pytest.mark.parametrize("early", ["1", "0"])
def test_q4_0_within_activation_rounding_of_gguf_py(monkeypatch, early):
    """Q4_0 as Q4_K: rows off the program size, 1-8 groups per step, 1-4 rows per thread, 1 and 4 warps, K split and
    not, a row of one group; the dispatch sends one-token Q4_0 calls of the shapes ``GEMV_RULES`` names to it."""
    monkeypatch.setenv("TOOLKIT_GGUF_GLUON_EARLY", early)   # the first weights before the PDL wait (default), and not
    _check_against_gguf_py("Q4_0", slice(0, 2), 0.02,
                           ((37, 256), (130, 2048), (1000, 4096), (8200, 2048), (64, 14336), (2048, 8192)),
                           ((8, 1, 1, 0), (8, 2, 1, 1), (4, 4, 1, 0), (2, 1, 4, 2), (8, 4, 1, 0), (1, 2, 1, 0),
                            (1, 1, 1, 7), (8, 4, 4, 0), (8, 2, 4, 2), (8, 2, 1, 2)), seed=13)


@pytest.mark.gpu
@pytest.mark.skipif(not _h100(), reason="needs an H100/H200 (sm_90) and Triton with Gluon")
def test_q5k_within_activation_rounding_of_gguf_py():
    """Q5_K (the Q4_K kernel with its fifth bits) as Q4_K: rows off the program size, K split and not, 1-8 super-blocks
    per step, 1-4 rows per thread, 1 and 4 warps; the dispatch sends one-token Q5_K calls to it."""
    _check_against_gguf_py("Q5_K", slice(0, 4), 0.02,
                           ((37, 1024), (130, 2048), (1000, 4096), (8200, 4096), (64, 14336)),
                           ((4, 1, 1, 0), (2, 1, 1, 1), (1, 1, 1, 2), (4, 2, 4, 0), (8, 2, 1, 0), (4, 4, 1, 2),
                            (8, 4, 1, 0), (8, 2, 4, 2)), seed=17)
