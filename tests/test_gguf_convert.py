"""``toolkit convert`` to and from GGUF, checked against transformers and gguf-py.

Sources are tiny random transformers models (every parameter re-drawn, norms and biases
included) with real tokenizers saved beside them: a SentencePiece-style Llama (q/k rotary
row permutation), a byte-level Qwen2 (biases, tied head) and a Gemma 3 (``1 + w`` norms,
sliding and global layers, tied head). Sizes are multiples of 256 so K-quants fit.

Tolerances. Logit comparisons use ``2e-5 * max |logit|`` (as test_gguf_models.py): two
implementations computing with the *same* float32 weights differ by float ordering only,
~1e-6 observed. So quantized files are compared with a reference that has the same weights:

* Q8_0: the original model with every 2-D weight replaced by gguf-py's own
  ``dequantize(quantize(W, Q8_0))`` (blocks lie along rows, so llama.cpp's q/k row
  permutation commutes with it). Matching it to 2e-5 shows the file holds exactly gguf-py's
  Q8_0 of the right tensors; the distance to the original model is the quantization error.
* K-quants (which gguf-py cannot produce): transformers reading the very same file (it
  dequantizes with gguf-py and undoes the permutation itself); plus a loose "sane" bound to
  the original model. The quantizers' own accuracy is tested in test_gguf_quantize.py.
* F32 round trips are lossless, so HF -> GGUF F32 must reproduce the original logits to 2e-5.
"""
from __future__ import annotations

from pathlib import Path

import torch
import transformers as tf
from gguf import GGMLQuantizationType as Q

import toolkit
from gguf_convert_fixtures import (SIZES, TEXTS, TOLERANCE, byte_level_tokenizer, float_activations,  # noqa: F401
                                   gguf_types, logits_of, prompt, quantized_reference, randomize, relative_error,
                                   rms_error, save_source, source, transformers_gguf)
from toolkit.core.convert import convert


# ---- HF -> GGUF ----------------------------------------------------------------------------------
def test_f32_round_trip_is_lossless(source, tmp_path):
    kind, path, model, tokenizer = source
    dest = tmp_path / "m.gguf"
    result = convert(path, dest, to="gguf:F32")
    ids = prompt(tokenizer)
    expected = logits_of(model, ids)
    assert relative_error(toolkit.load(str(dest), device="cpu").logits(ids), expected) <= TOLERANCE
    assert relative_error(logits_of(transformers_gguf(dest), ids), expected) <= TOLERANCE
    assert set(gguf_types(dest).values()) == {"F32"}
    assert result.facts["parameters"] == result.num_parameters == sum(
        p.numel() for n, p in model.named_parameters() if n != "lm_head.weight" or not model.config.tie_word_embeddings)


def test_q8_0_matches_gguf_py_quantization(source, tmp_path):
    kind, path, model, tokenizer = source
    dest = tmp_path / "m-q8.gguf"
    result = convert(path, dest, to="gguf:Q8_0")
    ids = prompt(tokenizer)
    reference = logits_of(quantized_reference(model, Q.Q8_0), ids)
    ours = toolkit.load(str(dest), device="cpu").logits(ids)
    theirs = logits_of(transformers_gguf(dest), ids)
    assert relative_error(ours, reference) <= TOLERANCE
    assert relative_error(theirs, reference) <= TOLERANCE
    quantization_error = relative_error(reference, logits_of(model, ids))
    assert 1e-4 < quantization_error < 0.05  # quantized, and only by Q8_0's small error
    types = gguf_types(dest)
    assert all(types[name] == ("F32" if name.endswith(("norm.weight", ".bias")) else "Q8_0") for name in types)
    assert result.facts["tensor_types"] == dict(sorted({t: list(types.values()).count(t) for t in
                                                        set(types.values())}.items()))
    assert 8.5 <= result.facts["bits_per_weight"] < 8.6  # 34 bytes per 32 weights, norms aside


