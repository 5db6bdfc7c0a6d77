"""The environment switches of the tensor-core kernels' dispatch and launches (no GPU: host-side logic only):
which 4-bit kernel takes a call, the token range of the 16-bit GGUF kernel, and the launch overrides used for
A/B timing, whose malformed values must name their variable."""
from __future__ import annotations

import pytest

pytest.importorskip("triton")
from toolkit.kernels.bnb import mma_ops, triton_ops  # noqa: E402
from toolkit.kernels.gguf import dot16_ops  # noqa: E402


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in ("TOOLKIT_BNB_TRITON_4BIT", "TOOLKIT_BNB_MMA", "TOOLKIT_BNB_MMA_LAUNCH", "TOOLKIT_GGUF_DOT16",
                 "TOOLKIT_GGUF_DOT16_MIN_TOKENS", "TOOLKIT_GGUF_DOT16_LAUNCH", "TOOLKIT_GGUF_DOT16_RULES",
                 "TOOLKIT_GGUF_DOT16_UNREDUCED"):
        monkeypatch.delenv(name, raising=False)


def test_fourbit_kernel_by_tokens_and_switches(monkeypatch):
    assert [triton_ops.fourbit_kernel(t) for t in (1, 2, 8, 16)] == ["tokens", "mma", "mma", "mma"]
    monkeypatch.setenv("TOOLKIT_BNB_MMA", "0")
    assert [triton_ops.fourbit_kernel(t) for t in (1, 8)] == ["tokens", None]
    monkeypatch.setenv("TOOLKIT_BNB_TRITON_4BIT", "1")
    assert triton_ops.fourbit_kernel(8) == "tokens"
    monkeypatch.setenv("TOOLKIT_BNB_TRITON_4BIT", "0")
    assert triton_ops.fourbit_kernel(1) is None


def test_bnb_mma_launch_override(monkeypatch):
    assert mma_ops.launch_override("4bit") is None
    monkeypatch.setenv("TOOLKIT_BNB_MMA_LAUNCH", "int8=128,256,8,4,2,1; 4bit=64,128,4,3,8,4")
    assert mma_ops.launch_override("4bit") == mma_ops.MmaConfig(64, 128, 4, 3, None, 8, 4)
    assert mma_ops.launch_override("int8") == mma_ops.MmaConfig(128, 256, 8, 4, None, 2, 1)
    monkeypatch.setenv("TOOLKIT_BNB_MMA_LAUNCH", "4bit=64,128")
    with pytest.raises(ValueError, match="TOOLKIT_BNB_MMA_LAUNCH"):
        mma_ops.launch_override("4bit")


def test_dot16_range_and_launch(monkeypatch):
    assert dot16_ops.dot16_range() == (dot16_ops.DOT16_MIN_TOKENS, dot16_ops.DOT16_MAX_TOKENS)
    assert dot16_ops.dot16_launch() is dot16_ops.DOT16_LAUNCH
    monkeypatch.setenv("TOOLKIT_GGUF_DOT16_MIN_TOKENS", "33")
    assert dot16_ops.dot16_range()[0] == 33
    monkeypatch.setenv("TOOLKIT_GGUF_DOT16", "0")
    first, last = dot16_ops.dot16_range()
    assert first > last  # an empty range: no call
    monkeypatch.setenv("TOOLKIT_GGUF_DOT16_LAUNCH", "128,8,3,2,4")
    assert dot16_ops.dot16_launch() == {"bn": 128, "num_warps": 8, "num_stages": 3, "programs_per_sm": 2,
                                        "group": 4}
    monkeypatch.setenv("TOOLKIT_GGUF_DOT16_LAUNCH", "128,x,3,2,1")
    with pytest.raises(ValueError, match="TOOLKIT_GGUF_DOT16_LAUNCH"):
        dot16_ops.dot16_launch()


