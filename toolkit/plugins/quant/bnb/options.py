"""What a bitsandbytes scheme is configured with, from a ``--quant`` spec or an HF ``quantization_config``.

Spec strings: ``bnb-nf4``, ``bnb-fp4`` (options ``block_size``, ``double_quant``, ``skip``) and
``bnb-int8`` (options ``threshold``, ``skip``); ``skip`` lists module names separated by ``+``
(``skip=mlp.down_proj+o_proj``) that stay unquantized. ``bnb`` alone means ``bnb-nf4``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from toolkit.core import validate as v
from toolkit.core.errors import InvalidConfigError, UnsupportedQuantTypeError

BLOCK_SIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)  # what bitsandbytes.quantize_4bit accepts
QUANT_TYPES = ("nf4", "fp4")


@dataclass(frozen=True)
class FourBitOptions:
    """4-bit NF4/FP4: ``block_size`` elements share one absmax; ``double_quant`` 8-bit-quantizes the absmax."""

    quant_type: str = "nf4"
    block_size: int = 64
    double_quant: bool = False
    skip_modules: tuple[str, ...] = ()


@dataclass(frozen=True)
class Int8Options:
    """LLM.int8: int8 rows with one fp32 scale each; activations above ``threshold`` run in 16-bit."""

    threshold: float = 6.0
    skip_modules: tuple[str, ...] = ()


def parse_spec(spec: str) -> FourBitOptions | Int8Options:
    """``bnb-nf4:block_size=128,double_quant=true`` -> FourBitOptions(...)."""
    name, _, rest = spec.partition(":")
    values = _key_values(spec, rest)
    skip = tuple(filter(None, values.pop("skip", "").split("+")))
    kind = name.removeprefix("bnb").lstrip("-") or "nf4"
    if kind == "int8":
        options = Int8Options(threshold=_number(spec, values.pop("threshold", "6.0")), skip_modules=skip)
    elif kind in QUANT_TYPES:
        block_size = int(_number(spec, values.pop("block_size", values.pop("blocksize", "64"))))
        if block_size not in BLOCK_SIZES:
            raise UnsupportedQuantTypeError(f"--quant {spec}: block_size must be one of {BLOCK_SIZES}")
        options = FourBitOptions(kind, block_size, _flag(spec, values.pop("double_quant", "false")), skip)
    else:
        raise UnsupportedQuantTypeError(f"--quant {spec}: unknown bitsandbytes type {kind!r} "
                                        "(bnb-nf4, bnb-fp4 or bnb-int8)")
    if values:
        raise UnsupportedQuantTypeError(f"--quant {spec}: unknown option(s) {', '.join(sorted(values))}")
    return options


def from_quantization_config(config: dict | None, *, source: str = "config.json") -> FourBitOptions | Int8Options:
    """Options of a checkpoint transformers saved with ``BitsAndBytesConfig`` (``quantization_config``).

    The 4-bit block size is per tensor (in each ``quant_state``), so the returned one is only the
    default used to quantize a tensor the checkpoint left in full precision.
    """
    config = v.mapping(config or {}, key="quantization_config", file=source)
    if config.get("quant_method") != "bitsandbytes":
        raise UnsupportedQuantTypeError(f"quantization_config.quant_method is {config.get('quant_method')!r}, "
                                        "not 'bitsandbytes'", file=source)
    skip = _skip_patterns(config.get("llm_int8_skip_modules") or (), source)
    for key in ("load_in_8bit", "load_in_4bit", "bnb_4bit_use_double_quant"):
        if config.get(key) is not None:
            v.flag(config[key], key=f"quantization_config.{key}", file=source)
    if config.get("load_in_8bit"):
        return Int8Options(v.real(config.get("llm_int8_threshold", 6.0), key="quantization_config.llm_int8_threshold",
                                  file=source, inclusive=True), skip)
    if config.get("load_in_4bit"):
        quant_type = config.get("bnb_4bit_quant_type", "fp4")
        if quant_type not in QUANT_TYPES:
            raise UnsupportedQuantTypeError(f"bnb_4bit_quant_type {quant_type!r} is not one of {QUANT_TYPES}",
                                            file=source)
        return FourBitOptions(quant_type, 64, bool(config.get("bnb_4bit_use_double_quant")), skip)
    raise UnsupportedQuantTypeError("quantization_config sets neither load_in_4bit nor load_in_8bit", file=source)


def _skip_patterns(value, source: str) -> tuple[str, ...]:
    """``llm_int8_skip_modules``: module names or regexes (transformers' rule), each compiled here so
    a malformed one is a typed error naming the file, not a ``re.error`` while building layers."""
    patterns = v.texts(value, key="quantization_config.llm_int8_skip_modules", file=source, max_items=4096)
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise InvalidConfigError(f"{pattern!r} is not a valid module pattern: {exc}", file=source,
                                     key="quantization_config.llm_int8_skip_modules") from exc
    return patterns


def _key_values(spec: str, rest: str) -> dict[str, str]:
    values = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise UnsupportedQuantTypeError(f"--quant {spec}: expected key=value, got {item!r}")
        values[key.strip()] = value.strip()
    return values


def _number(spec: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise UnsupportedQuantTypeError(f"--quant {spec}: {text!r} is not a number") from None


def _flag(spec: str, text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise UnsupportedQuantTypeError(f"--quant {spec}: {text!r} is not true/false")
