"""Mixture-of-experts through GGUF: ``toolkit convert`` HF -> GGUF (stacked ``ffn_*_exps``, llama.cpp's
names and metadata), the GGUF loaded with experts kept packed, and GGUF -> HF loaded by transformers.

Oracles: transformers' forward on the original random model (F32 exact; Q8_0 / Q4_K within
quantization tolerance), and gguf-py's reader for names, types and metadata.
"""
from __future__ import annotations

import pytest
import torch
import transformers as tf
from gguf import GGUFReader

import toolkit
from moe_fixtures import VOCAB, save_moe_model
from toolkit.core.convert import convert

# all layers sparse (llama.cpp's qwen2moe/qwen3moe have no dense layers); rows of 256 for K-quants
KINDS = {
    "qwen3_moe": dict(kind="qwen3_moe", mlp_only_layers=[], hidden=256, expert_ffn=256, layers=2),
    "qwen2_moe": dict(kind="qwen2_moe", decoder_sparse_step=1, hidden=256, expert_ffn=256, layers=2,
                      shared_expert_intermediate_size=256),
    "mixtral": dict(kind="mixtral", hidden=256, expert_ffn=256, layers=2),
}
ARCH = {"qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe", "mixtral": "llama"}
IDS = torch.randint(0, VOCAB, (19,), generator=torch.Generator().manual_seed(1))


@pytest.fixture(autouse=True)
def float_activations(monkeypatch):
    """These bounds are float32 round-off: the compiled CPU GGUF kernels keep float32 activations
    (their default 8-bit ones, GEMV and int8 GEMM, have bound tests in test_gguf_cpu_kernels)."""
    from toolkit.kernels.gguf_cpu import ops  # noqa: PLC0415

    monkeypatch.setattr(ops, "INT8_ACTIVATIONS", False)


@pytest.fixture(scope="module", params=list(KINDS))
def source(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    reference = save_moe_model(path / "hf", **KINDS[request.param])
    with torch.no_grad():
        expected = reference(IDS[None]).logits[0]
    return request.param, path, reference, expected


def _gguf(source, kind: str):
    name, path, _, _ = source
    dest = path / f"{kind}.gguf"
    if not dest.exists():
        convert(path / "hf", dest, to=f"gguf:{kind}")
    return dest


def test_f32_gguf_logits_match_transformers(source):
    name, _, _, expected = source
    loaded = toolkit.load(str(_gguf(source, "F32")), device="cpu")
    assert (loaded.logits(IDS) - expected).abs().max().item() <= 1e-4
    assert loaded.arch.name == name


def test_file_has_llama_cpp_names_and_metadata(source):
    name, _, reference, _ = source
    reader = GGUFReader(_gguf(source, "Q8_0"))
    arch = ARCH[name]
    fields = {f.name: f.contents() for f in reader.fields.values()}
    config = reference.config
    assert fields["general.architecture"] == arch
    assert fields[f"{arch}.expert_count"] == 4 and fields[f"{arch}.expert_used_count"] == 2
    tensors = {t.name: t for t in reader.tensors}
    gate = tensors["blk.0.ffn_gate_exps.weight"]
    assert gate.tensor_type.name == "Q8_0" and list(gate.shape) == [256, 256, 4]  # ggml order: {H, I, E}
    assert list(tensors["blk.1.ffn_down_exps.weight"].shape) == [256, 256, 4]
    assert tensors["blk.0.ffn_gate_inp.weight"].tensor_type.name == "F32"  # routers stay F32
    if name != "mixtral":
        assert fields[f"{arch}.expert_feed_forward_length"] == config.moe_intermediate_size
    if name == "qwen2_moe":
        assert fields[f"{arch}.expert_shared_feed_forward_length"] == 256
        assert tensors["blk.0.ffn_gate_inp_shexp.weight"].tensor_type.name == "F32"
        assert "blk.0.ffn_up_shexp.weight" in tensors


# GGUF leaf -> transformers parameter inside model.layers.{i} (the test's own table, for the oracle)
HF_LEAVES = {"attn_norm": "input_layernorm.weight", "ffn_norm": "post_attention_layernorm.weight",
             "attn_q": "self_attn.q_proj.weight", "attn_k": "self_attn.k_proj.weight",
             "attn_v": "self_attn.v_proj.weight", "attn_output": "self_attn.o_proj.weight",
             "attn_q_norm": "self_attn.q_norm.weight", "attn_k_norm": "self_attn.k_norm.weight",
             "ffn_gate_inp": "mlp.gate.weight", "ffn_down_exps": "mlp.experts.down_proj",
             "ffn_gate_shexp": "mlp.shared_expert.gate_proj.weight", "ffn_up_shexp": "mlp.shared_expert.up_proj.weight",
             "ffn_down_shexp": "mlp.shared_expert.down_proj.weight",
             "ffn_gate_inp_shexp": "mlp.shared_expert_gate.weight"}
GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
          "output.weight": "lm_head.weight"}


