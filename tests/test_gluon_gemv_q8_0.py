"""The one-token Gluon GEMV's Q8_0 group (``gluon_gemv_q8_0``, the Q4_0 kernel with ``Q8``): its compiled code for
sm_90 and its asm's word picking without a GPU, its numerics against gguf-py on one. The shared checks and helpers
are ``test_gluon_gemv``'s."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from test_gluon_gemv import (HAS_GLUON, _assert_block_group_loads, _check_against_gguf_py, _compile_script,
                             _compiled_loops, _h100, _ptxas_report)

SCRIPT_Q8_0 = _compile_script("gluon_gemv_q4_0", "gluon_gemv_q4_0_kernel", "GROUPS", ((8, 1, 1), (8, 2, 1), (4, 4, 4)),
                              {"Q8": True})


@pytest.mark.slow
@pytest.mark.skipif(not HAS_GLUON, reason="Triton with Gluon is not installed")
def test_q8_0_compiled_for_sm90_reads_its_blocks_as_16_byte_vectors():
    """The Q8_0 group (``gluon_gemv_q8_0``) in the code ptxas receives: per step a thread loads its two blocks of each
    of its rows (68 bytes, 4-byte aligned) as five 16-byte vectors and nothing narrower, picks its 17 words out with 36
    selects per row, takes the first block's quant words out with eight funnel shifts and both scales with one byte
    permute; the activations (four vectors, two scales in one 64-bit load) once for all its rows; 16 dp4a per row and
    no activation sums (signed quants); nothing in the loop crosses threads; the PDL contract, with the first group's
    five vectors of each row loaded before the wait (``EARLY``); no spills at the launches compiled."""
    for launch, ptx, rpt, loop in _compiled_loops(SCRIPT_Q8_0, 3):
        _assert_block_group_loads(launch, ptx, loop, rpt, 5)
        assert sum(line.count("selp.b32") for line in loop) == 36 * rpt, launch
        assert sum(line.count("shf.r.clamp.b32") for line in loop) == 8 * rpt, launch
        assert sum("prmt.b32" in line and "0x7610" in line for line in loop) == rpt, launch
        assert sum(line.startswith("dp4a.s32.s32") for line in loop) == 16 * rpt, launch
        report = _ptxas_report(ptx)
        assert "0 bytes spill stores, 0 bytes spill loads" in report, (launch, report)


@pytest.mark.skipif(not HAS_GLUON, reason="Triton with Gluon is not installed")
def test_q8_0_window_ptx_picks_each_threads_blocks_out_of_gguf_py_bytes():
    """``gluon_gemv_q8_0``'s asm, run by a PTX emulator (``ptx_emulator``) on the bytes of eight Q8_0 blocks that
    gguf-py quantized: for each thread t of a group, its five vectors from byte 64t in, block 2t's 32 quants as eight
    words, block 2t+1's as eight more and both fp16 scales out, exactly as gguf-py laid them down (the asm's word
    picking, checked where no GPU runs it; the numerics on a GPU: ``test_q8_0_within_activation_rounding_of_gguf_py``).
    Q4_0's window asm (``gluon_gemv_q4_0.WINDOW_PTX``, measured right on GPUs since session 23) is run by the same
    emulator first, as a check of the emulator."""
    from gguf.quants import quantize
    from ptx_emulator import run
    from toolkit.kernels.gguf.gluon_gemv_q4_0 import WINDOW_PTX
    from toolkit.kernels.gguf.gluon_gemv_q8_0 import Q8_WINDOW_PTX

    rng = np.random.default_rng(23)
    group = quantize(rng.standard_normal((1, 256)).astype(np.float32), GGMLQuantizationType.Q8_0).reshape(-1)
    assert group.size == 272
    words = [int(w) for w in np.frombuffer(group.tobytes(), dtype="<u4")]
    blocks = group.reshape(8, 34)

    def registers(first: int, values: list[int]) -> dict[str, int]:
        return {f"${first + i}": v for i, v in enumerate(values)}

    for t in range(4):
        q4 = run(WINDOW_PTX.value, registers(4, words[0:8] + [t] * 4), 4)
        assert q4 == words[t:t + 4], t
        out = run(Q8_WINDOW_PTX.value, registers(20, words[16 * t:16 * t + 20] + [t] * 4), 20)
        got = np.array(out[:16], dtype="<u4").view(np.uint8)
        assert np.array_equal(got[:32], blocks[2 * t, 2:]), t
        assert np.array_equal(got[32:], blocks[2 * t + 1, 2:]), t
        scales = np.array(out[16:17], dtype="<u4").view(np.uint8)
        assert np.array_equal(scales[:2], blocks[2 * t, :2]) and np.array_equal(scales[2:], blocks[2 * t + 1, :2]), t


@pytest.mark.gpu
@pytest.mark.skipif(not _h100(), reason="needs an H100/H200 (sm_90) and Triton with Gluon")
@pytest.mark.parametrize("early", ["1", "0"])
def test_q8_0_within_activation_rounding_of_gguf_py(monkeypatch, early):
    """Q8_0 (the Q4_0 kernel with ``gluon_gemv_q8_0``'s group) as Q4_0: rows off the program size, 1-8 groups per
    step, 1-4 rows per thread, 1 and 4 warps, K split and not, a row of one group, the first weights before the PDL
    wait and not; the dispatch sends one-token Q8_0 calls of the shapes ``GEMV_RULES`` names to it."""
    monkeypatch.setenv("TOOLKIT_GGUF_GLUON_EARLY", early)
    _check_against_gguf_py("Q8_0", slice(0, 2), 0.002,
                           ((37, 256), (130, 2048), (1000, 4096), (8200, 2048), (64, 14336), (2048, 8192)),
                           ((8, 1, 1, 0), (8, 2, 1, 1), (4, 4, 1, 0), (2, 1, 4, 2), (8, 4, 1, 0), (1, 2, 1, 0),
                            (1, 1, 1, 7), (8, 4, 4, 0), (8, 2, 4, 2), (8, 2, 1, 2)), seed=19)
