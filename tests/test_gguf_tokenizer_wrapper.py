"""``GGUFTokenizer`` answers like the ``PreTrainedTokenizerFast`` it stands in for, without transformers.

The reference is transformers' own ``PreTrainedTokenizerFast.__init__`` run over a fresh backend
(built from the same metadata, not touched by ``GGUFTokenizer``): ids with and without special
tokens, decoded text, special tokens and their ids, the added vocabulary and the post-processor
must all be the same. llama.cpp's ids for the same cases are checked in test_gguf_llamacpp_ids.py.
"""
from __future__ import annotations

import json
import sys

import pytest

from gguf_llamacpp import TEXTS, load_vocab, write_gguf
from toolkit.plugins.loaders.gguf import tokenizer_cache
from toolkit.plugins.loaders.gguf.metadata import Metadata
from toolkit.plugins.loaders.gguf.reader import open_reader
from toolkit.plugins.loaders.gguf.tokenizer import build_backend, build_tokenizer
from toolkit.plugins.loaders.gguf.tokenizer_wrapper import GGUFTokenizer

# (vocabulary file, tokenizer.ggml.model, tokenizer.ggml.pre): BOS from the type (llama-bpe,
# tekken), forced BOS (granite-embed-multi-311m is Gemma 4's type), SentencePiece, WordPiece's
# [SEP] as EOS, Unigram's EOS
CASES = {
    "gpt2:default": ("byte_level", "gpt2", "default"),
    "gpt2:llama-bpe": ("byte_level", "gpt2", "llama-bpe"),
    "gpt2:tekken": ("byte_level", "gpt2", "tekken"),
    "gpt2-utf8:granite-embed-multi-311m": ("sentencepiece", "gpt2", "granite-embed-multi-311m"),
    "llama": ("sentencepiece", "llama", None),
    "bert": ("wordpiece", "bert", None),
    "t5": ("unigram", "t5", None),
}


def _metadata(tmp_path, case: str) -> Metadata:
    name, model, pre = CASES[case]
    vocab = load_vocab(name)
    if model == "llama":
        vocab = {k: v for k, v in vocab.items() if k != "merges"}
    path = write_gguf(tmp_path / "v.gguf", vocab, model=model, pre=pre)
    return Metadata(open_reader(path).fields, file=str(path))


def _reference(metadata: Metadata, ours: GGUFTokenizer):
    """transformers' wrapper over a backend GGUFTokenizer never saw, with the same options."""
    from transformers import PreTrainedTokenizerFast

    fresh = build_backend(metadata)
    wrapper = PreTrainedTokenizerFast.__new__(PreTrainedTokenizerFast)
    wrapper._tokenizer = fresh
    PreTrainedTokenizerFast.__init__(wrapper, bos_token=ours._specials["bos_token"],
                                     eos_token=ours._specials["eos_token"], unk_token=ours._specials["unk_token"],
                                     pad_token=ours._specials["pad_token"], add_bos_token=ours._flags[0],
                                     add_eos_token=ours._flags[1], chat_template=ours._chat_template,
                                     clean_up_tokenization_spaces=False)
    return wrapper


def _added(backend) -> list:
    return sorted((i, t.content, t.special, t.normalized, t.lstrip, t.rstrip, t.single_word)
                  for i, t in backend.get_added_tokens_decoder().items())


@pytest.mark.parametrize("case", list(CASES))
def test_answers_like_transformers_wrapper(case, tmp_path, monkeypatch):
    monkeypatch.setenv(tokenizer_cache.ENV, "off")
    metadata = _metadata(tmp_path, case)
    ours = build_tokenizer(metadata)
    assert isinstance(ours, GGUFTokenizer) and ours._hf is None
    reference = _reference(metadata, ours)
    assert _added(ours.backend_tokenizer) == _added(reference.backend_tokenizer)
    assert json.loads(ours.backend_tokenizer.post_processor.__getstate__()) == \
        json.loads(reference.backend_tokenizer.post_processor.__getstate__())
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        assert getattr(ours, name) == getattr(reference, name), name
        assert getattr(ours, f"{name}_id") == getattr(reference, f"{name}_id"), name
    assert (len(ours), ours.add_bos_token, ours.add_eos_token) == \
        (len(reference), reference.add_bos_token, reference.add_eos_token)
    for text in TEXTS:
        for special in (True, False):
            ids = reference.encode(text, add_special_tokens=special)
            assert ours.encode(text, add_special_tokens=special) == ids, (text, special)
            for skip in (False, True):
                assert ours.decode(ids, skip_special_tokens=skip) == reference.decode(ids, skip_special_tokens=skip)
    assert ours._hf is None  # all of that without transformers' wrapper
    # anything else builds it; then it answers everything, with the same ids
    assert ours("Hello world")["input_ids"] == reference("Hello world")["input_ids"]
    assert ours._hf is not None and ours.hf.gguf_pre == metadata.get("tokenizer.ggml.pre")
    assert [ours.encode(t) for t in TEXTS] == [reference.encode(t) for t in TEXTS]


def test_loads_and_encodes_without_transformers(tmp_path, monkeypatch):
    """Building, encoding, decoding and the special ids never import transformers (~1 s)."""
    monkeypatch.setenv(tokenizer_cache.ENV, "off")
    metadata = _metadata(tmp_path, "gpt2:llama-bpe")
    monkeypatch.setitem(sys.modules, "transformers", None)  # any import of it now fails
    tokenizer = build_tokenizer(metadata)
    ids = tokenizer.encode("Hello world")
    assert ids[0] == tokenizer.bos_token_id and tokenizer.decode(ids, skip_special_tokens=True) == "Hello world"
    assert tokenizer.eos_token_id is not None and tokenizer.gguf_pre == "llama-bpe"
    with pytest.raises(ImportError):
        tokenizer.apply_chat_template  # noqa: B018 - needs transformers' wrapper


def test_setting_an_attribute_goes_to_the_wrapper(tmp_path, monkeypatch):
    monkeypatch.setenv(tokenizer_cache.ENV, "off")
    tokenizer = build_tokenizer(_metadata(tmp_path, "llama"))
    tokenizer.pad_token = tokenizer.eos_token
    assert tokenizer._hf is not None and tokenizer.pad_token_id == tokenizer.eos_token_id


def test_pickles_before_and_after_the_wrapper_is_built(tmp_path, monkeypatch):
    import copy
    import pickle

    monkeypatch.setenv(tokenizer_cache.ENV, "off")
    tokenizer = build_tokenizer(_metadata(tmp_path, "gpt2:llama-bpe"))
    expected = tokenizer.encode("Hello world")
    for _ in range(2):  # first without transformers' wrapper, then with it
        for clone in (pickle.loads(pickle.dumps(tokenizer)), copy.deepcopy(tokenizer)):
            assert clone.encode("Hello world") == expected and clone.bos_token_id == tokenizer.bos_token_id
            assert (clone._hf is None) == (tokenizer._hf is None)
        tokenizer.hf  # noqa: B018
