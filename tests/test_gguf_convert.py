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

import fnmatch
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers as tf
from gguf import GGMLQuantizationType as Q, GGUFReader, quants
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

import toolkit
from gguf_fixtures import corpus
from toolkit.core.convert import ConvertOptions, convert
from toolkit.core.errors import ConversionError
from toolkit.plugins.loaders.gguf import writer as writer_module
from toolkit.plugins.loaders.gguf.tokenizer import QWEN2_SPLIT

TOLERANCE = 2e-5
SIZES = dict(hidden_size=256, intermediate_size=512, max_position_embeddings=256, rms_norm_eps=1e-6)
TEXTS = ["Hello world", " leading space", "  two  spaces   here", "kalomi nerusa tovipe", "digits 1234567 3.14",
         "unicode: héllo ñ 日本語", "emoji 😀🚀", "tabs\tand\nnewlines\n\nend",
         "<|im_start|>user\nhi<|im_end|>", "<s> inner </s>", ""]
CHAT = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


@pytest.fixture(autouse=True)
def float_activations(monkeypatch):
    """The logits bounds here are float32 round-off: the compiled CPU kernels keep float32
    activations (their default 8-bit ones, GEMV and int8 GEMM, have bound tests of their own in
    test_gguf_cpu_kernels)."""
    from toolkit.kernels.gguf_cpu import ops  # noqa: PLC0415

    monkeypatch.setattr(ops, "INT8_ACTIVATIONS", False)


# ---- sources --------------------------------------------------------------------------------------

def sentencepiece_tokenizer(*, gemma: bool) -> tf.PreTrainedTokenizerFast:
    """A BPE vocabulary with byte fallback, as Llama 2 (Metaspace, prefix space) or Gemma
    (spaces replaced by a normalizer, no prefix) spell it: specials, 256 byte tokens, pieces."""
    specials = ["<pad>", "</s>", "<s>", "<unk>"] if gemma else ["<unk>", "<s>", "</s>"]
    backend = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    if gemma:
        backend.normalizer = normalizers.Replace(" ", "\u2581")  # and no pre-tokenizer: pieces may span spaces
    else:
        backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    backend.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
                                        + ([] if gemma else [decoders.Strip(" ", 1, 0)]))
    alphabet = [f"<0x{b:02X}>" for b in range(256)]
    lines = corpus() + ["  indented", "    deeper", "a  b   c"] * 20
    backend.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=1000, special_tokens=specials + alphabet,
                                                            show_progress=False))
    bos = ("<s>", specials.index("<s>"))
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[bos])
    return tf.PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                      pad_token="<pad>" if gemma else None)


def byte_level_tokenizer() -> tf.PreTrainedTokenizerFast:
    """Qwen2-style byte-level BPE: Qwen2's split regex, chat specials, no BOS."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    backend.train_from_iterator(corpus(), trainers.BpeTrainer(vocab_size=1000, special_tokens=specials,
                                                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                              show_progress=False))
    return tf.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                      chat_template=CHAT)


def hf_model(kind: str, tokenizer):
    ids = dict(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id)
    if kind == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(**SIZES, **ids, num_hidden_layers=2, num_attention_heads=4,
                                                  num_key_value_heads=2, tie_word_embeddings=False))
    if kind == "qwen2":
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(**SIZES, **ids, num_hidden_layers=2, num_attention_heads=4,
                                                  num_key_value_heads=2, tie_word_embeddings=True))
    # transformers' GGUF Gemma 3 keeps query_pre_attn_scalar at 256, so head_dim is 256; six layers
    # with a window of 4 give five sliding layers and one global one (intermediate 256 keeps it quick)
    sizes = {**SIZES, "intermediate_size": 256}
    return tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(**sizes, **ids, num_hidden_layers=6, num_attention_heads=2,
                                                    num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                                                    sliding_window=4))


def randomize(model, *, embed_std: float = 0.08):
    """Every parameter re-drawn (transformers starts norms and biases at constants); Gemma's
    embeddings are scaled by sqrt(hidden) in the model, hence its smaller ``embed_std``."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            std = 0.3 if "norm" in name else embed_std if "embed" in name else 0.08
            param.copy_(torch.randn(param.shape, generator=generator) * std)
    return model.eval()


def save_source(path: Path, kind: str):
    tokenizer = {"llama": lambda: sentencepiece_tokenizer(gemma=False), "qwen2": byte_level_tokenizer,
                 "gemma3": lambda: sentencepiece_tokenizer(gemma=True)}[kind]()
    model = randomize(hf_model(kind, tokenizer), embed_std=0.1 / 16 if kind == "gemma3" else 0.08)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model, tokenizer


@pytest.fixture(scope="module", params=["llama", "qwen2", "gemma3"])
def source(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param) / "hf"
    model, tokenizer = save_source(path, request.param)
    return request.param, path, model, tokenizer


# ---- helpers --------------------------------------------------------------------------------------
def prompt(tokenizer) -> list[int]:
    return tokenizer("kalomi nerusa tovipe ka lo mi ne ru sa")["input_ids"][:12]


