"""What the GGUF writer keeps from its source (issue 13): bytes of tensors it does not re-quantize,
the ``tokenizer.ggml.pre`` label, and merges only where the vocabulary is merge-driven.

Expected values come from the source files themselves (gguf-py reads both sides).
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q, GGUFReader

from gguf_fixtures import Spec, byte_level_vocab, write_model
from test_gguf_convert import save_source
from toolkit.core.convert import convert


def _field(path, key):
    field = GGUFReader(str(path)).fields.get(key)
    return None if field is None else field.contents()


def test_gguf_to_gguf_keeps_gemma_norm_bytes(tmp_path):
    """Gemma norms are stored as 1 + w; for stored values below 0.5 (or negative) float32 cannot
    undo the reader's - 1 (x - 1 + 1 != x), so the writer must carry the stored values through."""
    save_source(tmp_path / "hf", "gemma3")
    convert(tmp_path / "hf", tmp_path / "a.gguf", to="gguf:F32")
    # norms with every mantissa bit in use, as llama.cpp's converter can store them
    edited = GGUFReader(str(tmp_path / "a.gguf"), "r+")
    norms = [t for t in edited.tensors if "norm" in t.name]
    for tensor in norms:
        tensor.data[...] = np.linspace(-0.37, 0.43, tensor.data.size, dtype=np.float32).reshape(tensor.data.shape)
    edited.data.flush()
    del edited
    convert(tmp_path / "a.gguf", tmp_path / "b.gguf", to="gguf:F32")
    first = {t.name: np.array(t.data) for t in GGUFReader(str(tmp_path / "a.gguf")).tensors}
    second = {t.name: np.array(t.data) for t in GGUFReader(str(tmp_path / "b.gguf")).tensors}
    assert norms and first.keys() == second.keys()
    # the arithmetic round trip would move these values (what the writer did before)
    sample = first[norms[0].name]
    assert not np.array_equal((sample - np.float32(1)) + np.float32(1), sample)
    for name, values in first.items():
        assert values.tobytes() == second[name].tobytes(), name


def test_gguf_to_gguf_keeps_the_pre_tokenizer_label(tmp_path):
    """smollm splits like starcoder; a GGUF source's own label is what gets written back."""
    source = write_model(tmp_path / "s.gguf", Spec("qwen2", Q.F32, tokenizer="gpt2"),
                         vocab=byte_level_vocab(pre="smollm"))
    convert(source, tmp_path / "d.gguf", to="gguf:F32")
    assert _field(tmp_path / "d.gguf", "tokenizer.ggml.pre") == "smollm"
    assert _field(tmp_path / "d.gguf", "tokenizer.ggml.merges") == _field(source, "tokenizer.ggml.merges")


def test_sentencepiece_vocabulary_is_written_without_merges(tmp_path):
    save_source(tmp_path / "hf", "gemma3")
    convert(tmp_path / "hf", tmp_path / "g.gguf", to="gguf:Q8_0")
    assert _field(tmp_path / "g.gguf", "tokenizer.ggml.model") == "llama"
    assert _field(tmp_path / "g.gguf", "tokenizer.ggml.merges") is None
    assert _field(tmp_path / "g.gguf", "tokenizer.ggml.scores") is not None
