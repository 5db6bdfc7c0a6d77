"""A transformers tokenizer -> GGUF ``tokenizer.ggml.*`` metadata: the inverse of tokenizer.py.

Read from the fast tokenizer's ``backend_tokenizer`` JSON (vocabulary, merges, added tokens,
pre-tokenizer), written the way llama.cpp's converter writes it:

* byte-level BPE (Llama 3, Qwen, SmolLM): ``gpt2`` with tokens, token types and merges, and the
  ``tokenizer.ggml.pre`` label of its split (the label the source GGUF had when it came from
  one, else one llama.cpp reads the same way, from the reader's own table);
* SentencePiece-style BPE with byte fallback (Llama 2, Gemma): ``llama`` with tokens, scores
  (minus the rank of the merge that makes each piece, so llama.cpp's score-driven merging
  follows the same order) and token types. No merges: llama.cpp's SentencePiece tokenizer never
  reads them (Gemma's 514,906 would add 9 MB). Gemma's all-space pieces are stored as spaces,
  as llama.cpp stores them.

Token ids past the tokenizer's last token, up to the embedding's rows, become ``[PAD{i}]``
tokens of type UNUSED, as llama.cpp pads them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gguf import GGUFWriter, TokenType

from toolkit.core.errors import ConversionError

from .pretokenizers import PRE_TOKENIZERS, label_for_regexes
from .tokenizer import GEMMA_ARCHS, SPACE

BYTE_TOKEN_LENGTH = len("<0x00>")
NO_SCORE = -1000.0


@dataclass
class Vocab:
    """What goes under ``tokenizer.ggml.*`` (``notes`` are facts for the conversion summary)."""

    model: str
    tokens: list[str]
    types: list[int]
    merges: list[str]
    scores: list[float] | None = None
    pre: str | None = None
    add_space_prefix: bool | None = None
    notes: list[str] = field(default_factory=list)


def vocab_from(tokenizer, *, gguf_arch: str, vocab_size: int) -> Vocab:
    """The GGUF vocabulary of a transformers fast tokenizer (ConversionError if it has no BPE model)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ConversionError(f"the source tokenizer ({type(tokenizer).__name__}) is not a fast tokenizer; "
                              "GGUF conversion reads the vocabulary from its tokenizer.json")
    spec = json.loads(backend.to_str())
    if spec["model"]["type"] != "BPE":
        raise ConversionError(f"tokenizer model {spec['model']['type']!r} cannot be written to GGUF yet "
                              "(BPE vocabularies only: byte-level or SentencePiece-style)")
    tokens, added = _tokens(spec, vocab_size)
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"].get("merges", [])]
    if _has_type(spec.get("pre_tokenizer"), "ByteLevel") or _has_type(spec.get("decoder"), "ByteLevel"):
        return _byte_level(spec, tokens, added, merges, source_pre=getattr(tokenizer, "gguf_pre", None))
    return _sentencepiece(spec, tokens, added, merges, is_gemma=gguf_arch in GEMMA_ARCHS)


def _tokens(spec: dict, vocab_size: int) -> tuple[list[str | None], dict[int, dict]]:
    added = {int(t["id"]): t for t in spec.get("added_tokens", [])}
    by_id: dict[int, str] = {int(i): t for t, i in spec["model"]["vocab"].items()}
    by_id.update({i: t["content"] for i, t in added.items()})
    count = max(by_id) + 1
    if count > vocab_size:
        raise ConversionError(f"the tokenizer has {count} tokens but the model's embedding only {vocab_size} rows")
    return [by_id.get(i) for i in range(vocab_size)], added


def _has_type(node: Any, kind: str) -> bool:
    if isinstance(node, dict):
        return node.get("type") == kind or any(_has_type(v, kind) for v in node.values())
    if isinstance(node, list):
        return any(_has_type(v, kind) for v in node)
    return False


def _added_type(entry: dict) -> int:
    return TokenType.CONTROL if entry.get("special") else TokenType.USER_DEFINED


def _filled(tokens: list[str | None]) -> tuple[list[str], set[int]]:
    """Unused ids become ``[PAD{i}]`` (llama.cpp's spelling); returns the tokens and those ids."""
    unused = {i for i, t in enumerate(tokens) if t is None}
    return [f"[PAD{i}]" if t is None else t for i, t in enumerate(tokens)], unused


def _byte_level(spec: dict, tokens: list[str | None], added: dict[int, dict], merges: list[str], *,
                source_pre: str | None = None) -> Vocab:
    filled, unused = _filled(tokens)
    types = [TokenType.UNUSED if i in unused else _added_type(added[i]) if i in added else TokenType.NORMAL
             for i in range(len(filled))]
    pre, notes = _pre_name(spec.get("pre_tokenizer"))
    if source_pre in PRE_TOKENIZERS and PRE_TOKENIZERS[source_pre] is PRE_TOKENIZERS.get(pre):
        pre = source_pre  # a GGUF source's own label, where it splits as the one found
    return Vocab("gpt2", filled, [int(t) for t in types], merges, pre=pre, notes=notes)