def test_dot16_launch_rules_by_type_columns_and_token_tile(monkeypatch):
    """The measured rules (``DOT16_RULES``): Q4_0 at 64-token tiles on 128-row programs of 8 warps, Q6_K of 8192+
    columns at 64-token tiles with one stage, Q4_K of 4096+ rows and columns at 32-token tiles split for 8 programs
    per SM, and of 8192+ rows and 4096+ columns likewise at 64-token tiles; every other call the default launch; the
    switch and the global override win over them."""
    default = dot16_ops.DOT16_LAUNCH
    q4_0 = dot16_ops.dot16_launch("Q4_0", 2048, 2048, 64)
    assert (q4_0["bn"], q4_0["num_warps"], q4_0["num_stages"]) == (128, 8, default["num_stages"])
    assert dot16_ops.dot16_launch("Q6_K", 4096, 14336, 64) == {**default, "num_stages": 1}
    assert dot16_ops.dot16_launch("Q4_K", 28672, 4096, 32) == {**default, "programs_per_sm": 8}
    assert dot16_ops.dot16_launch("Q4_K", 28672, 4096, 64) == {**default, "programs_per_sm": 8}
    for name, rows, cols, bm in (("Q4_0", 2048, 2048, 32), ("Q6_K", 4096, 4096, 64), ("Q4_K", 16384, 2048, 32),
                                 ("Q4_K", 2048, 8192, 32), ("Q4_K", 4096, 14336, 64), ("Q8_0", 4096, 4096, 64),
                                 ("Q8_0", 4096, 4096, 32), ("Q4_K", 16384, 2048, 64), ("Q4_K", 4096, 4096, 64),
                                 ("Q6_K", 128256, 4096, 64), ("Q6_K", 4096, 14336, 32)):
        assert dot16_ops.dot16_launch(name, rows, cols, bm) is default, (name, rows, cols, bm)
    monkeypatch.setenv("TOOLKIT_GGUF_DOT16_RULES", "0")
    assert dot16_ops.dot16_launch("Q4_0", 2048, 2048, 64) is default
    monkeypatch.setenv("TOOLKIT_GGUF_DOT16_RULES", "1,")              # the second rule alone
    assert dot16_ops.dot16_launch("Q4_0", 2048, 2048, 64) is default
    assert dot16_ops.dot16_launch("Q6_K", 4096, 14336, 64) == {**default, "num_stages": 1}
    monkeypatch.setenv("TOOLKIT_GGUF_DOT16_RULES", "3, 0")            # in the order given, spaces allowed
    assert dot16_ops.dot16_launch("Q4_K", 28672, 4096, 64) == {**default, "programs_per_sm": 8}
    assert dot16_ops.dot16_launch("Q4_0", 2048, 2048, 64)["bn"] == 128
    assert dot16_ops.dot16_launch("Q4_K", 28672, 4096, 32) is default
    for malformed in ("x", "1,x", str(len(dot16_ops.DOT16_RULES))):
        monkeypatch.setenv("TOOLKIT_GGUF_DOT16_RULES", malformed)
        with pytest.raises(ValueError, match="TOOLKIT_GGUF_DOT16_RULES"):
            dot16_ops.dot16_launch("Q4_0", 2048, 2048, 64)
    monkeypatch.setenv("TOOLKIT_GGUF_DOT16_RULES", "0")
    monkeypatch.setenv("TOOLKIT_GGUF_DOT16_LAUNCH", "64,4,3,2,1")
    monkeypatch.delenv("TOOLKIT_GGUF_DOT16_RULES")
    assert dot16_ops.dot16_launch("Q4_0", 2048, 2048, 64)["num_stages"] == 3


def test_dot16_hands_on_q4k_and_q6k_partial_sums_by_default(monkeypatch):
    from gguf import GGMLQuantizationType as T  # noqa: PLC0415
    assert [dot16_ops.dot16_hands_on(int(t)) for t in (T.Q4_K, T.Q6_K, T.Q4_0, T.Q8_0)] == [True, True, False, False]
    monkeypatch.setenv("TOOLKIT_GGUF_DOT16_UNREDUCED", "0")
    assert not any(dot16_ops.dot16_hands_on(int(t)) for t in (T.Q4_K, T.Q6_K, T.Q4_0))
    monkeypatch.setenv("TOOLKIT_GGUF_DOT16_UNREDUCED", "Q4_0,Q6_K")
    assert [dot16_ops.dot16_hands_on(int(t)) for t in (T.Q4_K, T.Q6_K, T.Q4_0)] == [False, True, True]


