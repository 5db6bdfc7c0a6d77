"""Tokenizers built from GGUF metadata encode and decode like transformers' own GGUF tokenizer.

transformers builds its tokenizer from the same metadata through its own converters; both are
run on the same file and compared on varied text (unicode, digits, whitespace, newlines,
special tokens). The real Gemma 3 vocabulary is compared in test_gguf_gemma_real.py.
"""
from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as Q

from gguf_fixtures import Spec, byte_level_vocab, sentencepiece_vocab, write_model
from toolkit.plugins.loaders.gguf.checkpoint import GGUFCheckpoint

TEXTS = [
    "Hello world", "The capital of France is Paris.", " leading space", "  two leading spaces", "trailing  ",
    "tabs\tand\nnewlines\n\n\nend", "1234567890 3.14159 -42 1e-5", "unicode: héllo wörld ñ 日本語 中文 한국어",
    "emoji 😀🚀 👩‍👩‍👧‍👦", "kalomi nerusa tovipe", "KALOMI Nerusa", "code: def f(x):\n    return x**2\n", "",
    " ", "\n", "a" * 40, "mixed\r\nCRLF", "Ελληνικά и русский", "العربية", "\u200b zero width", "a\u0301 combining",
    "http://example.com/path?q=1&r=2", "JSON {\"a\": [1, 2, 3]}", "snake_case CamelCase", "<s> inner </s>",
    "<|im_start|>user\nhi<|im_end|>\n", "<|endoftext|>", "    indented", "ñeñe 日本ka", "don't we'll I'M",
]
CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def reference_tokenizer(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def llama_cpp_differs(text: str) -> bool:
    """Texts where llama.cpp (our reference, see test_gguf_llamacpp_ids.py) and transformers part
    ways on SentencePiece vocabularies: llama.cpp prefixes a space to text that already starts
    with one, and to text after a special token; transformers' Metaspace does neither."""
    return text[:1].isspace() or "<s>" in text


def assert_same_tokenizer(ours, reference, *, ignore=None, special=True):
    """``special=False``: compare without BOS/EOS (llama.cpp adds BOS for Llama 3's pre-tokenizer
    when the file does not say; transformers does not)."""
    for text in TEXTS:
        ids = reference.encode(text, add_special_tokens=special)
        if ignore is None or not ignore(text):
            assert ours.encode(text, add_special_tokens=special) == ids, text
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == reference.decode(ids, skip_special_tokens=skip), text
    for attr in ("bos_token", "eos_token", "unk_token"):
        assert getattr(ours, attr) == getattr(reference, attr), attr
    assert len(ours) == len(reference)


CASES = {
    "sentencepiece-llama": (Spec("llama", Q.Q8_0), sentencepiece_vocab),
    "byte-level-qwen2": (Spec("qwen2", Q.Q8_0, tokenizer="gpt2"), lambda: byte_level_vocab(pre="qwen2")),
    "byte-level-llama3": (Spec("llama", Q.Q8_0, tokenizer="gpt2"), lambda: byte_level_vocab(pre="llama-bpe")),
    "byte-level-default-split": (Spec("qwen2", Q.Q8_0, tokenizer="gpt2"), lambda: byte_level_vocab(pre="default")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_tokenizer_matches_transformers(case, tmp_path):
    spec, vocab = CASES[case]
    path = write_model(tmp_path / "t.gguf", spec, vocab=vocab(), chat_template=CHAT)
    ours = GGUFCheckpoint([path]).tokenizer()
    reference = reference_tokenizer(path)
    assert_same_tokenizer(ours, reference, ignore=llama_cpp_differs if case.startswith("sentencepiece") else None,
                          special=case != "byte-level-llama3")
    messages = [{"role": "user", "content": "kalomi nerusa?"}]
    assert ours.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == \
        reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def test_no_vocabulary_means_no_tokenizer(tmp_path):
    from gguf import GGUFWriter

    writer = GGUFWriter(str(tmp_path / "bare.gguf"), "llama")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    from toolkit.plugins.loaders.gguf.metadata import Metadata
    from toolkit.plugins.loaders.gguf.reader import open_reader
    from toolkit.plugins.loaders.gguf.tokenizer import build_tokenizer

    path = tmp_path / "bare.gguf"
    assert build_tokenizer(Metadata(open_reader(path).fields, file=str(path))) is None
