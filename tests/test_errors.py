"""Bad input gets a typed error that names the file and the tensor."""
from __future__ import annotations

import json
import pickle

import pytest
import torch
from safetensors.torch import load_file, save_file

import toolkit
from hf_fixtures import save_hf_model
from toolkit.core import errors


@pytest.fixture()
def model_dir(tmp_path):
    save_hf_model(tmp_path, kind="llama")
    return tmp_path


def _rewrite(model_dir, edit):
    path = model_dir / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})
    return path


def test_missing_tensor(model_dir):
    path = _rewrite(model_dir, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(errors.MissingTensorError) as info:
        toolkit.load(model_dir, device="cpu")
    assert "model.layers.1.mlp.gate_up_proj.weight" in str(info.value) and "shards [1]" in str(info.value)
    assert str(path) in str(info.value)


def test_unexpected_tensor(model_dir):
    path = _rewrite(model_dir, lambda t: t.update({"model.layers.0.mystery.weight": torch.zeros(3)}))
    with pytest.raises(errors.UnexpectedTensorError) as info:
        toolkit.load(model_dir, device="cpu")
    assert info.value.tensor == "model.layers.0.mystery.weight" and info.value.file == str(path)


def test_shape_mismatch(model_dir):
    name = "model.layers.0.self_attn.k_proj.weight"
    _rewrite(model_dir, lambda t: t.update({name: torch.zeros(7, 64)}))
    with pytest.raises(errors.ShapeMismatchError) as info:
        toolkit.load(model_dir, device="cpu")
    assert info.value.tensor == name and "(7, 64)" in str(info.value)


def test_corrupt_safetensors_header(model_dir):
    path = model_dir / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:40] = b"{not json at all, really not js"  # header starts after the 8-byte length
    path.write_bytes(bytes(data))
    with pytest.raises(errors.CorruptFileError) as info:
        toolkit.load(model_dir, device="cpu")
    assert str(path) in str(info.value)


def test_truncated_safetensors(model_dir):
    path = model_dir / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(errors.CorruptFileError):
        toolkit.load(model_dir, device="cpu")


class _Payload:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_pickled_objects_in_bin_are_refused(model_dir, capsys):
    (model_dir / "model.safetensors").unlink()
    with open(model_dir / "pytorch_model.bin", "wb") as handle:
        pickle.dump({"model.embed_tokens.weight": _Payload()}, handle)
    with pytest.raises(errors.UnsafeCheckpointError) as info:
        toolkit.load(model_dir, device="cpu")
    assert "pytorch_model.bin" in str(info.value)
    assert "this must never run" not in capsys.readouterr().out


def test_unknown_architecture_lists_known(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    config.update(architectures=["FancyNewForCausalLM"], model_type="fancy")
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(errors.UnknownArchitectureError) as info:
        toolkit.load(model_dir, device="cpu")
    assert "FancyNewForCausalLM" in str(info.value)
    assert "LlamaForCausalLM" in info.value.known and "qwen3" in info.value.known


def test_missing_config_key(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    del config["hidden_size"]
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(errors.MissingMetadataError) as info:
        toolkit.load(model_dir, device="cpu")
    assert "hidden_size" in str(info.value)


def test_nonexistent_source():
    with pytest.raises(errors.SourceError):
        toolkit.load("./no/such/model", device="cpu")


def test_unknown_quant_scheme(model_dir):
    with pytest.raises(errors.UnknownNameError) as info:
        toolkit.load(model_dir, device="cpu", quant="int3-magic")
    assert "unquantized" in str(info.value)
