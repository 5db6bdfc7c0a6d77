"""Tiny random GGUF models: logits through toolkit equal transformers' on the same file.

transformers (``from_pretrained(dir, gguf_file=...)``) dequantizes every tensor with gguf-py
and runs its own modeling code; toolkit keeps the bytes packed and dequantizes inside its
kernels (bit-exact with gguf-py). Both therefore compute with identical float32 weights, and
the only difference is the order of float32 operations across a few layers (fused q/k/v and
gate/up, a different attention kernel): a relative error of ~1e-6 was observed; the bound is
``2e-5 * max |logit|``. A wrong permutation, norm offset, shard order or quant type is O(1).
"""
from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as Q

import toolkit
from gguf_fixtures import Spec, write_model

MIX = {"attn_v": Q.Q6_K, "ffn_up": Q.Q6_K, "ffn_down": Q.Q6_K, "token_embd": Q.Q8_0}  # Q4_K_M-like
K_SIZES = dict(hidden=256, ffn=512)  # K-quant rows need multiples of 256
PROMPT = torch.randint(0, 300, (11,), generator=torch.Generator().manual_seed(0)).tolist()

CASES = {
    "llama-f16": Spec("llama", Q.F16),
    "llama-bf16": Spec("llama", Q.BF16, kv_heads=1),
    "llama-q8_0-tied": Spec("llama", Q.Q8_0, tied=True),
    "llama-q4_0": Spec("llama", Q.Q4_0),
    "llama-q4_1": Spec("llama", Q.Q4_1),
    "llama-q5_0": Spec("llama", Q.Q5_0),
    "llama-q5_1": Spec("llama", Q.Q5_1),
    "llama-q4_k_m": Spec("llama", Q.Q4_K, types=MIX, **K_SIZES),
    "llama-q2_k-q3_k-q5_k": Spec("llama", Q.Q2_K, types={"attn_k": Q.Q3_K, "ffn_gate": Q.Q5_K}, **K_SIZES),
    "qwen2-q8_0": Spec("qwen2", Q.Q8_0, tokenizer="gpt2"),
    "qwen2-q4_k_m-tied": Spec("qwen2", Q.Q4_K, types=MIX, tied=True, tokenizer="gpt2", **K_SIZES),
    "qwen3-q4_0": Spec("qwen3", Q.Q4_0, heads=2, kv_heads=1, head_dim=128, tokenizer="gpt2"),
    "qwen3-f16": Spec("qwen3", Q.F16, heads=2, kv_heads=1, head_dim=128, tokenizer="gpt2"),
    # transformers leaves Gemma 3's query scale at its 256 default, so head_dim is 256 here; six
    # layers with a window of 4 give both sliding and global layers over the 11-token prompt
    "gemma3-q8_0-tied": Spec("gemma3", Q.Q8_0, heads=2, kv_heads=1, head_dim=256, layers=6, tied=True),
    "gemma3-q5_0": Spec("gemma3", Q.Q5_0, heads=2, kv_heads=1, head_dim=256, layers=6),
    "gemma3-q4_k_m-tied": Spec("gemma3", Q.Q4_K, types=MIX, heads=2, kv_heads=1, head_dim=256, layers=6,
                               tied=True, **K_SIZES),
}


@pytest.fixture(autouse=True)
def float_activations(monkeypatch):
    """The logits bound above is float32 round-off, so the compiled CPU kernels keep float32
    activations here; their default 8-bit activations (GEMV and, past 4 tokens, the int8 GEMM)
    have bound tests of their own (test_gguf_cpu_kernels) and the greedy test below runs both."""
    from toolkit.kernels.gguf_cpu import ops  # noqa: PLC0415

    monkeypatch.setattr(ops, "INT8_ACTIVATIONS", False)