def logits_of(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def transformers_gguf(path: Path):
    return tf.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()


def relative_error(ours: torch.Tensor, expected: torch.Tensor) -> float:
    return (ours - expected).abs().max().item() / expected.abs().max().item()


def gguf_types(path: Path) -> dict[str, str]:
    return {t.name: t.tensor_type.name for t in GGUFReader(str(path)).tensors}


def rms_error(ours: torch.Tensor, expected: torch.Tensor) -> float:
    return ((ours - expected).norm() / expected.norm()).item()


def quantized_reference(model, qtype: Q):
    """The model with each 2-D weight replaced by gguf-py's ``qtype`` round trip of it."""
    import copy

    quantized = copy.deepcopy(model)
    with torch.no_grad():
        for param in quantized.parameters():
            if param.ndim == 2:
                param.copy_(torch.from_numpy(quants.dequantize(quants.quantize(param.numpy(), qtype), qtype)))
    return quantized


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


# ---- recipes, overrides, fallbacks ---------------------------------------------------------------
def test_overrides_first_match_wins(tmp_path):
    save_source(tmp_path / "hf", "llama")
    overrides = (("*.layers.0.mlp.down_proj.weight", "F16"), ("*.down_proj.weight", "Q8_0"),
                 ("blk.*.attn_v.weight", "q5_1"))
    convert(tmp_path / "hf", tmp_path / "m.gguf", to="gguf:Q4_0",
            options=ConvertOptions(overrides=overrides))
    types = gguf_types(tmp_path / "m.gguf")
    assert types["blk.0.ffn_down.weight"] == "F16" and types["blk.1.ffn_down.weight"] == "Q8_0"
    assert types["blk.0.attn_v.weight"] == types["blk.1.attn_v.weight"] == "Q5_1"
    assert types["blk.0.attn_q.weight"] == types["output.weight"] == "Q4_0"


def test_rows_that_do_not_fit_fall_back(tmp_path):
    """hidden 64 cannot hold Q4_K's 256-element blocks (-> Q5_0); rows of 80 not even 32 (-> F16)."""
    config = tf.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=80, num_hidden_layers=1,
                            num_attention_heads=4, num_key_value_heads=2)
    model = randomize(tf.LlamaForCausalLM(config))
    model.save_pretrained(tmp_path / "hf")
    result = convert(tmp_path / "hf", tmp_path / "m.gguf", to="gguf:Q4_K")
    types = gguf_types(tmp_path / "m.gguf")
    assert types["blk.0.attn_q.weight"] == "Q5_0" and types["blk.0.ffn_down.weight"] == "F16"
    assert "blk.0.ffn_down.weight: Q4_K -> F16 (rows of 80 are not whole Q4_K blocks)" in result.facts["fallbacks"]
    assert len(result.facts["fallbacks"]) == sum(1 for name in types if not name.endswith("norm.weight"))
    assert any("no tokenizer" in note for note in result.facts["notes"])
    summary = "\n".join(result.summary_lines())  # what `toolkit convert` prints
    assert "fallbacks     blk.0.ffn_down.weight: Q4_K -> F16" in summary and "tensor types  " in summary
    ids = list(range(3, 15))
    assert relative_error(toolkit.load(str(tmp_path / "m.gguf"), device="cpu").logits(ids),
                          logits_of(model, ids)) < 0.25


def test_recipe_reproduces_llama_cpp_on_its_own_q4_k_m_file():
    """The embedded Gemma 3 270M Q4_K_M was quantized by llama.cpp: our plan gives every tensor its type."""
    from toolkit.plugins.loaders.gguf.loader import demo_model_path
    from toolkit.plugins.loaders.gguf.reader import open_reader  # gguf-py's reader, with fast array parsing
    from toolkit.plugins.loaders.gguf.recipes import TypePlan

    try:
        path = demo_model_path()
    except toolkit.ToolkitError:
        pytest.skip("the demo model package is not installed")
    reader = open_reader(path)
    layers = int(reader.fields["gemma3.block_count"].contents())
    plan = TypePlan("Q4_K_M", (), num_layers=layers, tied="output.weight" not in {t.name for t in reader.tensors})
    for tensor in reader.tensors:
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        assert plan.choose(tensor.name, tensor.name, shape).qtype == tensor.tensor_type, tensor.name


# ---- errors and atomicity ------------------------------------------------------------------------
def test_interrupted_conversion_leaves_nothing(tmp_path, monkeypatch):
    save_source(tmp_path / "hf", "qwen2")
    real, calls = writer_module.quantize, []

    def interrupt_midway(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt  # what Ctrl-C delivers mid-conversion
        return real(*args, **kwargs)

    monkeypatch.setattr(writer_module, "quantize", interrupt_midway)
    with pytest.raises(KeyboardInterrupt):
        convert(tmp_path / "hf", tmp_path / "m.gguf", to="gguf:Q4_K_M")
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]


def test_bad_requests_fail_before_writing(tmp_path):
    save_source(tmp_path / "hf", "llama")
    with pytest.raises(ConversionError, match="Q3_K_XL"):
        convert(tmp_path / "hf", tmp_path / "a.gguf", to="gguf:Q3_K_XL")
    with pytest.raises(ConversionError, match="IQ2_XS"):
        convert(tmp_path / "hf", tmp_path / "b.gguf", to="gguf:Q8_0",
                options=ConvertOptions(overrides=(("*", "IQ2_XS"),)))
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]


def test_config_gguf_cannot_express_is_refused(tmp_path):
    """llama.cpp fixes Gemma 3's query scale to head_dim ** -0.5: another value would load as another model."""
    config = tf.Gemma3TextConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=24)
    tf.Gemma3ForCausalLM(config).save_pretrained(tmp_path / "hf")
    with pytest.raises(ConversionError, match="query_pre_attn_scalar"):
        convert(tmp_path / "hf", tmp_path / "m.gguf", to="gguf:F16")
    assert not (tmp_path / "m.gguf").exists()


def test_non_finite_weights_are_refused(tmp_path):
    model = randomize(tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96,
                                                         num_hidden_layers=1, num_attention_heads=4)))
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight[3, 5] = float("nan")
    model.save_pretrained(tmp_path / "hf")
    with pytest.raises(ConversionError, match="up_proj"):
        convert(tmp_path / "hf", tmp_path / "m.gguf", to="gguf:Q8_0")
    assert not (tmp_path / "m.gguf").exists()
