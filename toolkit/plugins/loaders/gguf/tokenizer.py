"""A fast tokenizer built straight from GGUF metadata (``tokenizer.ggml.*``).

The vocabulary, scores, token types and merges go directly into a ``tokenizers.Tokenizer``
(Rust), wrapped in ``transformers.PreTrainedTokenizerFast`` with the file's special tokens and
chat template. Two families, chosen by ``tokenizer.ggml.model``:

* ``llama``: SentencePiece BPE (Llama 2, Gemma): ``▁`` for spaces, byte fallback. Files rarely
  store merges, so they are derived from the vocabulary (see ``merges.py``).
* ``gpt2``: byte-level BPE (Llama 3, Qwen) with the file's merges and the split regex its
  ``tokenizer.ggml.pre`` names.
"""
from __future__ import annotations

import warnings

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

from .merges import byte_level_alphabet, sentencepiece_merges
from .metadata import Metadata

CONTROL, USER_DEFINED = 3, 4  # llama.cpp token types
SPACE = "\u2581"  # SentencePiece's visible space
GEMMA_ARCHS = ("gemma", "gemma2", "gemma3")

# Split regexes of byte-level vocabularies, by tokenizer.ggml.pre (the pattern the merges were learned on).
_WORDS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+"
_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
LLAMA3_SPLIT = _WORDS + r"|\p{N}{1,3}" + _TAIL
QWEN2_SPLIT = _WORDS + r"|\p{N}" + _TAIL
PRE_TOKENIZER_SPLITS = {"llama3": LLAMA3_SPLIT, "llama-v3": LLAMA3_SPLIT, "llama-bpe": LLAMA3_SPLIT,
                        "smaug-bpe": LLAMA3_SPLIT, "dbrx": LLAMA3_SPLIT, "qwen2": QWEN2_SPLIT,
                        "deepseek-r1-qwen": QWEN2_SPLIT}


def build_tokenizer(metadata: Metadata):
    """A ``PreTrainedTokenizerFast`` for the file, or None (with a warning) if it has no usable vocabulary."""
    if "tokenizer.ggml.tokens" not in metadata:
        return None
    kind = metadata.get("tokenizer.ggml.model", "llama")
    builders = {"llama": _sentencepiece, "gpt2": _byte_level}
    if kind not in builders:
        warnings.warn(f"{metadata.file}: GGUF tokenizer model {kind!r} is not supported "
                      f"({', '.join(builders)}); pass --tokenizer to use another", stacklevel=2)
        return None
    tokens = list(metadata["tokenizer.ggml.tokens"])
    backend, tokens = builders[kind](metadata, tokens)
    _add_marked_tokens(backend, tokens, metadata, byte_level=kind == "gpt2")
    return _wrap(backend, tokens, metadata)


def _sentencepiece(metadata: Metadata, tokens: list[str]) -> tuple[Tokenizer, list[str]]:
    is_gemma = metadata.get("general.architecture") in GEMMA_ARCHS
    if is_gemma:
        # llama.cpp stores Gemma's all-space tokens with real spaces; the text side spells them "▁".
        tokens = [SPACE * len(t) if t and not t.strip(" ") else t for t in tokens]
    vocab = {token: index for index, token in enumerate(tokens)}
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id")
    # byte fallback spells any character the vocabulary lacks, so the unk token is a formality
    backend = Tokenizer(BPE(vocab=vocab, merges=_sentencepiece_merges(metadata, tokens, vocab, is_gemma),
                            fuse_unk=True, byte_fallback=True, dropout=None,
                            unk_token=tokens[unk_id] if unk_id is not None else None))
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if is_gemma:  # no prefix space; every space becomes "▁" before BPE
        backend.normalizer = normalizers.Replace(" ", SPACE)
    else:
        prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
        backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="first" if prefix
                                                         else "never", split=False)
        steps += [decoders.Strip(content=" ", left=1)] if prefix else []
    backend.decoder = decoders.Sequence(steps)
    return backend, tokens


def _sentencepiece_merges(metadata: Metadata, tokens: list[str], vocab: dict[str, int],
                          is_gemma: bool) -> list[tuple[str, str]]:
    """The file's merges if it has them; else derived from the scores (Gemma: from the file order,
    which its merge order follows while its scores do not)."""
    if "tokenizer.ggml.merges" in metadata:
        return [tuple(m.split(" ", 1)) for m in metadata["tokenizer.ggml.merges"]]
    if is_gemma:
        scores = {token: -index for index, token in enumerate(tokens)}
    else:
        scores = dict(zip(tokens, metadata["tokenizer.ggml.scores"]))
    return sentencepiece_merges(vocab, scores)


def _byte_level(metadata: Metadata, tokens: list[str]) -> tuple[Tokenizer, list[str]]:
    alphabet, spell = byte_level_alphabet()
    # a token with characters outside the byte alphabet (a raw special token) is spelled in it
    tokens = [t if set(t) <= alphabet else "".join(spell[b] for b in t.encode("utf-8")) for t in tokens]
    vocab = {token: index for index, token in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in metadata.get("tokenizer.ggml.merges", [])]
    backend = Tokenizer(BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                            end_of_word_suffix="", fuse_unk=False))
    split = PRE_TOKENIZER_SPLITS.get(metadata.get("tokenizer.ggml.pre"))
    if split is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                                         pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                                  use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    return backend, tokens


def _add_marked_tokens(backend: Tokenizer, tokens: list[str], metadata: Metadata, *, byte_level: bool) -> None:
    """Control tokens become special added tokens, user-defined ones plain added tokens: both are
    matched whole in the text (llama.cpp does the same), never cut by BPE."""
    types = metadata.get("tokenizer.ggml.token_type")
    if types is None:
        return
    alphabet = byte_level_alphabet()[0] if byte_level else None
    # a byte-level "control" token outside the alphabet is a mislabel; adding it would grow the vocab
    control = [AddedToken(t, normalized=False, special=True) for t, kind in zip(tokens, types)
               if kind == CONTROL and (alphabet is None or set(t) <= alphabet)]
    user = [AddedToken(t, normalized=False, special=False) for t, kind in zip(tokens, types) if kind == USER_DEFINED]
    backend.add_special_tokens(control)
    backend.add_tokens(user)


def _wrap(backend: Tokenizer, tokens: list[str], metadata: Metadata):
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415 - heavy import, only when building

    def token(key: str) -> str | None:
        index = metadata.get(f"tokenizer.ggml.{key}")
        return tokens[index] if index is not None and 0 <= index < len(tokens) else None

    is_sentencepiece = metadata.get("tokenizer.ggml.model", "llama") == "llama"
    options = dict(
        bos_token=token("bos_token_id"), eos_token=token("eos_token_id"),
        unk_token=token("unknown_token_id"), pad_token=token("padding_token_id"),
        # llama.cpp adds BOS to SentencePiece vocabularies unless the file says otherwise
        add_bos_token=bool(metadata.get("tokenizer.ggml.add_bos_token", is_sentencepiece)),
        add_eos_token=bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
        chat_template=metadata.get("tokenizer.chat_template"), clean_up_tokenization_spaces=False)
    # ``tokenizer_object=`` deep-copies the backend (a JSON round trip: ~5 s for 262k tokens). A
    # wrapper whose backend is already set adopts it as is; older transformers refuse that, so fall back.
    wrapper = PreTrainedTokenizerFast.__new__(PreTrainedTokenizerFast)
    wrapper._tokenizer = backend
    try:
        PreTrainedTokenizerFast.__init__(wrapper, **options)
    except ValueError:
        return PreTrainedTokenizerFast(tokenizer_object=backend, **options)
    return wrapper
