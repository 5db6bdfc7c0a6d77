"""Issue 14, hyperparameters: checked (type, range, against the tensors) before the model is built.

Each case loads a tiny checkpoint whose config (HF config.json or GGUF metadata) carries a value
that is well-formed but absurd, and expects a ToolkitError subclass naming the file and the key
or tensor; the huge ones must fail fast (they used to allocate until killed).
"""
from __future__ import annotations

import math
import time

import pytest
from gguf import GGMLQuantizationType as Q, GGUFValueType as T

from gguf_fixtures import Spec, write_model
from hardening_fixtures import copy_of, edit_config, edit_gguf, set_kv, typed_failure
from hf_fixtures import save_hf_model
from toolkit.core.errors import (InvalidConfigError, MissingMetadataError, ShapeMismatchError,
                                 UnknownArchitectureError, UnknownNameError)


@pytest.fixture(scope="module")
def hf_seed(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf") / "llama"
    save_hf_model(path, "llama", vocab=128)
    return path


@pytest.fixture(scope="module")
def gguf_seed(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("gguf") / "llama.gguf",
                       Spec("llama", Q.F16, hidden=32, ffn=64, heads=4, kv_heads=2))


@pytest.fixture
def hf(hf_seed, tmp_path):
    return copy_of(hf_seed, tmp_path)


@pytest.fixture
def gguf(gguf_seed, tmp_path):
    return copy_of(gguf_seed, tmp_path)


# ---- sizes that used to allocate until killed ---------------------------------------------------------
@pytest.mark.parametrize("key, value", [("num_hidden_layers", 10**6), ("num_hidden_layers", 9_000),
                                        ("hidden_size", 10**6), ("intermediate_size", 10**7),
                                        ("head_dim", 10**12), ("vocab_size", 10**7)])
def test_huge_hf_sizes_are_refused_before_allocating(hf, key, value):
    config = edit_config(hf, **{key: value})
    started = time.monotonic()
    typed_failure(hf, names=str(config), error=InvalidConfigError)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("suffix, value", [("block_count", 1 << 20), ("block_count", 5000),
                                           ("attention.key_length", 10**9), ("rope.dimension_count", 10**9),
                                           ("embedding_length", 10**9)])
def test_huge_gguf_sizes_are_refused_before_allocating(gguf, suffix, value):
    edit_gguf(gguf, lambda m: set_kv(m, f"llama.{suffix}", T.UINT32, value))
    started = time.monotonic()
    typed_failure(gguf, names=str(gguf), error=InvalidConfigError)
    assert time.monotonic() - started < 5


def test_weight_budget_names_the_config(hf):
    # in range for every single key, but together far more weights than the file holds
    config = edit_config(hf, num_hidden_layers=2000, intermediate_size=4096)
    typed_failure(hf, names=str(config), error=InvalidConfigError, mentions=("refused before allocating",))


# ---- head counts that do not fit the tensors ---------------------------------------------------------
def test_gguf_head_count_that_does_not_divide_the_rows(gguf):
    edit_gguf(gguf, lambda m: set_kv(m, "llama.attention.head_count", T.UINT32, 3))
    typed_failure(gguf, names=str(gguf))


def test_gguf_k_projection_one_column_short(gguf):
    def short(model):
        k = next(t for t in model.tensors if t.name == "blk.0.attn_k.weight")
        rows, row_bytes = k.dims[1], k.dims[0] * 2  # F16
        k.data = b"".join(k.data[r * row_bytes:(r + 1) * row_bytes - 2] for r in range(rows))
        k.dims[0] -= 1
    edit_gguf(gguf, short)
    typed_failure(gguf, names=str(gguf), error=ShapeMismatchError, mentions=("blk.0.attn_k.weight",))


def test_hf_kv_heads_contradicting_the_k_projection(hf):
    config = edit_config(hf, num_key_value_heads=1)
    typed_failure(hf, names=str(config), error=ShapeMismatchError, mentions=("k_proj", "num_key_value_heads"))


def test_layer_count_must_match_the_tensors(hf):
    config = edit_config(hf, num_hidden_layers=3)
    typed_failure(hf, names=str(config), error=InvalidConfigError, mentions=("layer 2",))
    config = edit_config(hf, num_hidden_layers=1)
    typed_failure(hf, names=str(config), mentions=("layer 1",))


# ---- wrong types and ranges --------------------------------------------------------------------------
BAD_VALUES = [-1, 0, math.nan, math.inf, [4], {"a": 1}, "64", True]


@pytest.mark.parametrize("key", ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                 "num_attention_heads", "num_key_value_heads", "head_dim"])
@pytest.mark.parametrize("value", BAD_VALUES)
def test_hf_size_of_wrong_type_or_range(hf, key, value):
    config = edit_config(hf, **{key: value})
    typed_failure(hf, names=str(config), error=InvalidConfigError, mentions=(key,))