def test_q4_k_m_follows_the_recipe_and_loads(source, tmp_path):
    kind, path, model, tokenizer = source
    dest = tmp_path / "m-q4km.gguf"
    result = convert(path, dest, to="gguf:q4_k_m")
    types = gguf_types(dest)
    # llama.cpp's use_more_bits(i, n): i < n/8, or i >= 7n/8, or (i - n/8) % 3 == 2 (integer division)
    more_bits = ("blk.2.", "blk.5.") if kind == "gemma3" else ("blk.1.",)
    for name, qtype in types.items():
        if name.endswith(("norm.weight", ".bias")):
            expected = "F32"
        elif name == "output.weight" or (name == "token_embd.weight" and kind != "llama"):
            expected = "Q6_K"  # the head (the embedding when tied)
        elif name.startswith(more_bits) and name.endswith(("attn_v.weight", "ffn_down.weight")):
            expected = "Q6_K"
        else:
            expected = "Q4_K"
        assert qtype == expected, name
    assert result.facts["file_type"] == "MOSTLY_Q4_K_M" and not result.facts["fallbacks"]
    ids = prompt(tokenizer)
    ours = toolkit.load(str(dest), device="cpu").logits(ids)
    assert relative_error(ours, logits_of(transformers_gguf(dest), ids)) <= TOLERANCE
    # sane: closer to the original than gguf-py's Q4_0 of it (Q4_0 has Q4_K's 4.5 bits per weight;
    # measured 0.02-0.33 vs 0.06-0.46 relative RMS over three architectures and two seeds)
    original = logits_of(model, ids)
    assert rms_error(ours, original) < rms_error(logits_of(quantized_reference(model, Q.Q4_0), ids), original)
    assert 4.5 < result.facts["bits_per_weight"] < 6.6


def test_f16_loads_close(source, tmp_path):
    kind, path, model, tokenizer = source
    dest = tmp_path / "m-f16.gguf"
    convert(path, dest, to="gguf")  # F16 is the default for a float32 source
    assert {t for n, t in gguf_types(dest).items() if not n.endswith(("norm.weight", ".bias"))} == {"F16"}
    ids = prompt(tokenizer)
    ours = toolkit.load(str(dest), device="cpu").logits(ids)
    assert relative_error(ours, logits_of(transformers_gguf(dest), ids)) <= TOLERANCE
    assert relative_error(ours, logits_of(model, ids)) < 5e-3  # float16 rounding (~5e-4 per weight)


def test_bf16_source_defaults_to_bf16_losslessly(tmp_path):
    model, tokenizer = save_source(tmp_path / "hf", "qwen2")
    model.to(torch.bfloat16).save_pretrained(tmp_path / "hf")
    result = convert(tmp_path / "hf", tmp_path / "m.gguf", to="gguf")
    assert result.facts["gguf_type"] == "BF16" and result.facts["file_type"] == "MOSTLY_BF16"
    assert {t for n, t in gguf_types(tmp_path / "m.gguf").items() if not n.endswith(("norm.weight", ".bias"))} == {"BF16"}
    ids = prompt(tokenizer)
    expected = toolkit.load(str(tmp_path / "hf"), device="cpu", dtype="fp32").logits(ids)
    assert relative_error(toolkit.load(str(tmp_path / "m.gguf"), device="cpu", dtype="fp32").logits(ids),
                          expected) <= TOLERANCE


def test_tokenizer_survives(source, tmp_path):
    kind, path, model, tokenizer = source
    dest = tmp_path / "m.gguf"
    convert(path, dest, to="gguf:Q8_0")
    ours = toolkit.load(str(dest), device="cpu").tokenizer
    theirs = tf.AutoTokenizer.from_pretrained(tmp_path, gguf_file=dest.name)
    for text in TEXTS:
        expected = tokenizer(text)["input_ids"]
        # llama.cpp (which our GGUF tokenizer follows) prefixes "▁" even to text that starts with a
        # space; transformers' Metaspace does not (test_gguf_llamacpp_ids.py checks llama.cpp's ids)
        # and after a special token; Gemma's multi-space pieces are stored as spaces (llama.cpp's
        # convention), which llama.cpp never matches, so runs of spaces split differently too
        if not (kind == "llama" and (text[:1].isspace() or "<s>" in text)) and not (kind == "gemma3" and "  " in text):
            assert ours(text)["input_ids"] == expected, (kind, text)
        assert theirs(text)["input_ids"] == expected, (kind, text)
        assert ours.decode(expected) == tokenizer.decode(expected), (kind, text)
    for attr in ("bos_token", "eos_token", "pad_token"):
        assert getattr(ours, attr) == getattr(tokenizer, attr), attr
    if kind == "qwen2":
        messages = [{"role": "user", "content": "kalomi?"}]
        assert ours.apply_chat_template(messages, tokenize=False) == tokenizer.apply_chat_template(messages,
                                                                                                  tokenize=False)


