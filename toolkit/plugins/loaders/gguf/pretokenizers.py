"""How llama.cpp splits text before BPE, by ``tokenizer.ggml.pre``.

llama.cpp maps each ``pre`` label to a pre-tokenizer type and each type to a list of regexes,
applied one after the other: every regex cuts each piece the previous ones left, keeping the
matches and the text between them as pieces (a ``tokenizers`` ``Split(..., "isolated")`` per
regex does the same, lookaheads included, since both confine a match to its piece). The regexes
below are llama.cpp's, written for Oniguruma (the engine ``tokenizers`` uses): where llama.cpp
replaced a construct its C++ engine lacks (``(?i:...)``), either form means the same here.

A type also says whether pieces are byte-encoded (GPT-2's printable byte alphabet) or kept as
UTF-8 with spaces written ``▁`` (SentencePiece-style BPE vocabularies, e.g. Gemma 4 and the
files llama.cpp's converter writes from a SentencePiece ``tokenizer.json``), and whether a piece
that is itself a token skips the merges (``ignore_merges``).
"""
from __future__ import annotations

from toolkit.core.records import FrozenRecord

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
_CASED = (r"[^\r\n\p{{L}}\p{{N}}]?((?=[{L}])([^a-z]))*((?=[{L}])([^A-Z]))+{C}"
          r"|[^\r\n\p{{L}}\p{{N}}]?((?=[{L}])([^a-z]))+((?=[{L}])([^A-Z]))*{C}")
_TAIL_SLASH = r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
TEKKEN = _CASED.format(L=r"\p{L}", C="") + r"|\p{N}|" + _TAIL_SLASH
GPT4O = _CASED.format(L=r"\p{L}", C=_CONTRACTIONS + "?") + r"|\p{N}{1,3}|" + _TAIL_SLASH
GRANITE_EMB_MULTI = _CASED.format(L=r"\p{L}\p{M}", C=_CONTRACTIONS + "?") + r"|\p{N}{1,3}|" + _TAIL_SLASH
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
TINY_AYA = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
            rf"{_CONTRACTIONS}?|\p{{N}}{{1,3}}|" + _TAIL_SLASH)
_HAN_KANA = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
_PORO_SPLIT = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"
_CJK_HANGUL = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
YOUTU = ("[\uac00-\ud7a3\u3131-\u318e]+|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b\uff0c\u3001-\u303f"
         "\ufe30-\ufe4f]+|[\u3105-\u312f]+|" + _HAN_KANA,
         rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
         rf"{_CONTRACTIONS}?|\p{{N}}|" + _TAIL_SLASH)