@pytest.mark.parametrize("key, value", [
    ("rope_theta", -1.0), ("rope_theta", math.nan), ("rope_theta", "big"), ("rope_theta", [1.0]),
    ("rms_norm_eps", "1e-5"), ("rms_norm_eps", 0.0), ("rms_norm_eps", math.inf),
    ("hidden_act", ["silu"]), ("hidden_act", 3), ("hidden_act", "swishy"),
    ("eos_token_id", "2"), ("eos_token_id", [1, "x"]), ("eos_token_id", -1), ("eos_token_id", 10**6),
    ("bos_token_id", {"id": 1}), ("architectures", "LlamaForCausalLM"), ("architectures", [3]),
    ("rope_scaling", "linear"), ("rope_scaling", {"rope_type": "yarn", "factor": 2.0}),
    ("rope_scaling", {"rope_type": "linear"}), ("rope_scaling", {"type": "linear", "factor": "x"}),
    ("rope_scaling", {"rope_type": "llama3", "factor": 8.0}), ("sliding_window", True),
    ("sliding_window", -4), ("tie_word_embeddings", "false"), ("max_position_embeddings", -1),
    ("model_type", 7), ("torch_dtype", 16),
])
def test_hf_value_of_wrong_type_or_range(hf, key, value):
    config = edit_config(hf, **{key: value})
    typed_failure(hf, names=str(config))


@pytest.mark.parametrize("suffix, vtype, value", [
    ("attention.head_count_kv", T.INT32, -2), ("attention.head_count_kv", T.UINT32, 0),
    ("feed_forward_length", T.UINT32, 0), ("vocab_size", T.INT32, -1), ("block_count", T.FLOAT32, math.nan),
    ("attention.layer_norm_rms_epsilon", T.STRING, b"tiny"), ("rope.freq_base", T.FLOAT32, math.inf),
    ("embedding_length", T.STRING, b"32"), ("attention.head_count", T.ARRAY, [4, 4]),
    ("attention.sliding_window", T.BOOL, True), ("rope.scaling.type", T.STRING, b"yarn"),
])
def test_gguf_value_of_wrong_type_or_range(gguf, suffix, vtype, value):
    sub = T.INT32 if vtype == T.ARRAY else None
    edit_gguf(gguf, lambda m: set_kv(m, f"llama.{suffix}", vtype, value, sub))
    typed_failure(gguf, names=str(gguf))


def test_gguf_rope_scaling_without_factor(gguf):
    edit_gguf(gguf, lambda m: set_kv(m, "llama.rope.scaling.type", T.STRING, b"linear"))
    typed_failure(gguf, names=str(gguf), error=InvalidConfigError, mentions=("factor",))


def test_gguf_error_names_the_gguf_key(gguf):
    edit_gguf(gguf, lambda m: set_kv(m, "llama.block_count", T.INT32, -5))
    typed_failure(gguf, names=str(gguf), error=InvalidConfigError, mentions=("llama.block_count",))


def test_negative_kv_heads_does_not_talk_about_tensor_parallelism(gguf):
    edit_gguf(gguf, lambda m: set_kv(m, "llama.attention.head_count_kv", T.INT32, -2))
    error = typed_failure(gguf, names=str(gguf), error=InvalidConfigError, mentions=("head_count_kv",))
    assert "tp" not in str(error).lower().replace("attention", "")


# ---- loads that used to succeed and then fail on the first forward -----------------------------------
@pytest.mark.parametrize("key, value", [("vocab_size", -1), ("intermediate_size", 0), ("rms_norm_eps", "x"),
                                        ("sliding_window", True)])
def test_values_that_broke_the_first_forward_are_refused_at_load(hf, key, value):
    config = edit_config(hf, **{key: value})
    typed_failure(hf, names=str(config), error=InvalidConfigError, mentions=(key,))


# ---- typed errors that named no file -----------------------------------------------------------------
def test_unknown_architecture_names_the_config_file(hf):
    config = edit_config(hf, architectures=["FancyForCausalLM"], model_type="fancy")
    typed_failure(hf, names=str(config), error=UnknownArchitectureError, mentions=("FancyForCausalLM",))


def test_missing_hf_key_names_the_config_file(hf):
    config = edit_config(hf, hidden_size=...)
    error = typed_failure(hf, names=str(config), error=MissingMetadataError, mentions=("hidden_size",))
    assert "(file config)" not in str(error)


def test_unknown_quant_scheme_of_a_checkpoint_names_its_file(tmp_path, hf_seed):
    from hardening_states import sharded_state  # noqa: PLC0415

    folder = sharded_state(hf_seed, tmp_path)
    manifest = folder / "toolkit-sharded.json"
    text = manifest.read_text().replace('"quant_scheme": "unquantized"', '"quant_scheme": "int3-magic"')
    manifest.write_text(text)
    typed_failure(folder, names=str(manifest), error=UnknownNameError, mentions=("int3-magic",))
