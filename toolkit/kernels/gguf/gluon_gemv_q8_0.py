"""Q8_0's group of eight blocks for the one-token Gluon GEMV (``gluon_gemv_q4_0``'s kernel with ``Q8``): the load and
the sums of one thread's two blocks.

Why: Q8_0 (34-byte blocks: an fp16 ``d``, 32 signed bytes) went through the Triton dp4a GEMV, at 61-65% of a device
copy on an H200 (docs/benchmarks.md, session 38), where the Gluon kernels of the other types reached 64-75%. Eight
blocks are 272 bytes, 17 16-byte vectors, so in a row whose start is 16-byte aligned (``cols`` a multiple of 256, as
for Q4_0) every group of eight starts on a 16-byte boundary. Thread ``t`` (0-3) of a group owns blocks ``2t`` and
``2t + 1``, bytes ``68t`` to ``68t + 68``, 17 words from word ``17t``: it loads the five vectors from byte ``64t``
(80 bytes; the four threads' loads cover the group's 272 bytes and 48 more, read again from L1) and takes its 17 words
from word ``t`` on (``Q8_WINDOW_PTX``: two selects per word, as Q4_0's ``window``). Block ``2t``'s ``d`` is the low
half of its first word and its quants the next 32 bytes, 2 bytes off a word (eight funnel shifts); block ``2t + 1``'s
``d`` is the high half of its ninth word and its quants its last eight words, word-aligned.

Status: not dispatched (``gluon_gemv_ops.GEMV_RULES`` has no Q8_0 rule) until a GPU run has checked it against
gguf-py (``tests/test_gluon_gemv_q8_0.py -m gpu``) and timed it against the Triton GEMV (``bench/sweep_gluon_gemv.py
--types Q8_0``, then ``bench/ab_gemv_rules.py`` in the engine; both in one device call: ``bench/gemv_rules_device.sh
all Q8_0``). docs/benchmarks.md's session paragraphs (from session 40) say why none has run yet.
``TOOLKIT_GGUF_GLUON_GEMV_LAUNCH`` forces a launch on it meanwhile.

Math as ``triton_gemv_tokens``' Q8_0 branch: per block ``d xd dot(q, x)`` (signed bytes by signed bytes: one dp4a a
word), float32 sums.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .gluon_gemv import _floats, dp4a_sum, lane_word
from .triton_words import half_bits

GROUP_BYTES = gl.constexpr(272)            # eight blocks of 34 bytes: 17 16-byte vectors


def _window_ptx() -> str:
    """PTX: the thread's 17 words from word ``t`` (``$40``, 0-3) of the 20 words of its five vectors (``$20-$39``),
    given out as block ``2t``'s quant words (``$0-$7``: a funnel shift by 16 bits of words 0-8), block ``2t + 1``'s
    (``$8-$15``: words 9-16) and the two ``d`` in one word (``$16``: word 0's low half, word 8's high half; ``$17-$19``
    the same, the pack's other lanes)."""
    v = [f"${20 + i}" for i in range(20)]
    lines = [".reg .pred o, h; .reg .b32 k, " + ", ".join(f"s{i}" for i in range(19)) + ", "
             + ", ".join(f"w{i}" for i in range(17)) + ";",
             "and.b32 k, $40, 1; setp.ne.b32 o, k, 0; and.b32 k, $40, 2; setp.ne.b32 h, k, 0;"]
    lines += [f"selp.b32 s{i}, {v[i + 1]}, {v[i]}, o;" for i in range(19)]      # shifted by one word where t is odd
    lines += [f"selp.b32 w{i}, s{i + 2}, s{i}, h;" for i in range(17)]          # then by two where t >= 2
    lines += [f"shf.r.clamp.b32 ${j}, w{j}, w{j + 1}, 16;" for j in range(8)]
    lines += [f"mov.b32 ${8 + j}, w{9 + j};" for j in range(8)]
    lines += ["prmt.b32 $16, w0, w8, 0x7610; mov.b32 $17, $16; mov.b32 $18, $16; mov.b32 $19, $16;"]
    return "{ " + " ".join(lines) + " }"


Q8_WINDOW_PTX = gl.constexpr(_window_ptx())
Q8_WINDOW_CONSTRAINTS = gl.constexpr(",".join(["=r"] * 20 + ["r"] * 24))


@gluon.jit
def q8_group_words(rows, group, piece, word):
    """The five 16-byte vectors ``[R, UPR, 4]`` from byte ``64 t`` (``piece``) of group ``group`` of each thread's
    rows."""
    vec = (rows + GROUP_BYTES * group + piece).to(gl.pointer_type(gl.uint32))[:, :, None] + word
    return gl.load(vec), gl.load(vec + 4), gl.load(vec + 8), gl.load(vec + 12), gl.load(vec + 16)


@gluon.jit
def q8_group_sum(vectors, t, word, x, xd):
    """Each thread's ``[R, UPR]`` sum of its two blocks of a group (``vectors``: ``q8_group_words``', ``t``: the
    thread's word offset) against its activation words ``x [UPR, 4]`` (pointers) and block scales ``xd``."""
    v0, v1, v2, v3, v4 = vectors
    a_lo, a_hi, b_lo, b_hi, scales = gl.inline_asm_elementwise(
        Q8_WINDOW_PTX, Q8_WINDOW_CONSTRAINTS, [v0, v1, v2, v3, v4, t],
        dtype=(gl.uint32, gl.uint32, gl.uint32, gl.uint32, gl.uint32), is_pure=True, pack=4)
    d = lane_word(scales, word, 0)
    xd_a, xd_b = _floats(xd)
    dot_a = (dp4a_sum(a_lo.to(gl.int32, bitcast=True), gl.load(x)[None, :, :])
             + dp4a_sum(a_hi.to(gl.int32, bitcast=True), gl.load(x + 4)[None, :, :]))
    dot_b = (dp4a_sum(b_lo.to(gl.int32, bitcast=True), gl.load(x + 8)[None, :, :])
             + dp4a_sum(b_hi.to(gl.int32, bitcast=True), gl.load(x + 12)[None, :, :]))
    return (half_bits(d) * xd_a[None, :] * dot_a.to(gl.float32)
            + half_bits(d >> 16) * xd_b[None, :] * dot_b.to(gl.float32))
