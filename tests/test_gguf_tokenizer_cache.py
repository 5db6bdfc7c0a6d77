"""The on-disk cache of built GGUF tokenizers: hits give the same tokenizer, any change to the
tokenizer metadata misses, damaged entries are rebuilt, and the cache can be turned off."""
from __future__ import annotations

import pytest

from gguf_llamacpp import TEXTS, load_vocab, write_gguf
from toolkit.plugins.loaders.gguf import tokenizer_cache
from toolkit.plugins.loaders.gguf.metadata import Metadata
from toolkit.plugins.loaders.gguf.reader import open_reader
from toolkit.plugins.loaders.gguf.tokenizer import build_backend, build_tokenizer


def _metadata(path):
    return Metadata(open_reader(path).fields, file=str(path))


def test_hit_miss_and_damaged_entry(tmp_path, monkeypatch):
    monkeypatch.setenv(tokenizer_cache.ENV, str(tmp_path / "cache"))
    vocab = load_vocab("byte_level")
    first = _metadata(write_gguf(tmp_path / "a.gguf", vocab, model="gpt2", pre="qwen2"))
    built = build_tokenizer(first)
    entries = list((tmp_path / "cache").glob("*.json"))
    assert len(entries) == 1
    calls = []
    again = tokenizer_cache.cached_backend(first, lambda m: calls.append(m) or build_backend(m))
    assert calls == []  # read back, not rebuilt
    assert [again.encode(t).ids for t in TEXTS] == [built.backend_tokenizer.encode(t).ids for t in TEXTS]
    # another pre-tokenizer label is another tokenizer
    other = _metadata(write_gguf(tmp_path / "b.gguf", vocab, model="gpt2", pre="llama-bpe"))
    assert tokenizer_cache.cache_key(other) != tokenizer_cache.cache_key(first)
    # a damaged entry is rebuilt and replaced
    entries[0].write_text("{not json")
    with pytest.warns(UserWarning, match="unreadable cached tokenizer"):
        rebuilt = tokenizer_cache.cached_backend(first, lambda m: calls.append(m) or build_backend(m))
    assert len(calls) == 1 and rebuilt.encode("Hello world").ids == again.encode("Hello world").ids
    assert entries[0].read_text().startswith("{\"version\"")


def test_cache_off(tmp_path, monkeypatch):
    monkeypatch.setenv(tokenizer_cache.ENV, "off")
    assert tokenizer_cache.cache_dir() is None
    path = write_gguf(tmp_path / "a.gguf", load_vocab("byte_level"), model="gpt2", pre="qwen2")
    assert build_tokenizer(_metadata(path)) is not None


def test_entry_text_reads_back_the_same_tokenizer(tmp_path, monkeypatch):
    """The cache's faster form (vocabulary in key order, "left right" merges) is the same tokenizer;
    merges with a space in a piece keep the pair form."""
    import json

    from tokenizers import Tokenizer
    from tokenizers.models import BPE

    monkeypatch.setenv(tokenizer_cache.ENV, "off")
    for name, model, pre in (("byte_level", "gpt2", "qwen2"), ("sentencepiece", "gpt2", "sarvam-moe")):
        backend = build_backend(_metadata(write_gguf(tmp_path / f"{name}.gguf", load_vocab(name), model=model, pre=pre)))
        text = tokenizer_cache.entry_text(backend)
        back = Tokenizer.from_str(text)
        assert [back.encode(t).ids for t in TEXTS] == [backend.encode(t).ids for t in TEXTS]
        assert back.get_vocab() == backend.get_vocab()
        merges = json.loads(text)["model"]["merges"]
        assert merges and all(isinstance(m, str) for m in merges)
        assert merges == [" ".join(m) for m in json.loads(backend.to_str())["model"]["merges"]]
    spaced = Tokenizer(BPE(vocab={"a": 0, "b": 1, " ": 2, "a ": 3, "a b": 4}, merges=[("a", " "), ("a ", "b")]))
    text = tokenizer_cache.entry_text(spaced)
    assert json.loads(text)["model"]["merges"] == [["a", " "], ["a ", "b"]]
    assert Tokenizer.from_str(text).encode("a b").ids == spaced.encode("a b").ids == [4]
