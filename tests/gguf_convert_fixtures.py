"""Sources and helpers of the ``toolkit convert`` GGUF tests (test_gguf_convert*.py): tiny random
transformers models with real tokenizers saved beside them, and logits/error helpers. The
tolerances they serve are explained in test_gguf_convert.py's docstring."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers as tf
from gguf import GGMLQuantizationType as Q, GGUFReader, quants
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from gguf_fixtures import corpus
from toolkit.plugins.loaders.gguf.tokenizer import QWEN2_SPLIT

TOLERANCE = 2e-5
SIZES = dict(hidden_size=256, intermediate_size=512, max_position_embeddings=256, rms_norm_eps=1e-6)
TEXTS = ["Hello world", " leading space", "  two  spaces   here", "kalomi nerusa tovipe", "digits 1234567 3.14",
         "unicode: héllo ñ 日本語", "emoji 😀🚀", "tabs\tand\nnewlines\n\nend",
         "<|im_start|>user\nhi<|im_end|>", "<s> inner </s>", ""]
CHAT = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


@pytest.fixture(autouse=True)
def float_activations(monkeypatch):
    """The logits bounds here are float32 round-off: the compiled CPU kernels keep float32
    activations (their default 8-bit ones, GEMV and int8 GEMM, have bound tests of their own in
    test_gguf_cpu_kernels)."""
    from toolkit.kernels.gguf_cpu import ops  # noqa: PLC0415

    monkeypatch.setattr(ops, "INT8_ACTIVATIONS", False)


# ---- sources --------------------------------------------------------------------------------------

def sentencepiece_tokenizer(*, gemma: bool) -> tf.PreTrainedTokenizerFast:
    """A BPE vocabulary with byte fallback, as Llama 2 (Metaspace, prefix space) or Gemma
    (spaces replaced by a normalizer, no prefix) spell it: specials, 256 byte tokens, pieces."""
    specials = ["<pad>", "</s>", "<s>", "<unk>"] if gemma else ["<unk>", "<s>", "</s>"]
    backend = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    if gemma:
        backend.normalizer = normalizers.Replace(" ", "\u2581")  # and no pre-tokenizer: pieces may span spaces
    else:
        backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    backend.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
                                        + ([] if gemma else [decoders.Strip(" ", 1, 0)]))
    alphabet = [f"<0x{b:02X}>" for b in range(256)]
    lines = corpus() + ["  indented", "    deeper", "a  b   c"] * 20
    backend.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=1000, special_tokens=specials + alphabet,
                                                            show_progress=False))
    bos = ("<s>", specials.index("<s>"))
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[bos])
    return tf.PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                      pad_token="<pad>" if gemma else None)


def byte_level_tokenizer() -> tf.PreTrainedTokenizerFast:
    """Qwen2-style byte-level BPE: Qwen2's split regex, chat specials, no BOS."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    backend.train_from_iterator(corpus(), trainers.BpeTrainer(vocab_size=1000, special_tokens=specials,
                                                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                              show_progress=False))
    return tf.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                      chat_template=CHAT)


def hf_model(kind: str, tokenizer):
    ids = dict(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id)
    if kind == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(**SIZES, **ids, num_hidden_layers=2, num_attention_heads=4,
                                                  num_key_value_heads=2, tie_word_embeddings=False))
    if kind == "qwen2":
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(**SIZES, **ids, num_hidden_layers=2, num_attention_heads=4,
                                                  num_key_value_heads=2, tie_word_embeddings=True))
    # transformers' GGUF Gemma 3 keeps query_pre_attn_scalar at 256, so head_dim is 256; six layers
    # with a window of 4 give five sliding layers and one global one (intermediate 256 keeps it quick)
    sizes = {**SIZES, "intermediate_size": 256}
    return tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(**sizes, **ids, num_hidden_layers=6, num_attention_heads=2,
                                                    num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                                                    sliding_window=4))


def randomize(model, *, embed_std: float = 0.08):
    """Every parameter re-drawn (transformers starts norms and biases at constants); Gemma's
    embeddings are scaled by sqrt(hidden) in the model, hence its smaller ``embed_std``."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            std = 0.3 if "norm" in name else embed_std if "embed" in name else 0.08
            param.copy_(torch.randn(param.shape, generator=generator) * std)
    return model.eval()


def save_source(path: Path, kind: str):
    tokenizer = {"llama": lambda: sentencepiece_tokenizer(gemma=False), "qwen2": byte_level_tokenizer,
                 "gemma3": lambda: sentencepiece_tokenizer(gemma=True)}[kind]()
    model = randomize(hf_model(kind, tokenizer), embed_std=0.1 / 16 if kind == "gemma3" else 0.08)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model, tokenizer


@pytest.fixture(scope="module", params=["llama", "qwen2", "gemma3"])
def source(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param) / "hf"
    model, tokenizer = save_source(path, request.param)
    return request.param, path, model, tokenizer


# ---- helpers --------------------------------------------------------------------------------------
def prompt(tokenizer) -> list[int]:
    return tokenizer("kalomi nerusa tovipe ka lo mi ne ru sa")["input_ids"][:12]


def logits_of(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def transformers_gguf(path: Path):
    return tf.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()


def relative_error(ours: torch.Tensor, expected: torch.Tensor) -> float:
    return (ours - expected).abs().max().item() / expected.abs().max().item()


def gguf_types(path: Path) -> dict[str, str]:
    return {t.name: t.tensor_type.name for t in GGUFReader(str(path)).tensors}


def rms_error(ours: torch.Tensor, expected: torch.Tensor) -> float:
    return ((ours - expected).norm() / expected.norm()).item()


def quantized_reference(model, qtype: Q):
    """The model with each 2-D weight replaced by gguf-py's ``qtype`` round trip of it."""
    import copy

    quantized = copy.deepcopy(model)
    with torch.no_grad():
        for param in quantized.parameters():
            if param.ndim == 2:
                param.copy_(torch.from_numpy(quants.dequantize(quants.quantize(param.numpy(), qtype), qtype)))
    return quantized
