"""Issue 14, GGUF: tensor-table integrity (as llama.cpp checks it) and tokenizer metadata checked
when the file is opened, before any weight is read."""
from __future__ import annotations

import math

import pytest
from gguf import GGMLQuantizationType as Q, GGUFValueType as T

from gguf_fixtures import Spec, write_model
from hardening_fixtures import copy_of, drop_kv, edit_gguf, set_kv, typed_failure
from toolkit.core.errors import (CorruptFileError, InvalidConfigError, MissingMetadataError, ShapeMismatchError,
                                 ToolkitError, UnsupportedQuantTypeError)
from toolkit.plugins.loaders.gguf.checkpoint import GGUFCheckpoint


@pytest.fixture(scope="module")
def llama_seed(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("gguf") / "llama.gguf",
                       Spec("llama", Q.F16, hidden=32, ffn=64, heads=4, kv_heads=2))


@pytest.fixture(scope="module")
def qwen_seed(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("gguf") / "qwen.gguf",
                       Spec("qwen2", Q.Q8_0, hidden=32, ffn=64, heads=4, kv_heads=2, tokenizer="gpt2"))


@pytest.fixture
def llama(llama_seed, tmp_path):
    return copy_of(llama_seed, tmp_path)


@pytest.fixture
def qwen(qwen_seed, tmp_path):
    return copy_of(qwen_seed, tmp_path)


def _tensor(model, name):
    return next(t for t in model.tensors if t.name == name)


