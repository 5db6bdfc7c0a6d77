"""Unigram (``tokenizer.ggml.model = t5``, llama.cpp's UGM) from GGUF metadata, encoding as llama.cpp does.

llama.cpp normalizes with the file's SentencePiece ``precompiled_charsmap``, writes spaces as
``▁`` (one ``▁`` before the first word when ``add_space_prefix``; with
``remove_extra_whitespaces`` every word gets one and spaces themselves vanish), then picks the
best-scoring segmentation (Viterbi), an uncovered character costing the lowest score minus 10
and runs of them folding into one unknown token. ``tokenizers``' Unigram model runs the same
search; the normalizer below reproduces the whitespace rules.
"""
from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers
from tokenizers.models import Unigram

from .metadata import Metadata

SPACE = "\u2581"
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED = 1, 2, 3, 4, 5


def unigram(metadata: Metadata, tokens: list[str]) -> Tokenizer:
    types = metadata.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    scores = [float(s) for s in metadata.get("tokenizer.ggml.scores") or [0.0] * len(tokens)]
    normal = [s for s, kind in zip(scores, types) if kind == NORMAL]
    floor = min(normal) if normal else 0.0
    # llama.cpp scores user-defined pieces 0.0 and never matches control, byte or unknown pieces in
    # text: those keep the lowest normal score so the unknown-character penalty stays llama.cpp's
    pieces = [(t, 0.0 if kind == USER_DEFINED else s if kind in (NORMAL, UNUSED) else floor)
              for t, s, kind in zip(tokens, scores, types)]
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id", 2)
    backend = Tokenizer(Unigram(pieces, unk_id=unk_id if unk_id is not None and unk_id < len(tokens) else None,
                                byte_fallback=False))
    steps = []
    charsmap = metadata.get("tokenizer.ggml.precompiled_charsmap")
    if charsmap is not None and len(charsmap):
        steps.append(normalizers.Precompiled(bytes(bytearray(int(b) & 0xFF for b in charsmap))))
    prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", False))
    if metadata.get("tokenizer.ggml.remove_extra_whitespaces", False):
        steps += [normalizers.Replace(Regex(r"\A +| +\z"), ""), normalizers.Replace(Regex(" +"), " ")]
        prefix = True  # llama.cpp's merging puts a "▁" before every word, the first included
    if prefix:
        steps.append(normalizers.Prepend(" "))
    steps.append(normalizers.Replace(" ", SPACE))
    backend.normalizer = normalizers.Sequence(steps)
    backend.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="always" if prefix else "never")
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True)
                                for t, kind in zip(tokens, types) if kind == CONTROL and t])
    backend.add_tokens([AddedToken(t, normalized=False, special=False)
                        for t, kind in zip(tokens, types) if kind == USER_DEFINED and t])
    return backend