def _dequantized_state(path, config, *, permuted: bool) -> dict[str, torch.Tensor]:
    """The file's values dequantized by gguf-py, under transformers' (stacked) names."""
    from gguf.quants import dequantize  # noqa: PLC0415

    state, halves = {}, {}
    for tensor in GGUFReader(path).tensors:
        values = torch.from_numpy(dequantize(tensor.data, tensor.tensor_type).copy()).float()
        parts = tensor.name.split(".")
        if tensor.name in GLOBAL:
            state[GLOBAL[tensor.name]] = values
            continue
        layer, leaf, kind = parts[1], parts[2], parts[3]
        if permuted and leaf in ("attn_q", "attn_k"):  # llama.cpp's interleaved rotary rows, undone
            heads = config.num_attention_heads if leaf == "attn_q" else config.num_key_value_heads
            values = values.reshape(heads, -1, 2, values.shape[-1]).transpose(1, 2).reshape(values.shape)
        if leaf in ("ffn_gate_exps", "ffn_up_exps"):
            halves.setdefault(layer, {})[leaf] = values
            if len(halves[layer]) == 2:
                state[f"model.layers.{layer}.mlp.experts.gate_up_proj"] = torch.cat(
                    [halves[layer]["ffn_gate_exps"], halves[layer]["ffn_up_exps"]], dim=1)
            continue
        name = HF_LEAVES[leaf] if kind == "weight" else HF_LEAVES[leaf].replace(".weight", ".bias")
        state[f"model.layers.{layer}.{name}"] = values.reshape(1, -1) if leaf == "ffn_gate_inp_shexp" else values
    return state


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_K"])
def test_quantized_experts_stay_packed_and_match_their_dequantized_values(source, kind):
    """Exactly transformers over gguf-py's dequantized weights; and close to the unquantized model."""
    name, _, reference, expected = source
    path = _gguf(source, kind)
    loaded = toolkit.load(str(path), device="cpu")
    experts = loaded.model.model.layers[0].mlp.experts
    assert experts.gate_up_proj.dtype == torch.uint8 and len(experts.gate_up_proj.segments) == 1
    oracle = type(reference)(reference.config).eval()
    oracle.load_state_dict(_dequantized_state(path, reference.config, permuted=name == "mixtral"), strict=True)
    with torch.no_grad():
        dequantized = oracle(IDS[None]).logits[0]
    got = loaded.logits(IDS)
    assert (got - dequantized).abs().max().item() <= 1e-4
    assert (got - expected).abs().max().item() / expected.abs().max().item() <= (0.02 if kind == "Q8_0" else 0.25)


def test_gguf_to_hf_loads_in_transformers(source):
    name, path, _, expected = source
    dest = path / "back"
    convert(_gguf(source, "F32"), dest, to="safetensors")
    model = tf.AutoModelForCausalLM.from_pretrained(dest, dtype=torch.float32).eval()
    with torch.no_grad():
        got = model(IDS[None]).logits[0]
    assert (got - expected).abs().max().item() <= 1e-4
