"""``toolkit convert`` to GGUF: type recipes and overrides, rows that do not fit a type, and bad
requests, interrupted runs and unconvertible configs (typed errors, nothing half-written).
Sources and helpers: gguf_convert_fixtures.py."""
from __future__ import annotations

import pytest
import torch
import transformers as tf

import toolkit
from gguf_convert_fixtures import (float_activations, gguf_types, logits_of, randomize,  # noqa: F401
                                   relative_error, save_source)
from toolkit.core.convert import ConvertOptions, convert
from toolkit.core.errors import ConversionError
from toolkit.plugins.loaders.gguf import writer as writer_module


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
