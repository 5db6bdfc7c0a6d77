"""Saving a toolkit model quantized with bnb-* as transformers' pre-quantized checkpoint layout.

Oracle: transformers loading what we wrote (its own bitsandbytes deserialization) must give
our logits (ATOL 1e-6: identical packed data, float32 summation order only; see
test_bnb_onthefly), and toolkit must read it back bit-identically.
"""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import transformers as tf

import toolkit
from toolkit.core.convert import convert
from toolkit.core.errors import ConversionError
from toolkit.core.parallel import ParallelContext
from toolkit.plugins.loaders.bnb import BnbLoader

from test_bnb_fixtures import PROMPT, hf_quantized_checkpoint, needs_accelerate

ATOL = 1e-6
SPECS = ["bnb-nf4", "bnb-fp4:double_quant=true,block_size=128", "bnb-int8"]


@pytest.mark.parametrize("spec", SPECS)
def test_saved_checkpoint_reloads_identically(tiny_llama, tmp_path, spec):
    ours = toolkit.load(tiny_llama.path, quant=spec, device="cpu")
    BnbLoader().save(ours, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "bitsandbytes"
    again = toolkit.load(tmp_path / "out", device="cpu")
    assert (again.report.format, again.report.scheme) == ("bnb", "bnb")
    torch.testing.assert_close(again.logits(PROMPT[:8]), ours.logits(PROMPT[:8]), rtol=0, atol=0)
    assert again.tokenizer is not None and again.tokenizer.decode(PROMPT[:8]) == ours.tokenizer.decode(PROMPT[:8])


@needs_accelerate
@pytest.mark.parametrize("spec", SPECS)
def test_transformers_loads_our_checkpoint(tiny_llama, tmp_path, spec):
    ours = toolkit.load(tiny_llama.path, quant=spec, device="cpu")
    BnbLoader().save(ours, tmp_path / "out")
    hf = hf_quantized_checkpoint(tmp_path / "out")
    linear = hf.model.layers[0].self_attn.k_proj
    assert type(linear).__name__ == ("Linear8bitLt" if "int8" in spec else "Linear4bit")
    with torch.no_grad():
        reference = hf(torch.tensor([PROMPT[:8]])).logits[0]
    torch.testing.assert_close(ours.logits(PROMPT[:8]), reference, rtol=0, atol=ATOL)


def test_convert_writes_bnb(tiny_llama, tmp_path):
    result = convert(tiny_llama.path, tmp_path / "nf4", to="bnb:nf4:double_quant=true")
    loaded = toolkit.load(result.dest, device="cpu")
    states = loaded.model.model.layers[0].mlp.gate_up_proj.weight.quant_states
    assert [s.quant_type for s in states] == ["nf4", "nf4"] and all(s.nested for s in states)


def test_save_refuses_unquantized_and_sharded_models(tiny_llama, tmp_path):
    with pytest.raises(ConversionError, match="not a bitsandbytes scheme"):
        BnbLoader().save(toolkit.load(tiny_llama.path, device="cpu"), tmp_path / "a")
    quantized = toolkit.load(tiny_llama.path, quant="bnb-nf4", device="cpu")
    with pytest.raises(ConversionError, match="tp=1"):
        BnbLoader().save(dataclasses.replace(quantized, parallel=ParallelContext(0, 2)), tmp_path / "b")


@needs_accelerate
def test_qkv_bias_model_round_trips_through_transformers(tmp_path):
    """Qwen2 has q/k/v biases: fused on load, split again on save."""
    from hf_fixtures import save_hf_model  # noqa: PLC0415

    save_hf_model(tmp_path / "dense", "qwen2")
    ours = toolkit.load(tmp_path / "dense", quant="bnb-nf4", device="cpu")
    config = tf.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)
    hf = hf_quantized_checkpoint(tmp_path / "dense", quantization_config=config)
    with torch.no_grad():
        reference = hf(torch.tensor([PROMPT])).logits[0]
    torch.testing.assert_close(ours.logits(PROMPT), reference, rtol=0, atol=ATOL)
    BnbLoader().save(ours, tmp_path / "out")
    again = hf_quantized_checkpoint(tmp_path / "out")
    with torch.no_grad():
        torch.testing.assert_close(again(torch.tensor([PROMPT])).logits[0], reference, rtol=0, atol=ATOL)


@pytest.mark.parametrize("spec", ["bnb-nf4:double_quant=true", "bnb-int8"])
def test_convert_bnb_checkpoint_to_dense_safetensors(tiny_llama, tmp_path, spec):
    """The streaming converter dequantizes our grouped objects with bitsandbytes (``to_dense``)."""
    quantized = toolkit.load(tiny_llama.path, quant=spec, device="cpu")
    BnbLoader().save(quantized, tmp_path / "bnb")
    convert(tmp_path / "bnb", tmp_path / "dense", to="safetensors")
    dense = toolkit.load(tmp_path / "dense", device="cpu")
    layer = dense.model.model.layers[1].mlp.gate_up_proj
    torch.testing.assert_close(layer.weight, quantized.model.model.layers[1].mlp.gate_up_proj.weight.dequantized(),
                               rtol=0, atol=0)
    if "int8" not in spec:  # int8 activations are quantized too, so only the 4-bit logits must agree
        torch.testing.assert_close(dense.logits(PROMPT[:8]), quantized.logits(PROMPT[:8]), rtol=0, atol=ATOL)


@pytest.mark.parametrize("spec", ["bnb-nf4:double_quant=true", "bnb-int8"])
def test_stored_state_round_trip_through_the_sharded_format(tiny_llama, tmp_path, spec):
    """Our parameters carry their quant state through stored_state()/load_stored() bit for bit."""
    from toolkit.core.registry import default_registry  # noqa: PLC0415

    if "sharded" not in default_registry().loaders:
        pytest.skip("the sharded loader plugin is not installed")
    ours = toolkit.load(tiny_llama.path, quant=spec, device="cpu")
    default_registry().loader("sharded").save(ours, tmp_path / "state")
    again = toolkit.load(tmp_path / "state", device="cpu")
    for (name, param), (_, stored) in zip(ours.model.named_parameters(), again.model.named_parameters()):
        expected, found = param.stored_state(), stored.stored_state()
        assert expected.keys() == found.keys(), name
        for part in expected:
            assert torch.equal(expected[part], found[part]), f"{name}:{part}"
    torch.testing.assert_close(again.logits(PROMPT[:8]), ours.logits(PROMPT[:8]), rtol=0, atol=0)
