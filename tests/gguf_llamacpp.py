"""Shared by test_gguf_llamacpp_ids.py and tests/data/llamacpp/make_reference.py: the tricky texts,
the tiny vocabularies (tests/data/llamacpp/vocab_*.json) and the GGUF files written from them.

The vocabularies were trained once with ``tokenizers`` on CORPUS (make_reference.py) and are
stored as data, so the GGUFs written here are the ones llama.cpp tokenized for the reference ids.
"""
from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).parent / "data" / "llamacpp"
SEP = "\n__sep__\n"

TEXTS = [
    "Hello world", " Hello world", "  two leading spaces", "trailing  ", "\n\n  0. item", "\n\n\n", " \n \n\n",
    "digits 1234567 and 3.14159 then  42 and\t7", "x=12345678901234", "  0. first\n  1. second\n\t\t2. third",
    "whitespace   runs    of\t\tmixed \u00a0 kinds \u3000 end", "def f(x):\n    return x**2  # square\n",
    "for (int i = 0; i < n; ++i) { s += a[i]; }", "if x == 1:\n\tpass\r\nelse:\r\n\tpass",
    "日本語のテキストと中文文本", "한국어 텍스트", "emoji 😀🚀 👩\u200d👩\u200d👧 ✅ ❤️", "café naïve résumé Ångström",
    "e\u0301 combining a\u0308", "Привет, мир! Съешь же ещё этих булок", "Ελληνικά", "العربية", "हिन्दी",
    "don't we'll I'M you've THEY'RE", "http://example.com/path?q=1&r=2", "snake_case CamelCase HTTPServer",
    "JSON {\"a\": [1, 2, 3]}", "<s> special </s>", "a" * 30, "ǅ ǈ ǋ titlecase", "ﬁ ligature ½ ² ①",
    "",
]

# one label per llama.cpp pre-tokenizer type (byte-level ones), plus one unknown label
BYTE_LEVEL_LABELS = [
    "default", "llama-bpe", "deepseek-llm", "deepseek-coder", "deepseek-v3", "spark2_5", "youtu", "falcon", "mpt",
    "gpt-2", "smollm", "starcoder", "jais-2", "qwen2", "qwen35", "dbrx", "smaug-bpe", "poro-chat", "chatglm-bpe",
    "glm4", "viking", "tekken", "chameleon", "gpt-4o", "granite-embed-multi-97m", "tiny_aya", "superbpe",
    "bailingmoe", "seed-coder", "ufakzeka", "grok-2", "kimi-k2", "afmoe", "laguna", "exaone-moe", "minicpm5",
]
UTF8_LABELS = ["granite-embed-multi-311m", "sarvam-moe"]


def load_vocab(name: str) -> dict:
    return json.loads((DATA / f"vocab_{name}.json").read_text(encoding="utf-8"))


def write_gguf(path: Path, vocab: dict, *, model: str, pre: str | None = None) -> Path:
    """A vocabulary-only GGUF llama.cpp can load (``vocab_only``): llama hparams, no tensors."""
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    writer.add_context_length(256)
    writer.add_embedding_length(64)
    writer.add_block_count(1)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model(model)
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["types"])
    if vocab.get("scores") is not None:
        writer.add_token_scores(vocab["scores"])
    if vocab.get("merges"):
        writer.add_token_merges(vocab["merges"])
    for key, value in vocab.get("ids", {}).items():
        writer.add_uint32(f"tokenizer.ggml.{key}", value)
    if vocab.get("charsmap"):
        import base64

        writer.add_precompiled_charsmap(base64.b64decode(vocab["charsmap"]))
    for key, value in vocab.get("flags", {}).items():
        writer.add_bool(f"tokenizer.ggml.{key}", value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