def _pre_name(pre_tokenizer: dict | None) -> tuple[str, list[str]]:
    """``tokenizer.ggml.pre`` for a byte-level pre-tokenizer: a label whose splits are its splits."""
    regexes = _split_regexes(pre_tokenizer)
    if _uses_byte_level_regex(pre_tokenizer):
        regexes.append(PRE_TOKENIZERS["gpt-2"].regexes[0])  # ByteLevel's built-in GPT-2 split
    if _has_type(pre_tokenizer, "Digits"):  # digits isolated first (SmolLM, StarCoder)
        regexes.insert(0, PRE_TOKENIZERS["smollm"].regexes[0])
    label = label_for_regexes(regexes)
    if label is not None:
        return label, []
    return "default", [f"tokenizer.ggml.pre: split {regexes!r} is not one llama.cpp names; readers may split "
                       "text differently"]


def _uses_byte_level_regex(node: Any) -> bool:
    if isinstance(node, dict):
        if node.get("type") == "ByteLevel":
            return bool(node.get("use_regex", True))
        return any(_uses_byte_level_regex(v) for v in node.values())
    return any(_uses_byte_level_regex(v) for v in node) if isinstance(node, list) else False


def _split_regexes(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [node["pattern"]["Regex"]] if node.get("type") == "Split" and "Regex" in node.get("pattern", {}) else []
        return own + [r for v in node.values() for r in _split_regexes(v)]
    if isinstance(node, list):
        return [r for v in node for r in _split_regexes(v)]
    return []


def _sentencepiece(spec: dict, tokens: list[str | None], added: dict[int, dict], merges: list[str], *,
                   is_gemma: bool) -> Vocab:
    filled, unused = _filled(tokens)
    unk = spec["model"].get("unk_token")
    types = [_piece_type(i, t, added, unused, unk) for i, t in enumerate(filled)]
    rank = {}
    for index, merge in enumerate(merges):
        rank.setdefault(merge.replace(" ", "", 1), index)
    unmerged = len(merges)
    # pieces no merge makes rank after all merges; other tokens never win a merge (llama.cpp: -1000)
    scores = [-float(rank.get(t, unmerged + i)) if kind == TokenType.NORMAL else 0.0 if kind == TokenType.BYTE
              else NO_SCORE for i, (t, kind) in enumerate(zip(filled, types))]
    if is_gemma:  # llama.cpp stores Gemma's pieces of two or more spaces as real spaces
        filled = [" " * len(t) if len(t) > 1 and not t.strip(SPACE) else t for t in filled]
    return Vocab("llama", filled, types, [], scores=scores, add_space_prefix=_adds_prefix(spec))


def _piece_type(index: int, token: str, added: dict[int, dict], unused: set[int], unk: str | None) -> int:
    if index in unused:
        return int(TokenType.UNUSED)
    if index in added:  # matched whole in text, as the source tokenizer does (an added <unk> too)
        return int(_added_type(added[index]))
    if token == unk:
        return int(TokenType.UNKNOWN)
    if len(token) == BYTE_TOKEN_LENGTH and token.startswith("<0x") and token.endswith(">"):
        return int(TokenType.BYTE)
    return int(TokenType.NORMAL)


def _adds_prefix(spec: dict) -> bool:
    """Whether text gets a leading "▁": a Metaspace that prepends, or a Prepend normalizer."""
    def walk(node: Any) -> bool:
        if isinstance(node, dict):
            if node.get("type") == "Metaspace":
                return node.get("prepend_scheme", "always") != "never" and node.get("add_prefix_space", True)
            if node.get("type") == "Prepend":
                return node.get("prepend") == SPACE
            return any(walk(v) for v in node.values())
        return any(walk(v) for v in node) if isinstance(node, list) else False

    return walk(spec.get("normalizer")) or walk(spec.get("pre_tokenizer"))


def special_entries(tokenizer, *, bos: int | None, eos: tuple[int, ...]) -> dict[str, Any]:
    """Special token ids, add-BOS/EOS flags and the chat template, as ``tokenizer.ggml.*`` values."""
    ids = {"bos_token_id": bos if bos is not None else tokenizer.bos_token_id,
           "eos_token_id": eos[0] if eos else tokenizer.eos_token_id,
           "eot_token_id": eos[-1] if len(eos) > 1 else None,  # the reader stops at eos and eot
           "padding_token_id": tokenizer.pad_token_id, "unknown_token_id": tokenizer.unk_token_id}
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a")["input_ids"]
    flags = {"add_bos_token": ids["bos_token_id"] is not None and len(full) > len(plain)
             and full[0] == ids["bos_token_id"],
             "add_eos_token": ids["eos_token_id"] is not None and len(full) > len(plain)
             and full[-1] == ids["eos_token_id"]}
    return {"ids": {k: v for k, v in ids.items() if v is not None}, "flags": flags,
            "chat_template": _chat_template(tokenizer)}


def _chat_template(tokenizer) -> str | None:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates: GGUF's main key holds the default one
        template = template.get("default")
    return template if isinstance(template, str) and template else None


def add_vocab(writer: GGUFWriter, vocab: Vocab, specials: dict[str, Any]) -> None:
    writer.add_tokenizer_model(vocab.model)
    if vocab.pre:
        writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    if vocab.scores is not None:
        writer.add_token_scores(vocab.scores)
    if vocab.merges:
        writer.add_token_merges(vocab.merges)
    if vocab.add_space_prefix is not None:
        writer.add_add_space_prefix(vocab.add_space_prefix)
    for key, value in specials["ids"].items():
        writer.add_uint32(f"tokenizer.ggml.{key}", int(value))
    writer.add_add_bos_token(specials["flags"]["add_bos_token"])
    writer.add_add_eos_token(specials["flags"]["add_eos_token"])
    if specials["chat_template"]:
        writer.add_chat_template(specials["chat_template"])