def _tokenizer_fields(path: Path) -> dict[str, tuple[list, bytes]]:
    from toolkit.plugins.loaders.gguf.reader import open_reader
    from toolkit.plugins.loaders.gguf.writer_passthrough import value_bytes as _value_bytes

    fields = open_reader(path).fields
    return {k: ([int(t) for t in f.types], _value_bytes(f)) for k, f in fields.items() if k.startswith("tokenizer.")}


def test_gguf_requantization_copies_the_tokenizer_fields(source, tmp_path, monkeypatch):
    """GGUF -> GGUF builds no tokenizer: the source's tokenizer.* fields are copied byte for byte
    (building the tokenizer and writing it again re-derives SentencePiece scores from merge ranks,
    which tokenizes the same but is not the source's bytes), and the copy tokenizes as the source."""
    from toolkit.plugins.loaders.gguf import checkpoint as checkpoint_module

    kind, path, model, tokenizer = source
    first = tmp_path / "first.gguf"
    convert(path, first, to="gguf:Q8_0")

    def no_build(metadata):
        raise AssertionError("a tokenizer was built for a GGUF -> GGUF conversion")

    with monkeypatch.context() as patch:
        patch.setattr(checkpoint_module, "build_tokenizer", no_build)
        convert(first, tmp_path / "copied.gguf", to="gguf:Q4_K_M")
    source_fields = _tokenizer_fields(first)
    assert "tokenizer.ggml.tokens" in source_fields
    assert _tokenizer_fields(tmp_path / "copied.gguf") == source_fields
    ours, theirs = (toolkit.load(str(p), device="cpu").tokenizer for p in (tmp_path / "copied.gguf", first))
    for text in TEXTS:
        assert ours(text)["input_ids"] == theirs(text)["input_ids"], (kind, text)


def test_llama3_rope_scaling_travels_as_rope_freqs(tmp_path):
    """llama.cpp keeps Llama 3 rotary scaling in ``rope_freqs.weight``; the reader recovers it from there."""
    tokenizer = byte_level_tokenizer()
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192, "rope_theta": 10_000.0}
    sizes = {**SIZES, "max_position_embeddings": 16384}
    config = tf.LlamaConfig(**sizes, vocab_size=len(tokenizer), num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, rope_parameters=scaling)
    model = randomize(tf.LlamaForCausalLM(config))
    model.save_pretrained(tmp_path / "hf")
    tokenizer.save_pretrained(tmp_path / "hf")
    convert(tmp_path / "hf", tmp_path / "m.gguf", to="gguf:F32")
    assert "rope_freqs.weight" in gguf_types(tmp_path / "m.gguf")
    ids = list(range(3, 60))
    expected = logits_of(model, ids)
    unscaled = randomize(tf.LlamaForCausalLM(tf.LlamaConfig(**{**config.to_dict(), "rope_parameters": {
        "rope_type": "default", "rope_theta": 10_000.0}})))
    assert relative_error(logits_of(unscaled, ids), expected) > 10 * TOLERANCE  # the scaling shows (~30x)
    assert relative_error(toolkit.load(str(tmp_path / "m.gguf"), device="cpu").logits(ids), expected) <= TOLERANCE


# ---- GGUF -> HF ----------------------------------------------------------------------------------
def test_gguf_to_safetensors_keeps_the_gguf_logits(source, tmp_path):
    kind, path, model, tokenizer = source
    gguf_path, hf_path = tmp_path / "m.gguf", tmp_path / "back"
    convert(path, gguf_path, to="gguf:Q5_1")
    convert(gguf_path, hf_path, to="safetensors")
    ids = prompt(tokenizer)
    expected = toolkit.load(str(gguf_path), device="cpu").logits(ids)
    assert relative_error(toolkit.load(str(hf_path), device="cpu").logits(ids), expected) <= TOLERANCE
    reloaded = tf.AutoModelForCausalLM.from_pretrained(hf_path, dtype=torch.float32).eval()
    assert relative_error(logits_of(reloaded, ids), expected) <= TOLERANCE


def test_hf_gguf_hf_restores_the_tensors(source, tmp_path):
    """F32 both ways: q/k rows come back in order and Gemma norms lose their + 1 exactly as added."""
    from safetensors.torch import load_file

    kind, path, model, tokenizer = source
    convert(path, tmp_path / "m.gguf", to="gguf:F32")
    convert(tmp_path / "m.gguf", tmp_path / "back", to="safetensors")
    back = load_file(tmp_path / "back" / "model.safetensors")
    for name, param in model.state_dict().items():
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        torch.testing.assert_close(back[name], param, rtol=0, atol=1e-7 if "norm" in name else 0, msg=name)

