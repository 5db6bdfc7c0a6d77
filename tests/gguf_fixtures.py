"""Tiny random GGUF models written with gguf-py (``GGUFWriter``, ``gguf.quants.quantize``).

Tensors are written in llama.cpp's layout and naming (q/k rows as stored, Gemma norms as
``1 + w``), with the metadata and tokenizer transformers' GGUF loader needs, so toolkit and
transformers read the very same bytes. gguf-py cannot quantize K-quants; those tensors are
random but valid blocks (finite fp16 scales, random codes), which decode to well-defined values.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q, GGUFWriter, quants

# byte offset and magnitude of each K-quant block's fp16 scales (d, then dmin where there is one)
_KQUANT_SCALES = {Q.Q2_K: ((80, 82), 4e-3), Q.Q3_K: ((108,), 4e-4), Q.Q4_K: ((0, 2), 1e-4),
                  Q.Q5_K: ((0, 2), 5e-5), Q.Q6_K: ((208,), 5e-5)}
SPECIALS = ("<unk>", "<s>", "</s>")


@dataclass
class Spec:
    """What to write. ``qtype`` is the default type of 2-D weights; ``types`` overrides per GGUF leaf
    (``attn_v``, ``ffn_up``, ``token_embd``...), which is how mixed files like Q4_K_M are made."""

    arch: str = "llama"
    qtype: Q = Q.F16
    types: dict[str, Q] = field(default_factory=dict)
    hidden: int = 64
    ffn: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int | None = None
    tied: bool = False
    tokenizer: str = "llama"  # "llama" (SentencePiece BPE) or "gpt2" (byte-level BPE)
    sliding_window: int = 4
    seed: int = 0
    metadata: dict = field(default_factory=dict)  # extra "{arch}.<key>" entries (float, int or str)
    extra_tensors: dict = field(default_factory=dict)  # name -> float32 array, written as F32

    @property
    def dim(self) -> int:
        return self.head_dim or self.hidden // self.heads


# ---- tokenizers ------------------------------------------------------------------------------------
def corpus() -> list[str]:
    rng = random.Random(0)
    syllables = "ka lo mi ne ru sa to vi pe do ga li mo zu re ta fi bo chá qu 日本 ñe".split()
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(300)]
    lines = [" ".join(rng.choice(words) for _ in range(10)) for _ in range(200)]
    return lines + ["The capital of France is Paris.", "Hello, world! 123 4567", "  indented\n\tcode()"]


def sentencepiece_vocab(size: int = 400) -> dict:
    """A SentencePiece-style BPE vocabulary as llama.cpp stores it: specials, 256 byte tokens,
    then pieces with scores falling in merge order (scores are what merges are derived from)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    model = Tokenizer(models.BPE(byte_fallback=True))
    model.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    model.train_from_iterator(corpus(), trainers.BpeTrainer(vocab_size=size, special_tokens=list(SPECIALS)))
    pieces = [t for t, _ in sorted(model.get_vocab().items(), key=lambda kv: kv[1]) if t not in SPECIALS]
    tokens = [*SPECIALS, *(f"<0x{b:02X}>" for b in range(256)), *pieces]
    types = [2, 3, 3, *[6] * 256, *[1] * len(pieces)]
    scores = [0.0] * (3 + 256) + [-float(i) for i in range(len(pieces))]
    return dict(model="llama", tokens=tokens, types=types, scores=scores, merges=None, pre=None)


