"""Issue 14, the files around the weights: config.json, safetensors index, .bin pickles, sharded and
tensorizer manifests, bnb pre-quantized checkpoints. Each bad file gives a typed error naming it."""
from __future__ import annotations

import json
import zipfile

import pytest
import torch
from safetensors.torch import load_file, save_file

import toolkit
from hardening_fixtures import copy_of, edit_config, typed_failure
from hardening_states import bnb_checkpoint, sharded_state
from hf_fixtures import save_hf_model
from toolkit.core.errors import (CorruptFileError, InvalidConfigError, MissingMetadataError, SourceError,
                                 ToolkitError, UnsafeCheckpointError, UnsupportedQuantTypeError)

INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    save_hf_model(root / "plain", "llama", vocab=128)
    save_hf_model(root / "sharded", "llama", vocab=128, shard_size="60KB")
    save_hf_model(root / "bin", "llama", vocab=128, safe=False)
    return root


# ---- config.json -------------------------------------------------------------------------------------
@pytest.mark.parametrize("content", [b"\xff\xfe{}", b'{"vocab_size": 1\xff}', b"[1, 2]", b'"llama"', b"",
                                     b"{" * 50_000])
def test_config_json_not_utf8_or_not_an_object(seeds, tmp_path, content):
    folder = copy_of(seeds / "plain", tmp_path)
    (folder / "config.json").write_bytes(content)
    typed_failure(folder, names=str(folder / "config.json"), error=CorruptFileError)


# ---- model.safetensors.index.json --------------------------------------------------------------------
def _edit_index(folder, edit):
    path = folder / INDEX
    index = json.loads(path.read_text())
    edit(index)
    path.write_text(json.dumps(index))
    return path


def test_index_that_is_not_json(seeds, tmp_path):
    folder = copy_of(seeds / "sharded", tmp_path)
    (folder / INDEX).write_text('{"weight_map": ')
    typed_failure(folder, names=str(folder / INDEX), error=CorruptFileError)


@pytest.mark.parametrize("weight_map", [..., [], "x", None, {}])
def test_index_without_a_weight_map(seeds, tmp_path, weight_map):
    folder = copy_of(seeds / "sharded", tmp_path)
    path = _edit_index(folder, lambda i: i.pop("weight_map") if weight_map is ... else i.update(weight_map=weight_map))
    typed_failure(folder, names=str(path), error=CorruptFileError, mentions=("weight_map",))


@pytest.mark.parametrize("shard", ["/etc/passwd", "../x.safetensors", "a/../../b.safetensors", "..", 7])
def test_index_entries_outside_the_model_directory_are_refused_unopened(seeds, tmp_path, shard, monkeypatch):
    folder = copy_of(seeds / "sharded", tmp_path)
    name = "model.layers.0.mlp.up_proj.weight"
    path = _edit_index(folder, lambda i: i["weight_map"].__setitem__(name, shard))
    opened = []
    real_open = __import__("safetensors").safe_open
    monkeypatch.setattr("toolkit.plugins.loaders.safetensors.checkpoint.safe_open",
                        lambda p, **kw: opened.append(p) or real_open(p, **kw))
    typed_failure(folder, names=str(path), error=CorruptFileError, mentions=(name,))
    assert not any("passwd" in str(p) or ".." in str(p) for p in opened)


def test_index_naming_a_missing_shard(seeds, tmp_path):
    folder = copy_of(seeds / "sharded", tmp_path)
    _edit_index(folder, lambda i: i["weight_map"].__setitem__("model.norm.weight", "nope.safetensors"))
    typed_failure(folder, names="nope.safetensors", error=SourceError)


def test_index_placing_a_tensor_in_the_wrong_shard(seeds, tmp_path):
    folder = copy_of(seeds / "sharded", tmp_path)
    index = json.loads((folder / INDEX).read_text())["weight_map"]
    name = "model.norm.weight"
    other = next(shard for shard in sorted(set(index.values())) if shard != index[name])
    path = _edit_index(folder, lambda i: i["weight_map"].__setitem__(name, other))
    typed_failure(folder, names=str(path), error=CorruptFileError, mentions=(name, other))


# ---- pytorch_model.bin -------------------------------------------------------------------------------
def _rewrite_bin(folder, edit):
    path = folder / "pytorch_model.bin"
    state = torch.load(path, weights_only=True)
    edit(state)
    torch.save(state, path)
    return path


