"""Mixture-of-experts under tensor parallelism (tp=2, two CPU workers over gloo) against tp=1:
each expert's intermediate dimension split in two, and expert parallelism (whole experts per
rank, chosen by the config key ``expert_parallel``)."""
from __future__ import annotations

import json

import pytest
import torch

import toolkit
from moe_fixtures import VOCAB, save_moe_model

PROMPT = torch.randint(0, VOCAB, (11,), generator=torch.Generator().manual_seed(5)).tolist()
PLUGINS = "safetensors,unquantized,llama,qwen,qwen-moe,mixtral,reference-kernels,moe-kernels"


@pytest.fixture(autouse=True)
def float_activations(monkeypatch):
    """These bounds are float32 round-off: the compiled CPU GGUF kernels keep float32 activations
    (their default 8-bit ones, GEMV and int8 GEMM, have bound tests in test_gguf_cpu_kernels);
    the tensor-parallel workers get the same setting through the environment they inherit."""
    from toolkit.kernels.gguf_cpu import ops  # noqa: PLC0415

    monkeypatch.setattr(ops, "INT8_ACTIVATIONS", False)
    monkeypatch.setenv("TOOLKIT_GGUF_CPU_INT8", "0")


def _expert_shapes(loaded):
    experts = next(layer.mlp.experts for layer in loaded.model.model.layers if hasattr(layer.mlp, "experts"))
    return loaded.parallel.tp_rank, tuple(experts.gate_up_proj.shape), tuple(experts.down_proj.shape)


@pytest.fixture(autouse=True)
def only_needed_plugins(monkeypatch):
    from toolkit.core.registry import reset_default_registry  # noqa: PLC0415

    monkeypatch.setenv("TOOLKIT_PLUGINS", PLUGINS)
    reset_default_registry()
    yield
    monkeypatch.undo()
    reset_default_registry()


@pytest.mark.slow
@pytest.mark.parametrize("kind,expert_parallel", [("qwen2_moe", False), ("mixtral", True)])
def test_tp2_matches_tp1(kind, expert_parallel, tmp_path):
    save_moe_model(tmp_path, kind, seed=3)
    if expert_parallel:
        config = json.loads((tmp_path / "config.json").read_text())
        (tmp_path / "config.json").write_text(json.dumps({**config, "expert_parallel": True}))
    single = toolkit.load(tmp_path, device="cpu")
    expected, tokens = single.logits(PROMPT), single.generate(PROMPT, 5, stop_token_ids=[])
    with toolkit.load(tmp_path, tp=2, device="cpu") as parallel:
        logits = parallel.logits(PROMPT)
        generated = parallel.generate(PROMPT, 5, stop_token_ids=[])
        shapes = parallel.run_all(_expert_shapes)
    # tp: 4 experts, each with half of its intermediate 32; ep: 2 whole experts per rank
    per_rank = [(2, 64, 64), (2, 64, 32)] if expert_parallel else [(4, 32, 64), (4, 64, 16)]
    assert [list(s[1:]) for s in shapes] == [per_rank, per_rank]
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)
    assert generated == tokens


@pytest.mark.slow
def test_tp2_matches_tp1_with_packed_q8_0_experts(tmp_path, monkeypatch):
    from toolkit.core.convert import convert  # noqa: PLC0415
    from toolkit.core.registry import reset_default_registry  # noqa: PLC0415

    monkeypatch.setenv("TOOLKIT_PLUGINS", PLUGINS + ",gguf,gguf-quant,gguf-kernels,gguf-moe-kernels")
    reset_default_registry()
    save_moe_model(tmp_path / "hf", "qwen3_moe", seed=6, mlp_only_layers=[], expert_ffn=64, hidden=128)
    path = tmp_path / "m.gguf"
    convert(tmp_path / "hf", path, to="gguf:Q8_0")
    single = toolkit.load(str(path), device="cpu")
    expected, tokens = single.logits(PROMPT), single.generate(PROMPT, 5, stop_token_ids=[])
    with toolkit.load(str(path), tp=2, device="cpu") as parallel:
        logits = parallel.logits(PROMPT)
        generated = parallel.generate(PROMPT, 5, stop_token_ids=[])
        packed = parallel.run_all(_packed_expert_bytes)
    full = single.model.model.layers[0].mlp.experts
    # each rank holds half of every expert's rows (gate/up) and half of every row's blocks (down), still Q8_0
    assert packed == [(full.gate_up_proj.data.numel() // 2, full.down_proj.data.numel() // 2)] * 2
    torch.testing.assert_close(logits, expected, atol=1e-5 * expected.abs().max().item(), rtol=1e-5)
    assert generated == tokens


def _packed_expert_bytes(loaded):
    experts = loaded.model.model.layers[0].mlp.experts
    assert experts.gate_up_proj.dtype == torch.uint8
    return experts.gate_up_proj.data.numel(), experts.down_proj.data.numel()
