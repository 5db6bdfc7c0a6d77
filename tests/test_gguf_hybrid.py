"""GGUF ``qwen35`` / ``qwen3next``: our writer's files against llama.cpp's converter and transformers.

* Layout: the Qwen3.5, Qwen3-Next (MoE) and Qwen3.5-MoE files ``toolkit convert`` writes have
  exactly the tensor names, shapes, F32 values (fingerprints) and ``{arch}.*`` metadata
  llama.cpp's own converter writes for the same checkpoint (recorded in
  tests/data/llamacpp_hybrid_layout.json by the script beside it). The dense Qwen3-Next is not
  recorded: llama.cpp's qwen3next has MoE FFNs only.
* F32: logits from our GGUF equal transformers' (<= 1e-4) and greedy generation matches;
  GGUF -> safetensors gives back a checkpoint transformers loads with the same logits.
* Q8_0: compared with transformers' model whose weights went through gguf-py's own
  ``quantize``/``dequantize`` for exactly the tensors the file stores as Q8_0 (and float16
  rounding for those it stores as F16) (rows are
  quantized independently, so the converter's row reorders commute with it).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers as tf
from gguf import GGMLQuantizationType as Q, GGUFReader, quants
from hybrid_fixtures import KINDS, MOE_KINDS, hf_greedy, prompt, save_hybrid

import toolkit
from toolkit.core.convert import convert

LAYOUT = json.loads((Path(__file__).parent / "data" / "llamacpp_hybrid_layout.json").read_text())


@pytest.fixture(scope="module", params=list(KINDS))
def source(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return request.param, path, save_hybrid(path, request.param)


def _gguf(source, tmp_path, qtype: str) -> Path:
    _, path, _ = source
    dest = tmp_path / f"model-{qtype}.gguf"
    convert(path, dest, to=f"gguf:{qtype}")
    return dest


def _fingerprint(values) -> list[float]:
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    return [float(flat.sum()), float((flat * np.linspace(-1.0, 1.0, flat.size)).sum())]


@pytest.mark.parametrize("kind", sorted(LAYOUT))
def test_file_matches_llama_cpp_converter(kind, tmp_path):
    path = tmp_path / "src"
    save_hybrid(path, kind)
    dest = tmp_path / "ours.gguf"
    convert(path, dest, to="gguf:F32")
    reader, expected = GGUFReader(str(dest)), LAYOUT[kind]
    ours = {t.name: t for t in reader.tensors}
    assert sorted(ours) == sorted(expected["tensors"])
    for name, want in expected["tensors"].items():
        tensor = ours[name]
        assert [int(d) for d in tensor.shape] == want["shape"], name
        assert tensor.tensor_type.name == want["type"], name
        np.testing.assert_allclose(_fingerprint(tensor.data), want["fingerprint"], rtol=1e-5, atol=1e-4,
                                   err_msg=name)
    for key, value in expected["metadata"].items():
        assert key in reader.fields, key
        got = reader.fields[key].contents()
        if isinstance(value, float):
            assert got == pytest.approx(value, rel=1e-6), key
        else:
            assert got == value, key


def test_f32_logits_and_greedy_match_transformers(source, tmp_path):
    _, _, hf = source
    ours = toolkit.load(_gguf(source, tmp_path, "F32"), device="cpu")
    ids = prompt(100)
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]
    assert (ours.logits(ids) - expected).abs().max().item() <= 1e-4
    short = prompt(11, seed=3)
    assert ours.generate(short, 12, stop_token_ids=[]) == hf_greedy(hf, short, 12)


def test_gguf_back_to_safetensors(source, tmp_path):
    kind, _, hf = source
    back = tmp_path / "back"
    convert(_gguf(source, tmp_path, "F32"), back, to="safetensors")
    ids = prompt(70)
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]
    assert (toolkit.load(back, device="cpu").logits(ids) - expected).abs().max().item() <= 1e-4
    # transformers reads it back: Qwen3-Next's in_proj_qkvz re-fused from llama.cpp's attn_qkv + attn_gate
    reread = type(hf).from_pretrained(back).eval()
    with torch.no_grad():
        assert (reread(ids[None]).logits[0] - expected).abs().max().item() <= 1e-4


# HF weight -> the GGUF tensor its rows land in (both layouts keep whole rows together)
HF_TO_GGUF = {"linear_attn.in_proj_qkv": "attn_qkv", "linear_attn.in_proj_z": "attn_gate",
              "linear_attn.in_proj_b": "ssm_beta", "linear_attn.in_proj_a": "ssm_alpha",
              "linear_attn.in_proj_qkvz": "attn_qkv", "linear_attn.in_proj_ba": "ssm_ba",
              "linear_attn.out_proj": "ssm_out", "linear_attn.conv1d": "ssm_conv1d", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate",
              "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "mlp.gate": "ffn_gate_inp",
              "mlp.experts.gate_up_proj": "ffn_gate_exps", "mlp.experts.down_proj": "ffn_down_exps",
              "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
              "mlp.shared_expert.down_proj": "ffn_down_shexp", "mlp.shared_expert_gate": "ffn_gate_inp_shexp"}


def _file_type(types: dict, hf_name: str) -> str:
    if hf_name == "model.embed_tokens.weight":
        return types["token_embd.weight"]
    if hf_name == "lm_head.weight":
        return types["output.weight"]
    parts = hf_name.split(".")
    module = next(m for m in (".".join(parts[3:6]), ".".join(parts[3:5])) if m in HF_TO_GGUF)
    return types[f"blk.{parts[2]}.{HF_TO_GGUF[module]}.weight"]


def test_q8_0_matches_gguf_py_quantization(source, tmp_path, monkeypatch):
    from toolkit.kernels.gguf_cpu import ops  # noqa: PLC0415

    # the bound below is float32 round-off: keep the CPU kernels' activations float32 (the 60-token
    # prompt would otherwise take the int8 GEMM, whose rounding bound test_gguf_cpu_kernels checks)
    monkeypatch.setattr(ops, "INT8_ACTIVATIONS", False)
    kind, path, hf = source
    dest = _gguf(source, tmp_path, "Q8_0")
    types = {t.name: t.tensor_type.name for t in GGUFReader(str(dest)).tensors}
    assert "Q8_0" in types.values()
    # llama.cpp keeps conv1d kernels F32 (its CUDA ssm_conv aborts on anything else)
    conv = [kind for name, kind in types.items() if name.endswith("ssm_conv1d.weight")]
    assert conv and set(conv) == {"F32"}
    reference = type(hf).from_pretrained(path).eval()
    with torch.no_grad():
        for name, param in reference.named_parameters():
            kind = _file_type(types, name) if param.dim() >= 2 else "F32"
            if kind == "Q8_0":
                packed = quants.quantize(param.numpy(), Q.Q8_0)
                param.copy_(torch.from_numpy(quants.dequantize(packed, Q.Q8_0).reshape(param.shape)))
            elif kind == "F16":  # rows that are not whole Q8_0 blocks fall back to F16
                param.copy_(param.half().float())
    ids = prompt(60)
    with torch.no_grad():
        expected, original = reference(ids[None]).logits[0], hf(ids[None]).logits[0]
    loaded = toolkit.load(dest, device="cpu")
    if kind in MOE_KINDS:  # stacked experts stay packed Q8_0 bytes on the device
        experts = loaded.model.model.layers[0].mlp.experts
        assert experts.gate_up_proj.dtype == torch.uint8 and experts.down_proj.dtype == torch.uint8
    got = loaded.logits(ids)
    assert (got - expected).abs().max().item() <= 2e-5 * expected.abs().max().item() + 1e-5
    assert (got - original).abs().max().item() > 1e-4  # the file really is quantized


@pytest.mark.parametrize("head_dim", [32, 16])  # whole Q8_0 blocks per head: blocks move; else dequantized
def test_value_head_column_reorder_of_packed_tensor(head_dim):
    from toolkit.plugins.loaders.gguf.hybrid import _take_columns, grouped_from_tiled
    from toolkit.plugins.loaders.gguf.tensor import GGUFTensor

    rows, kh, nv = 3, 2, 4
    values = np.random.default_rng(0).standard_normal((rows, nv * head_dim)).astype(np.float32)
    packed = quants.quantize(values, Q.Q8_0)
    tensor = GGUFTensor("t", int(Q.Q8_0), (rows, nv * head_dim), torch.from_numpy(packed.view(np.uint8)))
    order = grouped_from_tiled(kh, nv, head_dim)
    got = _take_columns(tensor, order, head_dim).to_dense()
    expected = torch.from_numpy(quants.dequantize(packed, Q.Q8_0))[:, order]
    torch.testing.assert_close(got, expected, atol=0, rtol=0)


def test_qwen3_next_with_dense_layers_is_refused_by_the_gguf_writer(tmp_path):
    """GGUF qwen3next is all-MoE (llama.cpp builds every layer sparse): dense layers among sparse ones
    cannot be described, and the writer says which field instead of writing another model."""
    from toolkit.core.errors import ConversionError  # noqa: PLC0415

    save_hybrid(tmp_path / "src", "qwen3_next_mixed")
    with pytest.raises(ConversionError, match="mlp_only_layers"):
        convert(tmp_path / "src", tmp_path / "out.gguf", to="gguf:F32")
    assert not (tmp_path / "out.gguf").exists()