def _layout(model):
    position, offsets = 0, []
    for tensor in model.tensors:
        offsets.append(position)
        position += -(-len(tensor.data) // 32) * 32
    return offsets


# ---- tensor table ------------------------------------------------------------------------------------
def test_misaligned_offset(llama):
    def edit(model):
        model.tensors[3].offset = _layout(model)[3] + 1
    edit_gguf(llama, edit)
    typed_failure(llama, names=str(llama), error=CorruptFileError, mentions=("offset",))


def test_overlapping_offsets(llama):
    def edit(model):
        model.tensors[2].offset = _layout(model)[1]
    edit_gguf(llama, edit)
    typed_failure(llama, names=str(llama), error=CorruptFileError, mentions=("overlapping",))


def test_all_zero_offsets(llama):
    def edit(model):
        for tensor in model.tensors:
            tensor.offset = 0
    edit_gguf(llama, edit)
    typed_failure(llama, names=str(llama), error=CorruptFileError)


def test_swapped_offsets_of_same_sized_tensors(llama):
    def edit(model):
        offsets = _layout(model)
        first, second = (i for i, t in enumerate(model.tensors) if t.name in ("blk.0.attn_k.weight",
                                                                             "blk.0.attn_v.weight"))
        model.tensors[first].offset, model.tensors[second].offset = offsets[second], offsets[first]
    edit_gguf(llama, edit)
    typed_failure(llama, names=str(llama), error=CorruptFileError, mentions=("blk.0.attn_",))


def test_dimension_of_zero(llama):
    edit_gguf(llama, lambda m: _tensor(m, "blk.0.ffn_up.weight").dims.__setitem__(1, 0))
    typed_failure(llama, names=str(llama), error=CorruptFileError, mentions=("blk.0.ffn_up.weight",))


def test_one_dimensional_k_projection(llama):
    def edit(model):
        k = _tensor(model, "blk.1.attn_k.weight")
        k.dims = [k.dims[0] * k.dims[1]]
    edit_gguf(llama, edit)
    typed_failure(llama, names=str(llama), error=ShapeMismatchError, mentions=("blk.1.attn_k.weight",))


def test_too_many_dimensions(llama):
    edit_gguf(llama, lambda m: m.n_dims_override.__setitem__(0, 5))
    typed_failure(llama, names=str(llama), error=CorruptFileError)


def test_unknown_tensor_type(llama):
    edit_gguf(llama, lambda m: setattr(m.tensors[0], "qtype", 99))
    typed_failure(llama, names=str(llama), error=UnsupportedQuantTypeError)


def test_a_valid_rewrite_still_loads(llama):
    """The table checks accept what gguf-py writes (and what this rewriter writes unchanged)."""
    import toolkit  # noqa: PLC0415

    edit_gguf(llama, lambda m: None)
    assert toolkit.load(str(llama), device="cpu").logits([1, 2, 3]).shape == (3, 656)


# ---- tokenizer metadata, checked on open -------------------------------------------------------------
def _opening_fails(path, error, *mentions):
    """GGUFCheckpoint() itself raises: before any tensor is read or the model built."""
    with pytest.raises(error) as info:
        GGUFCheckpoint([path])
    for text in (str(path), *mentions):
        assert text in str(info.value), str(info.value)


def test_missing_scores(llama):
    edit_gguf(llama, lambda m: drop_kv(m, "tokenizer.ggml.scores"))
    _opening_fails(llama, MissingMetadataError, "tokenizer.ggml.scores")


def test_invalid_utf8_in_a_string_value(llama):
    edit_gguf(llama, lambda m: m.kv("tokenizer.ggml.tokens").value.__setitem__(300, b"\xff\xfe"))
    _opening_fails(llama, CorruptFileError, "tokenizer.ggml.tokens")


def test_invalid_utf8_in_a_scalar_string(llama):
    # a value nothing reads is decoded only by ``toolkit inspect``, inside the error wrapper
    edit_gguf(llama, lambda m: set_kv(m, "general.name", T.STRING, b"tiny\xff"))
    with pytest.raises(CorruptFileError, match="general.name") as info:
        GGUFCheckpoint([llama]).summary()
    assert str(llama) in str(info.value)
    edit_gguf(llama, lambda m: set_kv(m, "tokenizer.ggml.model", T.STRING, b"lla\xffma"))
    _opening_fails(llama, CorruptFileError, "tokenizer.ggml.model")


def test_eos_as_a_string(llama):
    edit_gguf(llama, lambda m: set_kv(m, "tokenizer.ggml.eos_token_id", T.STRING, b"2"))
    _opening_fails(llama, InvalidConfigError, "tokenizer.ggml.eos_token_id")


def test_unknown_token_id_out_of_range(llama):
    edit_gguf(llama, lambda m: set_kv(m, "tokenizer.ggml.unknown_token_id", T.UINT32, 10**6))
    _opening_fails(llama, InvalidConfigError, "tokenizer.ggml.unknown_token_id")


@pytest.mark.parametrize("merge", [b"nospace", b"a  b", b" x", b"zz qq", b"\xff x"])
def test_malformed_merges(qwen, merge):
    edit_gguf(qwen, lambda m: m.kv("tokenizer.ggml.merges").value.__setitem__(5, merge))
    _opening_fails(qwen, ToolkitError, "tokenizer.ggml.merges")


def test_tokens_as_an_integer_array(llama):
    def edit(model):
        tokens = model.kv("tokenizer.ggml.tokens")
        tokens.sub, tokens.value = T.INT32, list(range(len(tokens.value)))
    edit_gguf(llama, edit)
    _opening_fails(llama, InvalidConfigError, "tokenizer.ggml.tokens")


@pytest.mark.parametrize("key, vtype, value, sub", [
    ("tokenizer.ggml.scores", T.ARRAY, [0.5], T.FLOAT32),
    ("tokenizer.ggml.scores", T.ARRAY, [b"x"] * 656, T.STRING),
    ("tokenizer.ggml.token_type", T.ARRAY, [1.5] * 656, T.FLOAT32),
    ("tokenizer.ggml.add_bos_token", T.STRING, b"yes", None),
    ("tokenizer.ggml.bos_token_id", T.INT32, -1, None),
])
def test_other_tokenizer_values(llama, key, vtype, value, sub):
    edit_gguf(llama, lambda m: set_kv(m, key, vtype, value, sub))
    _opening_fails(llama, ToolkitError, key)


def test_non_finite_score(llama):
    edit_gguf(llama, lambda m: m.kv("tokenizer.ggml.scores").value.__setitem__(300, math.nan))
    _opening_fails(llama, InvalidConfigError, "tokenizer.ggml.scores")
