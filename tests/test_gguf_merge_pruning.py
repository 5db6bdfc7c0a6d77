"""Leaving out SentencePiece merges that can never apply changes no token id (merge_pruning.py).

The pruned merges are compared with the full list by encoding with both (the full list is what
the tokenizer used before, and what tests/test_gguf_llamacpp_ids.py checks against llama.cpp),
and the tokenizer built with pruning forced on the tiny SentencePiece vocabulary is checked
against llama.cpp's own ids (tests/data/llamacpp/ids.json). The real Gemma 3 vocabulary, where
pruning applies by default, is checked against llama.cpp in test_gguf_llamacpp_ids.py.
"""
from __future__ import annotations

import json
import random

import pytest
from tokenizers import Tokenizer
from tokenizers.models import BPE

from gguf_llamacpp import DATA, TEXTS, load_vocab, write_gguf
from toolkit.plugins.loaders.gguf import merge_pruning
from toolkit.plugins.loaders.gguf.checkpoint import GGUFCheckpoint
from toolkit.plugins.loaders.gguf.merge_pruning import applicable_merges
from toolkit.plugins.loaders.gguf.merges import sentencepiece_merges

OPTIONS = dict(fuse_unk=True, byte_fallback=True, dropout=None, unk_token="<unk>")


def _sentencepiece():
    spec = load_vocab("sentencepiece")
    tokens = spec["tokens"]
    vocab = {token: index for index, token in enumerate(tokens)}
    scores = {}
    for token, score in zip(tokens, spec["scores"]):
        scores.setdefault(token, float(score))
    return vocab, sentencepiece_merges(vocab, scores)


def _texts(vocab: dict[str, int], count: int, seed: int = 0) -> list[str]:
    """Strings made of vocabulary pieces and stray characters, so that many merges compete."""
    rng = random.Random(seed)
    pieces = [p for p in vocab if not p.startswith("<")]
    chars = sorted({c for p in pieces for c in p}) + ["\u00e9", "\u4e2d", "x", " "]
    return [("".join(rng.choice(pieces) if rng.random() < 0.7 else rng.choice(chars)
                     for _ in range(rng.randint(1, 12)))) for _ in range(count)]


def test_pruned_merges_encode_every_text_as_all_merges_do():
    vocab, merges = _sentencepiece()
    pruned = applicable_merges(merges, vocab, min_saved=0, **OPTIONS)
    assert len(pruned) < len(merges)  # the vocabulary has pieces with several cuts: some must go
    assert set(pruned) <= set(merges) and pruned == [m for m in merges if m in set(pruned)]  # order kept
    full = Tokenizer(BPE(vocab=vocab, merges=merges, **OPTIONS))
    small = Tokenizer(BPE(vocab=vocab, merges=pruned, **OPTIONS))
    texts = TEXTS + _texts(vocab, 3000) + [p + q for p in list(vocab)[:200] for q in list(vocab)[200:260]]
    for a, b, text in zip(full.encode_batch(texts), small.encode_batch(texts), texts):
        assert a.ids == b.ids, text


def test_a_piece_keeps_only_the_cut_it_forms_by():
    # "abc" forms as "ab"+"c" ("ab" outranks "bc"), so the cut "a"+"bc" can never apply
    vocab = {"<unk>": 0, "a": 1, "b": 2, "c": 3, "ab": 4, "bc": 5, "abc": 6}
    merges = [("a", "b"), ("b", "c"), ("ab", "c"), ("a", "bc")]
    assert applicable_merges(merges, vocab, min_saved=0, **OPTIONS) == [("a", "b"), ("b", "c"), ("ab", "c")]
    # ranked the other way round, "bc" forms first and "a"+"bc" is the cut that applies
    merges = [("b", "c"), ("a", "b"), ("a", "bc"), ("ab", "c")]
    assert applicable_merges(merges, vocab, min_saved=0, **OPTIONS) == [("b", "c"), ("a", "b"), ("a", "bc")]


def test_merges_with_a_byte_or_unknown_token_are_never_pruned():
    vocab = {"<unk>": 0, "<0x41>": 1, "b": 2, "<0x41>b": 3, "a": 4, "ab": 5, "<unk>a": 6}
    for merges in ([("<0x41>", "b"), ("a", "b")], [("<unk>", "a"), ("a", "b")]):
        assert applicable_merges(merges, vocab, min_saved=0, **OPTIONS) == merges


def test_forced_pruning_keeps_llama_cpp_ids(tmp_path, monkeypatch):
    monkeypatch.setattr(merge_pruning, "MIN_SAVED", 0)
    monkeypatch.setenv("TOOLKIT_TOKENIZER_CACHE", "off")
    spec = {k: v for k, v in load_vocab("sentencepiece").items() if k != "merges"}
    path = write_gguf(tmp_path / "v.gguf", spec, model="llama")
    tokenizer = GGUFCheckpoint([path]).tokenizer()
    expected = json.loads((DATA / "ids.json").read_text(encoding="utf-8"))["ids"]["llama"]
    assert [tokenizer.encode(text) for text in TEXTS] == expected
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    _, full = _sentencepiece()
    assert len(merges) < len(full)  # pruning did happen