def test_dot16_takes_its_types_from_17_to_64_tokens():
    import torch
    from gguf import GGMLQuantizationType as Q

    q4k = torch.zeros(8, 2 * 144, dtype=torch.uint8)            # 512 columns: two super-blocks of 144 bytes
    q6k = torch.zeros(8, 2 * 210, dtype=torch.uint8)
    q4_0 = torch.zeros(8, 16 * 18, dtype=torch.uint8)
    q8 = torch.zeros(8, 16 * 34, dtype=torch.uint8)
    q5k = torch.zeros(8, 2 * 176, dtype=torch.uint8)
    for data, qtype in ((q4k, Q.Q4_K), (q6k, Q.Q6_K), (q4_0, Q.Q4_0), (q8, Q.Q8_0)):
        assert [dot16_ops.dot16_takes(data, int(qtype), 512, t) for t in (16, 17, 64, 65)] == [False, True, True, False]
    assert not dot16_ops.dot16_takes(q5k, int(Q.Q5_K), 512, 32)                # a type it has no decoder for
    assert not dot16_ops.dot16_takes(q4_0[:, :9 * 18], int(Q.Q4_0), 288, 32)   # K not whole 256-column steps
    unaligned = torch.zeros(8, 2 * 144 + 2, dtype=torch.uint8)[:, :288]   # rows 290 bytes apart: not 4-aligned
    assert not dot16_ops.dot16_takes(unaligned, int(Q.Q4_K), 512, 32)


def test_gemv_launch_by_weight_shape_at_one_token():
    """One token: the GEMV's launch follows the weight's shape where the sweeps found a better one (two Q4_K rows
    per program from 2048 rows up to 4096 columns, and K cut in two from 14336 columns; Q6_K's short weights one
    row per program, its 8192-column ones two rows of 256-column steps cut in four, its output heads two rows of
    256-column steps); more tokens, or no shape, keep the per-type launch."""
    from toolkit.kernels.gguf.gemv_launch import TOKENS_CONFIG, tokens_config

    assert tokens_config("Q4_K", 1, 28672, 4096).bn == 2
    assert tokens_config("Q4_K", 1, 1024, 4096) == TOKENS_CONFIG
    assert (tokens_config("Q4_K", 1, 4096, 14336).bn, tokens_config("Q4_K", 1, 4096, 14336).split) == (2, 2)
    assert tokens_config("Q4_K", 4, 4096, 14336) == tokens_config("Q4_K", 4)
    assert tokens_config("Q6_K", 1, 2048, 2048).bn == 1
    assert (tokens_config("Q6_K", 1, 2048, 8192).bk, tokens_config("Q6_K", 1, 2048, 8192).split) == (256, 4)
    assert tokens_config("Q6_K", 1, 4096, 14336).split == 4
    head = tokens_config("Q6_K", 1, 128256, 4096)
    assert (head.bn, head.bk, head.split) == (2, 256, None) and head == tokens_config("Q6_K", 1, 32000, 2048)
    assert tokens_config("Q6_K", 1) == tokens_config("Q6_K", 4, 2048, 8192) != head
    assert tokens_config("Q8_0", 1, 28672, 4096) == TOKENS_CONFIG


def test_weight_eviction_by_kernel_and_switch(monkeypatch):
    """Evict-first weight loads where they were measured faster (the GEMV's Q4_K/Q6_K, the int8 kernel's Q6_K),
    the default policy elsewhere and for every type with ``TOOLKIT_GGUF_EVICT=0``."""
    from toolkit.kernels.gguf.gemv_launch import MMQ_EVICTION, WEIGHT_EVICTION, eviction

    monkeypatch.delenv("TOOLKIT_GGUF_EVICT", raising=False)
    assert eviction(WEIGHT_EVICTION, "Q4_K") == "evict_first" and eviction(WEIGHT_EVICTION, "Q4_0") == ""
    assert eviction(MMQ_EVICTION, "Q6_K") == "evict_first" and eviction(MMQ_EVICTION, "Q4_K") == ""
    monkeypatch.setenv("TOOLKIT_GGUF_EVICT", "0")
    assert eviction(WEIGHT_EVICTION, "Q4_K") == "" and eviction(MMQ_EVICTION, "Q6_K") == ""
