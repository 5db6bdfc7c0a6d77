"""A GGUF written by llama.cpp's own converter from a Hugging Face directory whose tokenizer is only
a tokenizer.json (tests/data/llamacpp/converter, made by make_converter_case.py with the command
recorded there): ``tokenizer.ggml.model = gpt2`` holding a SentencePiece-style vocabulary, labelled
``granite-embed-multi-311m``. It used to fail with "Token '\\n' out of vocabulary".

It loads; it tokenizes as llama.cpp does (ids.json) and as the source tokenizer.json does; its
logits are transformers' on the source model (F32 file: float32 rounding only).
"""
from __future__ import annotations

import json

import pytest
import torch

import toolkit
from gguf_llamacpp import DATA, TEXTS

CASE = DATA / "converter"
REFERENCE = json.loads((DATA / "ids.json").read_text(encoding="utf-8"))["ids"]["converter:gemma3-tiny"]


@pytest.fixture(scope="module")
def loaded():
    return toolkit.load(str(CASE / "gemma3-tiny-f32.gguf"), device="cpu")


def test_ids_equal_llama_cpp(loaded):
    assert [loaded.tokenizer.encode(text) for text in TEXTS] == REFERENCE


def test_ids_equal_the_source_tokenizer_json(loaded):
    from transformers import PreTrainedTokenizerFast

    source = PreTrainedTokenizerFast(tokenizer_file=str(CASE / "hf" / "tokenizer.json"))
    for text in TEXTS:
        assert loaded.tokenizer.encode(text, add_special_tokens=False) == source.encode(
            text, add_special_tokens=False), text


def test_logits_equal_transformers(loaded):
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(CASE / "hf", dtype=torch.float32).eval()
    ids = loaded.tokenizer.encode("The quick brown fox jumps over the lazy dog. 12345")
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0]
    ours = loaded.logits(ids)
    assert (ours - expected).abs().max().item() <= 1e-4 * expected.abs().max().item()