def byte_level_vocab(size: int = 400, pre: str = "qwen2") -> dict:
    """A byte-level BPE vocabulary (GPT-2 style) with its merges, as llama.cpp stores Llama 3/Qwen."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    model = Tokenizer(models.BPE())
    model.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    model.train_from_iterator(corpus(), trainer)
    tokens = [t for t, _ in sorted(model.get_vocab().items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in json.loads(model.to_str())["model"]["merges"]]
    types = [3 if t.startswith("<|") else 1 for t in tokens]
    return dict(model="gpt2", tokens=tokens, types=types, scores=None, merges=merges, pre=pre)


def add_tokenizer(writer: GGUFWriter, vocab: dict, *, bos: int, eos: int, chat_template: str | None = None) -> None:
    writer.add_tokenizer_model(vocab["model"])
    if vocab["pre"]:
        writer.add_tokenizer_pre(vocab["pre"])
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["types"])
    if vocab["scores"] is not None:
        writer.add_token_scores(vocab["scores"])
    if vocab["merges"]:
        writer.add_token_merges(vocab["merges"])
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    if chat_template:
        writer.add_chat_template(chat_template)


# ---- tensors ---------------------------------------------------------------------------------------
def encode(values: np.ndarray, qtype: Q, rng: np.random.Generator) -> np.ndarray:
    """``values`` (float32 [rows, cols]) in ``qtype``; types gguf-py cannot quantize (K-quants)
    ignore them and get random blocks instead."""
    if qtype == Q.F32:
        return values.astype(np.float32)
    if qtype == Q.F16:
        return values.astype(np.float16)
    try:
        return quants.quantize(values.astype(np.float32), qtype)
    except NotImplementedError:
        return random_blocks(values.shape[0], values.shape[1], qtype, rng)


def random_blocks(rows: int, cols: int, qtype: Q, rng: np.random.Generator) -> np.ndarray:
    """Random codes; for the K-quants, finite fp16 scales of a magnitude that keeps values O(0.1)."""
    block, type_bytes = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(rows * cols // block, type_bytes), dtype=np.uint8)
    offsets, magnitude = _KQUANT_SCALES.get(qtype, ((), 0.0))
    for offset in offsets:
        scale = (rng.uniform(0.5, 1.5, size=blocks.shape[0]) * magnitude).astype(np.float16)
        blocks[:, offset:offset + 2] = scale.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, cols // block * type_bytes)


def layer_tensors(spec: Spec, i: int) -> dict[str, tuple[int, ...]]:
    """GGUF leaf -> [rows, cols] (torch order) of the 2-D weights of layer ``i``."""
    q_rows, kv_rows = spec.heads * spec.dim, spec.kv_heads * spec.dim
    return {"attn_q": (q_rows, spec.hidden), "attn_k": (kv_rows, spec.hidden), "attn_v": (kv_rows, spec.hidden),
            "attn_output": (spec.hidden, q_rows), "ffn_gate": (spec.ffn, spec.hidden),
            "ffn_up": (spec.ffn, spec.hidden), "ffn_down": (spec.hidden, spec.ffn)}


def norm_leaves(arch: str) -> dict[str, str]:
    """Per-layer norm leaf -> which size it has ("hidden" or "head")."""
    leaves = {"attn_norm": "hidden", "ffn_norm": "hidden"}
    if arch in ("qwen3", "gemma3"):
        leaves |= {"attn_q_norm": "head", "attn_k_norm": "head"}
    if arch == "gemma3":
        leaves |= {"post_attention_norm": "hidden", "post_ffw_norm": "hidden"}
    return leaves


def model_tensors(spec: Spec, vocab: int):
    """Yield (name, encoded array, raw qtype or None) for every tensor of the model."""
    rng = np.random.default_rng(spec.seed)

    def weight(leaf: str, rows: int, cols: int, name: str):
        qtype = spec.types.get(leaf, spec.qtype)
        values = rng.normal(0.0, cols ** -0.5, size=(rows, cols)).astype(np.float32)
        data = encode(values, qtype, rng)
        return name, data, (None if qtype in (Q.F32, Q.F16) else qtype)

    def norm(size: int, name: str):
        base = 1.0 if spec.arch == "gemma3" else 0.0  # Gemma's file stores 1 + w
        return name, (base + rng.normal(1.0 - base, 0.1, size=size)).astype(np.float32), None

    for name, values in spec.extra_tensors.items():
        yield name, np.asarray(values, dtype=np.float32), None
    yield weight("token_embd", vocab, spec.hidden, "token_embd.weight")
    yield norm(spec.hidden, "output_norm.weight")
    if not spec.tied:
        yield weight("output", vocab, spec.hidden, "output.weight")
    for i in range(spec.layers):
        for leaf, (rows, cols) in layer_tensors(spec, i).items():
            yield weight(leaf, rows, cols, f"blk.{i}.{leaf}.weight")
        for leaf, size in norm_leaves(spec.arch).items():
            yield norm(spec.hidden if size == "hidden" else spec.dim, f"blk.{i}.{leaf}.weight")
        if spec.arch == "qwen2":
            for leaf, (rows, _) in list(layer_tensors(spec, i).items())[:3]:
                yield f"blk.{i}.{leaf}.bias", rng.normal(0, 0.1, size=rows).astype(np.float32), None


# ---- files -----------------------------------------------------------------------------------------
def add_hparams(writer: GGUFWriter, spec: Spec, vocab: int) -> None:
    a = spec.arch
    writer.add_uint32(f"{a}.context_length", 256)
    writer.add_uint32(f"{a}.embedding_length", spec.hidden)
    writer.add_uint32(f"{a}.block_count", spec.layers)
    writer.add_uint32(f"{a}.feed_forward_length", spec.ffn)
    writer.add_uint32(f"{a}.attention.head_count", spec.heads)
    writer.add_uint32(f"{a}.attention.head_count_kv", spec.kv_heads)
    writer.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_float32(f"{a}.rope.freq_base", 10000.0)
    if a == "llama":
        writer.add_uint32(f"{a}.rope.dimension_count", spec.dim)
    if a in ("qwen3", "gemma3"):
        writer.add_uint32(f"{a}.attention.key_length", spec.dim)
        writer.add_uint32(f"{a}.attention.value_length", spec.dim)
    if a == "gemma3":
        writer.add_uint32(f"{a}.attention.sliding_window", spec.sliding_window)
    for key, value in spec.metadata.items():
        add = writer.add_string if isinstance(value, str) else writer.add_float32 if isinstance(value, float) \
            else writer.add_uint32
        add(f"{a}.{key}", value)


def write_model(path: Path, spec: Spec, *, split_max_tensors: int = 0, vocab: dict | None = None,
                chat_template: str | None = None) -> Path:
    """Write ``spec`` as a GGUF file (or split parts) at ``path``; returns the (first) file's path."""
    vocab = vocab or (byte_level_vocab() if spec.tokenizer == "gpt2" else sentencepiece_vocab())
    count = len(vocab["tokens"])
    writer = GGUFWriter(str(path), spec.arch, split_max_tensors=split_max_tensors)
    writer.add_name(f"tiny-{spec.arch}")
    add_hparams(writer, spec, count)
    add_tokenizer(writer, vocab, bos=1, eos=2, chat_template=chat_template)
    for name, data, raw in model_tensors(spec, count):
        writer.add_tensor(name, data, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if split_max_tensors:
        return sorted(Path(path).parent.glob(f"{Path(path).stem}-00001-of-*.gguf"))[0]
    return Path(path)
