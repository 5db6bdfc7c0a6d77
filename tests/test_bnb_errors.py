"""Bad bitsandbytes input -> typed errors that name the tensor (and file) at fault.

The checkpoints are toolkit-saved bnb checkpoints (see test_bnb_save) with one tensor tampered with.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import toolkit
from toolkit.core import errors
from toolkit.plugins.loaders.bnb import BnbLoader

O_PROJ = "model.layers.0.self_attn.o_proj"


@pytest.fixture(scope="module")
def saved(tiny_llama, tmp_path_factory):
    """nf4 with double quant, and int8, each written once."""
    root = tmp_path_factory.mktemp("bnb-errors")
    for name, spec in (("nf4", "bnb-nf4:double_quant=true"), ("int8", "bnb-int8")):
        BnbLoader().save(toolkit.load(tiny_llama.path, quant=spec, device="cpu"), root / name)
    return root


def _tampered(saved, tmp_path, kind, change):
    path = tmp_path / kind
    shutil.copytree(saved / kind, path)
    tensors = load_file(path / "model.safetensors")
    change(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return path


def _set_state(tensors, key, **fields):
    state_key = f"{O_PROJ}.weight.quant_state.bitsandbytes__nf4"
    meta = json.loads(bytes(tensors[state_key].tolist()))
    meta.update(fields)
    tensors[state_key] = torch.tensor(list(json.dumps(meta).encode()), dtype=torch.uint8)


def _rename(tensors, old, new):
    tensors[new] = tensors.pop(old)


CASES = {
    "state shape differs from the layer": ("nf4", lambda t: _set_state(t, None, shape=[32, 128]),
                                           errors.ShapeMismatchError, f"{O_PROJ}.weight"),
    "state shape differs from the data": ("nf4", lambda t: _set_state(t, None, shape=[64, 32]),
                                          errors.ShapeMismatchError, f"{O_PROJ}.weight"),
    "missing absmax": ("nf4", lambda t: t.pop(f"{O_PROJ}.weight.absmax"), errors.MissingTensorError,
                       f"{O_PROJ}.weight.absmax"),
    "missing nested absmax": ("nf4", lambda t: t.pop(f"{O_PROJ}.weight.nested_absmax"), errors.MissingTensorError,
                              f"{O_PROJ}.weight.nested_absmax"),
    "missing quant_state": ("nf4", lambda t: t.pop(f"{O_PROJ}.weight.quant_state.bitsandbytes__nf4"),
                            errors.MissingTensorError, f"{O_PROJ}.weight.quant_state"),
    "unknown quant type": ("nf4", lambda t: _rename(t, f"{O_PROJ}.weight.quant_state.bitsandbytes__nf4",
                                                    f"{O_PROJ}.weight.quant_state.bitsandbytes__nf3"),
                           errors.UnsupportedQuantTypeError, "bitsandbytes__nf3"),
    "statistics without a weight": ("nf4", lambda t: t.pop(f"{O_PROJ}.weight"), errors.CheckpointError,
                                    f"{O_PROJ}.weight"),
    "missing SCB": ("int8", lambda t: t.pop(f"{O_PROJ}.SCB"), errors.MissingTensorError, f"{O_PROJ}.SCB"),
    "SCB of the wrong length": ("int8", lambda t: t.update({f"{O_PROJ}.SCB": t[f"{O_PROJ}.SCB"][:5]}),
                                errors.ShapeMismatchError, f"{O_PROJ}.SCB"),
    "unknown int8 layout": ("int8", lambda t: t.update({f"{O_PROJ}.weight_format": torch.tensor(1, dtype=torch.uint8)}),
                            errors.UnsupportedQuantTypeError, f"{O_PROJ}.weight_format"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_tensors_raise_typed_errors_naming_the_tensor(saved, tmp_path, case):
    kind, change, error, tensor_name = CASES[case]
    path = _tampered(saved, tmp_path, kind, change)
    with pytest.raises(error) as info:
        toolkit.load(path, device="cpu")
    assert tensor_name in str(info.value) and "model.safetensors" in str(info.value)


def test_unknown_quant_type_in_config(saved, tmp_path):
    path = tmp_path / "nf4"
    shutil.copytree(saved / "nf4", path)
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"]["bnb_4bit_quant_type"] = "nf3"
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(errors.UnsupportedQuantTypeError, match="nf3"):
        toolkit.load(path, device="cpu")


def test_unknown_bnb_name(tiny_llama):
    with pytest.raises(errors.UnknownNameError, match="bnb-nf4"):  # lists the names that exist
        toolkit.load(tiny_llama.path, quant="bnb-nf3", device="cpu")


@pytest.mark.parametrize("spec", ["bnb-nf4:block_size=100", "bnb-nf4:double_quant=maybe",
                                  "bnb-int8:threshold=high", "bnb-fp4:colour=blue", "bnb-nf4:block_size"])
def test_bad_specs(tiny_llama, spec):
    with pytest.raises(errors.UnsupportedQuantTypeError, match="--quant"):
        toolkit.load(tiny_llama.path, quant=spec, device="cpu")


def test_quant_on_a_prequantized_checkpoint_is_refused(saved):
    with pytest.raises(errors.CheckpointError, match="already quantized"):
        toolkit.load(saved / "nf4", quant="bnb-int8", device="cpu")