# Kimi K2's pattern as llama.cpp's hand-written split runs it: Han runs, then letter runs without Han
# (its cased classes and marks reduce to "letters" there), digits by three, punctuation, spaces.
KIMI_K2 = (rf"[\p{{Han}}]+|[^\r\n\p{{L}}\p{{N}}]?[\p{{L}}&&[^\p{{Han}}]]+{_CONTRACTIONS}?|\p{{N}}{{1,3}}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Digit runs cut into threes from the right (1234567 -> 1 234 567). llama.cpp's hand-written split
# keeps the text before a digit run in the run's first group ("a 12345" -> "a 12", "345"); so do we.
DIGITS_BY_THREE = r"\P{N}*\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))"
NEWLINES = r"[^\n]+|[\n]+"
_PUNCT_WORDS = r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"
_DEEPSEEK_LATIN = (
    "[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]")


class PreTokenizer(FrozenRecord):
    """One llama.cpp pre-tokenizer type: its split regexes, in order, and how pieces are fed to BPE.
    (A hand-written record, not a dataclass: a GGUF load imports this module; toolkit/core/records.py
    says why.)"""
    name: str
    regexes: tuple[str, ...]
    byte_encode: bool          # False: raw UTF-8 pieces, <0xXX> byte fallback
    escape_whitespace: bool    # spaces become "▁" before splitting
    ignore_merges: bool        # a piece that is a whole token is not merged
    add_bos: bool | None       # llama.cpp's add-BOS default for the type (None: the model's)
    force_bos: bool            # add BOS even when the file says not to (llama.cpp's Gemma 4 rule)

    def __init__(self, name: str, regexes: tuple[str, ...], byte_encode: bool = True, escape_whitespace: bool = False,
                 ignore_merges: bool = False, add_bos: bool | None = None, force_bos: bool = False):
        self.__dict__.update(name=name, regexes=regexes, byte_encode=byte_encode, escape_whitespace=escape_whitespace,
                             ignore_merges=ignore_merges, add_bos=add_bos, force_bos=force_bos)


def _type(name, *regexes, **flags) -> PreTokenizer:
    return PreTokenizer(name, tuple(regexes), **flags)


_STARCODER = _type("starcoder", r"\p{N}", GPT2)
_GPT2 = _type("gpt2", GPT2)
_QWEN2 = _type("qwen2", QWEN2)
_LLAMA3 = _type("llama3", LLAMA3, ignore_merges=True, add_bos=True)
_CHATGLM4 = _type("chatglm4", LLAMA3)
_DEEPSEEK3 = _type("deepseek3", r"\p{N}{1,3}", _HAN_KANA,
                   _PUNCT_WORDS + r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O = _type("gpt4o", GPT4O)
_GEMMA4 = _type("gemma4", NEWLINES, byte_encode=False, escape_whitespace=True, add_bos=True, force_bos=True)
_PORO = _type("poro", _PORO_SPLIT)
#: the type llama.cpp uses when a byte-level file names no pre-tokenizer
DEFAULT = _type("default", r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]")

# label -> type, as llama.cpp's llama_vocab::load reads tokenizer.ggml.pre
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": DEFAULT,
    "minicpm5": _type("minicpm5", r"\p{N}{1,3}", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+"
                      r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+", ignore_merges=True),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                     "jina-v5-nano"), _LLAMA3),
    **dict.fromkeys(("deepseek-llm",), _type(
        "deepseek-llm", r"[\r\n]", r"\s?" + _DEEPSEEK_LATIN + "+", r"\s?[!-/:-~" "\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
        r"\s+\z", _CJK_HANGUL, r"\p{N}+")),
    "deepseek-coder": _type("deepseek-coder", r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK_HANGUL, r"\p{N}"),
    **dict.fromkeys(("deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"), _DEEPSEEK3),
    "spark2_5": _type("spark2_5", r"\p{N}{1,3}", _HAN_KANA,
                      _PUNCT_WORDS + r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+",
                      r"\p{N}"),
    "youtu": _type("youtu", *YOUTU, ignore_merges=True),
    "falcon": _type("falcon", r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"),
    "mpt": _GPT2, "olmo": _GPT2, "jais": _GPT2, "trillion": _GPT2, "granite-docling": _GPT2, "exaone4": _GPT2,
    **dict.fromkeys(("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
                     "mellum", "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe"), _GPT2),
    **dict.fromkeys(("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b",
                     "mellum2"), _STARCODER),
    "jais-2": _type("jais2", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                    r"|\s*[\r\n]+" + "".join(rf"|\s{{{n}}}(?!\S)" for n in (512, 256, 128, 64, 32, 16, 8, 4))
                    + r"|\s{1,2}(?!\S)|\s{1}"),
    **dict.fromkeys(("gemma4", "granite-embed-multi-311m"), _GEMMA4),
    "sarvam-moe": _type("sarvam-moe", NEWLINES, byte_encode=False, escape_whitespace=True),
    "whitespace": _type("whitespace", r"\S+", byte_encode=False),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan",
                     "solar-open"), _QWEN2),
    "qwen35": _type("qwen35", QWEN35),
    "dbrx": _type("dbrx", LLAMA3), "smaug-bpe": _type("smaug", LLAMA3),
    "poro-chat": _PORO, "bloom": _PORO, "gpt3-finnish": _PORO,
    "chatglm-bpe": _CHATGLM4,
    **dict.fromkeys(("glm4", "glm5"), _type("glm4", LLAMA3, ignore_merges=True)),
    "viking": _type("viking", _PORO_SPLIT, r"\p{N}"),
    "tekken": _type("tekken", TEKKEN, ignore_merges=True, add_bos=True),
    "chameleon": _type("chameleon", r"<sentinel:[0-9]+>", r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
                       r"([\t\n]|    |  )", r"\p{N}", r"[\p{P}!-/:-@\[-`{-~]", GPT2, add_bos=True),
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O),
    "granite-embed-multi-97m": _type("granite-emb-multi", GRANITE_EMB_MULTI, ignore_merges=True),
    **dict.fromkeys(("tiny_aya", "cohere2moe"), _type("tiny_aya", DIGITS_BY_THREE, TINY_AYA)),
    "superbpe": _type("superbpe", r"\p{N}+", r"(?=(\d{3})+(?!\d))"),
    **dict.fromkeys(("bailingmoe", "bailingmoe2", "llada-moe"), _type(
        "bailingmoe", r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+")),
    "seed-coder": _type("seed-coder", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
                        r"|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "ufakzeka": _type("ufakzeka", r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "grok-2": _type("grok-2", QWEN2),
    "kimi-k2": _type("kimi-k2", KIMI_K2),
    "afmoe": _type("afmoe", DIGITS_BY_THREE, "[\u4e00-\u9fff\u3400-\u4dbf\u8c48-\ufaff\u3040-\u309f\u30a0-\u30ff\uff65-\uff9f\u2f00-\u2fdf\u0e40-\u0e7f\u0e80-\u0eff\u1780-\u17ff\u1000-\u109f\uaa60-\uaa7f\ua9e0-\ua9ff\uac00-\ud7af\u1100-\u11ff]+",
                   _PUNCT_WORDS + r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+"
                   r"|\s+(?!\S)|\s+"),
    "laguna": _type("laguna", NEWLINES, QWEN2),
    "exaone-moe": _type("exaone-moe", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                        r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+"),
}


def pre_tokenizer_for(label: str | None) -> tuple[PreTokenizer, str | None]:
    """The type llama.cpp uses for ``label``, and a warning to give (None when the label is known).

    llama.cpp falls back to its "default" type for a missing label and refuses an unknown one;
    we fall back to "default" for both and say so for the unknown one.
    """
    if not label:
        return DEFAULT, None
    known = PRE_TOKENIZERS.get(label)
    if known is not None:
        return known, None
    return DEFAULT, (f"unknown tokenizer.ggml.pre {label!r} (llama.cpp refuses it); splitting text with "
                     "llama.cpp's 'default' pre-tokenizer instead")


# Token texts llama.cpp treats as control tokens whatever type the file gives them (end-of-turn,
# end-of-generation and fill-in-the-middle markers it recognizes by spelling): they are matched
# whole in text like any control token.
CONTROL_TEXTS = frozenset((
    "</s>", "<EOT>", "<MID>", "<PAD>", "<PRE>", "<REPO>", "<SUF>", "<end_of_turn>", "<end_of_utterance>", "<eos>",
    "<fim-middle>", "<fim-pad>", "<fim-prefix>", "<fim-repo>", "<fim-suffix>", "<fim_middle>", "<fim_pad>",
    "<fim_prefix>", "<fim_suffix>", "<reponame>", "<turn|>", "<|calls|>", "<|call|>", "<|code_middle|>",
    "<|code_prefix|>", "<|code_suffix|>", "<|end_of_text|>", "<|endoftext|>", "<|end|>", "<|eom_id|>", "<|eot_id|>",
    "<|file_sep|>", "<|fim_middle|>", "<|fim_pad|>", "<|fim_prefix|>", "<|fim_repo|>", "<|fim_suffix|>",
    "<|flush|>", "<|im_end|>", "<|middle|>", "<|prefix|>", "<|repo_name|>", "<|return|>", "<|suffix|>",
    "<|tool_response>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<\uff5cfim\u2581begin\uff5c>",
    "<\uff5cfim\u2581end\uff5c>", "<\uff5cfim\u2581hole\uff5c>", "[EOS]", "[EOT]", "[PAD]", "[e~[", "_<EOT>",
    "\u2581<MID>", "\u2581<PRE>", "\u2581<SUF>"))
# ...except "</s>" next to one of these, where llama.cpp keeps it a normal token
PLAIN_END_MARKERS = ("<|tool_response>", "<|plamo:eos|>")


# Preferred label for each type when a writer has only the split regexes to go by (llama.cpp reads
# every label of a type the same way); the first label of the table names the rest.
PREFERRED_LABELS = ("default", "llama-bpe", "qwen2", "gpt-2", "smollm", "qwen35", "gpt-4o", "tekken", "deepseek-v3")


def label_for_regexes(regexes: list[str]) -> str | None:
    """A ``tokenizer.ggml.pre`` label whose type splits with exactly these regexes (in order), or None.
    ``(?i:...)`` contractions (tokenizer.json's spelling) match llama.cpp's expanded ones."""
    wanted = tuple(r.replace("(?i:'s|'t|'re|'ve|'m|'ll|'d)", _CONTRACTIONS) for r in regexes)
    matches = [label for label, pre in PRE_TOKENIZERS.items() if pre.regexes == wanted and pre.byte_encode]
    preferred = [label for label in PREFERRED_LABELS if label in matches]
    return (preferred or matches or [None])[0]
