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


def _fail_if_checked(monkeypatch):
    """Makes the full checks raise, so a test sees whether they ran."""
    from toolkit.plugins.loaders.gguf import tokenizer_checks

    def ran(*args, **kwargs):
        raise AssertionError("the full tokenizer checks ran")

    monkeypatch.setattr(tokenizer_checks, "_check_parallel_arrays", ran)


def test_a_hit_skips_the_checks_a_miss_does_not(tmp_path, monkeypatch):
    """An entry exists only for metadata that passed the checks, so on a hit they are skipped."""
    from toolkit.plugins.loaders.gguf.tokenizer_checks import check_tokenizer_metadata

    monkeypatch.setenv(tokenizer_cache.ENV, str(tmp_path / "cache"))
    path = write_gguf(tmp_path / "a.gguf", load_vocab("sentencepiece"), model="llama")
    build_tokenizer(_metadata(path))  # fills the cache
    with monkeypatch.context() as patch:
        _fail_if_checked(patch)
        hit = _metadata(path)
        check_tokenizer_metadata(hit)  # skipped: the entry vouches for these bytes
        assert "tokenizer.ggml.tokens" not in hit._cache  # nothing decoded  # noqa: SLF001
        assert build_tokenizer(hit).encode("Hello world") == build_tokenizer(_metadata(path)).encode("Hello world")
        # without the cache (or with trust_cache=False) they run
        with pytest.raises(AssertionError, match="checks ran"):
            check_tokenizer_metadata(_metadata(path), trust_cache=False)
        patch.setenv(tokenizer_cache.ENV, "off")
        with pytest.raises(AssertionError, match="checks ran"):
            check_tokenizer_metadata(_metadata(path))


def test_metadata_that_fails_the_checks_is_never_stored(tmp_path, monkeypatch):
    """cached_backend checks before it builds, so a bad vocabulary leaves no entry to vouch for it."""
    from toolkit.core.errors import InvalidConfigError

    monkeypatch.setenv(tokenizer_cache.ENV, str(tmp_path / "cache"))
    vocab = load_vocab("sentencepiece")
    vocab = dict(vocab, ids={**vocab.get("ids", {}), "bos_token_id": len(vocab["tokens"]) + 5})
    bad = _metadata(write_gguf(tmp_path / "bad.gguf", vocab, model="llama"))
    with pytest.raises(InvalidConfigError, match="bos_token_id"):
        build_tokenizer(bad)
    assert not list((tmp_path / "cache").glob("*"))
    assert not tokenizer_cache.checked_before(bad)


def test_an_older_builders_entry_is_ignored(tmp_path, monkeypatch):
    """An entry written by another BUILDER_VERSION has another key: not read, not trusted."""
    monkeypatch.setenv(tokenizer_cache.ENV, str(tmp_path / "cache"))
    path = write_gguf(tmp_path / "a.gguf", load_vocab("byte_level"), model="gpt2", pre="qwen2")
    with monkeypatch.context() as patch:
        patch.setattr(tokenizer_cache, "BUILDER_VERSION", "old")
        old = _metadata(path)
        build_tokenizer(old)
        assert tokenizer_cache.checked_before(old)
    (old_entry,) = (tmp_path / "cache").glob("*.json")
    old_entry.write_text('{"version":"1.0","model":{"type":"BPE","vocab":{},"merges":[]}}')  # a wrong tokenizer
    now = _metadata(path)
    assert tokenizer_cache.cache_key(now) != tokenizer_cache.cache_key(old)
    assert not tokenizer_cache.checked_before(now)
    calls = []
    backend = tokenizer_cache.cached_backend(now, lambda m: calls.append(m) or build_backend(m))
    assert len(calls) == 1  # built, not read from the old entry
    assert backend.encode("Hello world").ids == build_backend(_metadata(path)).encode("Hello world").ids
    assert len(list((tmp_path / "cache").glob("*.json"))) == 2


def test_a_failed_write_leaves_no_entry(tmp_path, monkeypatch):
    """Entries are renamed into place: a write that fails midway leaves neither an entry nor a
    partial file, warns, and the tokenizer is still returned (the next load rebuilds)."""
    monkeypatch.setenv(tokenizer_cache.ENV, str(tmp_path / "cache"))
    path = write_gguf(tmp_path / "a.gguf", load_vocab("byte_level"), model="gpt2", pre="qwen2")

    def half_written(backend):
        raise OSError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr(tokenizer_cache, "entry_text", half_written)
        with pytest.warns(UserWarning, match="could not write the tokenizer cache entry"):
            assert build_tokenizer(_metadata(path)) is not None
    assert not list((tmp_path / "cache").iterdir())
    assert not tokenizer_cache.checked_before(_metadata(path))
    build_tokenizer(_metadata(path))
    assert len(list((tmp_path / "cache").glob("*.json"))) == 1