def test_flipped_byte_in_data_pkl(seeds, tmp_path):
    folder = copy_of(seeds / "bin", tmp_path)
    path = folder / "pytorch_model.bin"
    with zipfile.ZipFile(path) as archive:
        members = [(info, archive.read(info)) for info in archive.infolist()]
    failures = 0
    for spot in range(2, 400, 7):  # many single-byte flips: each one fails typed, or loads
        with zipfile.ZipFile(path, "w") as archive:
            for info, data in members:
                if info.filename.endswith("data.pkl"):
                    data = data[:spot] + bytes([data[spot] ^ 0x41]) + data[spot + 1:]
                archive.writestr(info, data)
        try:
            toolkit.load(str(folder), device="cpu")
        except ToolkitError as exc:
            assert str(path) in str(exc)
            failures += 1
    assert failures > 10  # most flips break the pickle; none may escape untyped


NAME = "model.layers.0.mlp.down_proj.weight"


@pytest.mark.parametrize("kind", ["scalar", "meta", "quantized", "sparse", "integer", "bool", "nested", "list"])
def test_bin_values_that_are_not_weights(seeds, tmp_path, kind):
    folder = copy_of(seeds / "bin", tmp_path)

    def edit(state):
        value = state[NAME]
        state[NAME] = {
            "scalar": lambda: value.reshape(-1)[0].clone(), "meta": lambda: torch.empty(value.shape, device="meta"),
            "quantized": lambda: torch.quantize_per_tensor(value, 0.1, 0, torch.qint8),
            "sparse": lambda: value.to_sparse(), "integer": lambda: value.to(torch.int64),
            "bool": lambda: value.bool(), "nested": lambda: {"w": value}, "list": lambda: [1, 2],
        }[kind]()
    path = _rewrite_bin(folder, edit)
    typed_failure(folder, names=str(path), error=CorruptFileError, mentions=(NAME,))


@pytest.mark.parametrize("key", [7, (1, 2), 2.5])
def test_bin_keys_that_are_not_strings(seeds, tmp_path, key):
    folder = copy_of(seeds / "bin", tmp_path)
    path = _rewrite_bin(folder, lambda state: state.__setitem__(key, state.pop(NAME)))
    typed_failure(folder, names=str(path), error=CorruptFileError, mentions=("not a string",))


def test_bin_that_is_not_a_dict(seeds, tmp_path):
    folder = copy_of(seeds / "bin", tmp_path)
    torch.save([torch.zeros(2)], folder / "pytorch_model.bin")
    typed_failure(folder, names=str(folder / "pytorch_model.bin"), error=UnsafeCheckpointError)


# ---- sharded and tensorizer manifests ----------------------------------------------------------------
@pytest.fixture(scope="module")
def state(seeds, tmp_path_factory):
    from conftest import save_tiny_tokenizer  # noqa: PLC0415

    source = copy_of(seeds / "plain", tmp_path_factory.mktemp("tok"))
    save_tiny_tokenizer(source, vocab_size=128)
    return sharded_state(source, tmp_path_factory.mktemp("state"))


def _edit_manifest(folder, edit, name="toolkit-sharded.json"):
    path = folder / name
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))
    return path


@pytest.mark.parametrize("field", ["tp_size", "ranks", "hf_config", "params_dtype", "architecture"])
def test_manifest_missing_a_field(state, tmp_path, field):
    folder = copy_of(state, tmp_path)
    path = _edit_manifest(folder, lambda m: m.pop(field))
    typed_failure(folder, names=str(path), error=MissingMetadataError, mentions=(field,))


@pytest.mark.parametrize("edit, mention", [
    (lambda m: m.update(tp_size=None), "tp_size"), (lambda m: m.update(tp_size=0), "tp_size"),
    (lambda m: m.update(tp_size="1"), "tp_size"), (lambda m: m.update(ranks={}), "ranks"),
    (lambda m: m.update(ranks=[]), "ranks"), (lambda m: m["ranks"]["0"].update(tensors=[]), "ranks.0.tensors"),
    (lambda m: m["ranks"]["0"].update(files=["../../etc/passwd"]), "ranks.0.files[0]"),
    (lambda m: m["ranks"]["0"]["tensors"][0].update(shape=[-1, 3]), "shape"),
    (lambda m: m["ranks"]["0"]["tensors"][0].update(dtype="float99"), "dtype"),
    (lambda m: m["ranks"]["0"]["tensors"][0].update(file=[1]), "file"),
    (lambda m: m.update(params_dtype="int8"), "params_dtype"), (lambda m: m.update(hf_config=[1]), "hf_config"),
    (lambda m: m.update(tokenizer_files=["../../etc/passwd"]), "tokenizer_files[0]"),
    (lambda m: m.update(tokenizer_files=["missing.json"]), "tokenizer_files[0]"),
    (lambda m: m.update(tokenizer_files="tokenizer.json"), "tokenizer_files"),
    (lambda m: m["hf_config"].update(num_hidden_layers=10**6), "num_hidden_layers"),
])
def test_manifest_with_bad_values(state, tmp_path, edit, mention):
    folder = copy_of(state, tmp_path)
    path = _edit_manifest(folder, edit)
    typed_failure(folder, names=str(path), mentions=(mention,))