def transformers_logits(folder, name: str, ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers(case, tmp_path):
    path = write_model(tmp_path / f"{case}.gguf", CASES[case])
    loaded = toolkit.load(str(path), device="cpu")
    ours = loaded.logits(PROMPT)
    expected = transformers_logits(tmp_path, path.name, PROMPT)
    assert ours.shape == expected.shape
    scale = expected.abs().max().item()
    assert (ours - expected).abs().max().item() <= 2e-5 * scale, case
    assert loaded.report.scheme == "gguf" and loaded.report.format == "gguf"


def test_mixed_types_stay_packed_per_shard(tmp_path):
    """Q4_K_M-style files put Q6_K v beside Q4_K q/k: one parameter, two segments, no dequantized copy."""
    path = write_model(tmp_path / "mix.gguf", CASES["llama-q4_k_m"])
    model = toolkit.load(str(path), device="cpu").model
    qkv = model.model.layers[0].self_attn.qkv_proj.weight
    assert [(s.qtype, s.rows) for s in qkv.segments] == [(Q.Q4_K, 256 + 128), (Q.Q6_K, 128)]
    assert qkv.dtype == torch.uint8
    gate_up = model.model.layers[0].mlp.gate_up_proj.weight
    assert [s.qtype for s in gate_up.segments] == [Q.Q4_K, Q.Q6_K]


def test_device_bytes_are_the_file_bytes(tmp_path):
    """Packed weights on the device take what the file's tensors take (norms included)."""
    path = write_model(tmp_path / "m.gguf", CASES["llama-q4_k_m"])
    loaded = toolkit.load(str(path), device="cpu")
    buffers = sum(b.nbytes for b in loaded.model.buffers())
    assert loaded.report.parameter_bytes - buffers == loaded.report.bytes_read


@pytest.mark.parametrize("int8", [False, True], ids=["float32-activations", "int8-activations"])
def test_generate_matches_transformers_greedy(tmp_path, monkeypatch, int8):
    """Greedy tokens equal transformers' with float32 activations and with the CPU default 8-bit
    ones (the 11-token prompt goes through the int8 GEMM, each new token through the GEMV)."""
    from transformers import AutoModelForCausalLM

    from toolkit.kernels.gguf_cpu import ops  # noqa: PLC0415

    monkeypatch.setattr(ops, "INT8_ACTIVATIONS", int8)
    path = write_model(tmp_path / "g.gguf", CASES["qwen2-q4_k_m-tied"])
    ours = toolkit.load(str(path), device="cpu").generate(PROMPT, max_new_tokens=6, stop_token_ids=[])
    reference = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32).eval()
    expected = reference.generate(torch.tensor([PROMPT]), max_new_tokens=6, min_new_tokens=6, do_sample=False)
    assert ours == expected[0, len(PROMPT):].tolist()


def test_rope_scaling_from_metadata(tmp_path):
    """``{arch}.rope.scaling.*`` becomes HF ``rope_scaling``; transformers' GGUF loader ignores these
    keys, so its config is given the same scaling explicitly."""
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = Spec("llama", Q.Q8_0, metadata={"rope.scaling.type": "linear", "rope.scaling.factor": 4.0})
    path = write_model(tmp_path / "rope.gguf", spec)
    loaded = toolkit.load(str(path), device="cpu")
    assert loaded.config.rope_scaling == {"rope_type": "linear", "factor": 4.0}
    config = AutoConfig.from_pretrained(tmp_path, gguf_file=path.name)
    config.rope_parameters = {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}
    reference = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, config=config,
                                                     dtype=torch.float32).eval()
    with torch.no_grad():
        expected = reference(torch.tensor([PROMPT])).logits[0]
    ours = loaded.logits(PROMPT)
    assert (ours - expected).abs().max().item() <= 2e-5 * expected.abs().max().item()


def test_llama3_rope_scaling_from_rope_freqs(tmp_path):
    """llama.cpp stores Llama 3.1 scaling as ``rope_freqs.weight`` (per-frequency divisors). The
    divisors here come from transformers' own llama3 rope; toolkit must recover the parameters."""
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192, "rope_theta": 10000.0}
    head_dim = 16
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](LlamaConfig(hidden_size=64, num_attention_heads=4,
                                                          rope_parameters=dict(rope)), "cpu")
    plain = 1.0 / 10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim)
    spec = Spec("llama", Q.Q8_0, extra_tensors={"rope_freqs.weight": (plain / scaled).numpy()})
    path = write_model(tmp_path / "llama31.gguf", spec)
    loaded = toolkit.load(str(path), device="cpu")
    assert loaded.config.rope_scaling == {k: v for k, v in rope.items() if k != "rope_theta"}
    config = AutoConfig.from_pretrained(tmp_path, gguf_file=path.name)
    config.rope_parameters = rope
    reference = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, config=config,
                                                     dtype=torch.float32).eval()
    with torch.no_grad():
        expected = reference(torch.tensor([PROMPT])).logits[0]
    assert (loaded.logits(PROMPT) - expected).abs().max().item() <= 2e-5 * expected.abs().max().item()


def test_saved_state_restores_packed_weights(tmp_path):
    """The stored-state protocol (used by the ``sharded`` writer) round-trips packed, mixed-type weights."""
    from toolkit.core.registry import default_registry

    path = write_model(tmp_path / "m.gguf", CASES["llama-q4_k_m"])
    loaded = toolkit.load(str(path), device="cpu")
    default_registry().loader("sharded").save(loaded, str(tmp_path / "saved"))
    restored = toolkit.load(str(tmp_path / "saved"), device="cpu")
    assert restored.report.scheme == "gguf"
    assert [s.qtype for s in restored.model.model.layers[0].self_attn.qkv_proj.weight.segments] == [Q.Q4_K, Q.Q6_K]
    torch.testing.assert_close(restored.logits(PROMPT), loaded.logits(PROMPT), rtol=0, atol=0)