@pytest.mark.parametrize("content", [b"\xff garbage", b'{"version": "1.0"}', b"[]"])
def test_bogus_tokenizer_files(state, tmp_path, content):
    folder = copy_of(state, tmp_path)
    (folder / "tokenizer.json").write_bytes(content)
    typed_failure(folder, names=str(folder), error=CorruptFileError, mentions=("tokenizer",))


@pytest.fixture(scope="module")
def tensorizer_state(seeds, tmp_path_factory):
    pytest.importorskip("tensorizer")
    return sharded_state(seeds / "plain", tmp_path_factory.mktemp("tz"), loader="tensorizer")


@pytest.mark.parametrize("edit, mention", [
    (lambda m: m.update(tp_size=None), "tp_size"), (lambda m: m.update(ranks={"0": {}}), "ranks.0"),
    (lambda m: m["hf_config"].update(hidden_act=["silu"]), "hidden_act"),
])
def test_tensorizer_manifest_with_bad_values(tensorizer_state, tmp_path, edit, mention):
    folder = copy_of(tensorizer_state, tmp_path)
    path = _edit_manifest(folder, edit, name="toolkit-tensorizer.json")
    typed_failure(folder, names=str(path), mentions=(mention,))


def test_tensorizer_file_damage(tensorizer_state, tmp_path):
    folder = copy_of(tensorizer_state, tmp_path)
    data_file = next(folder.glob("*.tensors"))
    data_file.write_bytes(data_file.read_bytes()[:1000])
    typed_failure(folder, names=str(folder))


# ---- bnb pre-quantized checkpoints -------------------------------------------------------------------
@pytest.fixture(scope="module")
def bnb(seeds, tmp_path_factory):
    pytest.importorskip("bitsandbytes")
    return bnb_checkpoint(seeds / "plain", tmp_path_factory.mktemp("bnb"))


def _edit_quant_state(folder, edit):
    path = folder / "model.safetensors"
    tensors = load_file(path)
    name = next(n for n in sorted(tensors) if ".quant_state." in n)
    meta = json.loads(bytes(tensors[name].tolist()).decode())
    edit(meta)
    tensors[name] = torch.tensor(list(json.dumps(meta).encode()), dtype=torch.uint8)
    save_file(tensors, path, metadata={"format": "pt"})
    return path


@pytest.mark.parametrize("edit", [lambda m: m.update(blocksize=0), lambda m: m.update(blocksize="64"),
                                  lambda m: m.update(shape=[-4, 64]), lambda m: m.update(shape=["a", 2]),
                                  lambda m: m.update(dtype="float99"), lambda m: m.update(quant_type="nf5"),
                                  lambda m: m.pop("shape")])
def test_bnb_quant_state_values(bnb, tmp_path, edit):
    folder = copy_of(bnb, tmp_path)
    path = _edit_quant_state(folder, edit)
    typed_failure(folder, names=str(path))


@pytest.mark.parametrize("key, value", [("load_in_4bit", "yes"), ("bnb_4bit_quant_type", "nf5"),
                                        ("llm_int8_skip_modules", ["("]), ("llm_int8_skip_modules", "lm_head"),
                                        ("quant_method", "gptq")])
def test_bnb_quantization_config_values(bnb, tmp_path, key, value):
    folder = copy_of(bnb, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"][key] = value
    (folder / "config.json").write_text(json.dumps(config))
    typed_failure(folder, names=str(folder / "config.json"), error=(InvalidConfigError, UnsupportedQuantTypeError),
                  format="bnb")


def test_bnb_statistics_of_the_wrong_shape(bnb, tmp_path):
    folder = copy_of(bnb, tmp_path)
    path = folder / "model.safetensors"
    tensors = load_file(path)
    name = next(n for n in sorted(tensors) if n.endswith(".absmax"))
    tensors[name] = tensors[name][:1].clone()
    save_file(tensors, path, metadata={"format": "pt"})
    typed_failure(folder, names=str(path), mentions=(name.removesuffix(".absmax"),))


def test_hf_config_checks_apply_to_bnb_too(bnb, tmp_path):
    folder = copy_of(bnb, tmp_path)
    config = edit_config(folder, num_attention_heads=-4)
    typed_failure(folder, names=str(config), error=InvalidConfigError, mentions=("num_attention_heads",))
