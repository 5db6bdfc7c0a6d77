"""Hugging Face config -> GGUF ``{arch}.*`` metadata: the inverse of config.py's tables.

Every row of the reader's ``DECODER_KEYS`` and its ``ArchSpec.keys`` ("{arch}.<suffix>" <- HF key)
is written when the config has that key; the values the reader fills in by itself (an
architecture's ``constants`` and ``derived`` keys) cannot be stored, so ``check_round_trip``
reads the metadata back through the reader's own ``hf_config`` and refuses a model whose
config would come back different (a Gemma 3 with another sliding pattern, a rope scaling
GGUF has no keys for, ...), instead of writing a file that loads as another model.

Llama 3 rotary scaling has no keys either: llama.cpp stores it as ``rope_freqs.weight``, the
per-frequency divisors (rope.py's ``llama3_divisors``, which the reader matches them against).
"""
from __future__ import annotations

import dataclasses
import math
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFValueType, GGUFWriter

from toolkit.core.config import ModelConfig
from toolkit.core.errors import ConversionError

from .config import ARCHS, DECODER_KEYS, hf_config
from .metadata import Metadata
from .reader import open_reader
from .rope import llama3_divisors

FLOAT_SUFFIXES = frozenset({"attention.layer_norm_rms_epsilon", "rope.freq_base", "rope.scaling.factor"})
# llama.cpp reads these too; the reader does not need them (value length is the key length here).
EXTRA_KEYS = {"attention.value_length": "head_dim"}
# GGUF can name these rope scalings (llama.cpp's LLAMA_ROPE_SCALING_TYPE); others fail the round trip.
ROPE_SCALING_KEYS = {"factor": "rope.scaling.factor", "original_max_position_embeddings":
                     "rope.scaling.original_context_length"}
# ModelConfig fields a GGUF file does not carry in {arch}.*: token ids live with the tokenizer;
# tied heads and biases are read from which tensors the file has, written as the source has them.
NOT_COMPARED = frozenset({"raw", "torch_dtype", "bos_token_id", "eos_token_ids", "tie_word_embeddings",
                          "attention_bias"})

Entry = tuple[str, Any, GGUFValueType]


def gguf_architecture(arch, registry) -> str:
    """The ``general.architecture`` the reader maps onto our architecture ``arch``."""
    for name, spec in ARCHS.items():
        for names in ((*spec.architectures, spec.model_type), *((other,) for other in spec.also)):
            try:
                found = registry.architecture(*names)
            except KeyError:
                continue
            if found.name == arch.name:
                return name
    raise ConversionError(f"architecture {arch.name!r} has no GGUF metadata table "
                          f"(plugins/loaders/gguf/config.py knows {', '.join(ARCHS)})")


def flat_config(config: ModelConfig) -> dict[str, Any]:
    """The HF-vocabulary keys the tables read, with the values HF configs may nest or omit resolved
    (an architecture's own config fields, such as ``num_experts``, under their field names)."""
    own = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
           if f.name not in ModelConfig.__dataclass_fields__}
    return {**config.raw, **own, "rope_theta": config.rope_theta, "head_dim": config.head_dim,
            "num_key_value_heads": config.num_kv_heads, "rms_norm_eps": config.rms_norm_eps,
            "vocab_size": config.vocab_size, "max_position_embeddings": config.max_position_embeddings}


def arch_entries(gguf_arch: str, config: ModelConfig) -> list[Entry]:
    """``{arch}.*`` entries for ``config``: each table row whose HF key has a value."""
    flat, spec = flat_config(config), ARCHS[gguf_arch]
    rows = {**spec.keys, **DECODER_KEYS, **EXTRA_KEYS}
    entries = [(f"{gguf_arch}.{suffix}", flat[hf_key]) for suffix, hf_key in rows.items()
               if flat.get(hf_key) is not None]
    scaling = config.rope_scaling or {}
    if scaling and scaling["rope_type"] != "llama3":  # that one is a tensor: see rope_tensors
        entries.append((f"{gguf_arch}.rope.scaling.type", scaling["rope_type"]))
        entries += [(f"{gguf_arch}.{suffix}", scaling[key]) for key, suffix in ROPE_SCALING_KEYS.items()
                    if scaling.get(key) is not None]
    return [(key, *_typed(key, value)) for key, value in entries]


def rope_tensors(config: ModelConfig) -> dict[str, np.ndarray]:
    """Tensors that carry config: llama.cpp's ``rope_freqs.weight`` for Llama 3 rotary scaling."""
    scaling = config.rope_scaling or {}
    if scaling.get("rope_type") != "llama3":
        return {}
    divisors = llama3_divisors(config.head_dim, config.rope_theta, float(scaling["factor"]),
                               float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"]),
                               int(scaling["original_max_position_embeddings"]))
    return {"rope_freqs.weight": divisors.astype(np.float32)}


def _typed(key: str, value: Any) -> tuple[Any, GGUFValueType]:
    if key.split(".", 1)[1] in FLOAT_SUFFIXES:
        return float(value), GGUFValueType.FLOAT32
    if isinstance(value, bool):
        return value, GGUFValueType.BOOL
    if isinstance(value, str):
        return value, GGUFValueType.STRING
    if isinstance(value, int):
        return value, GGUFValueType.UINT32
    return float(value), GGUFValueType.FLOAT32


def add_entries(writer: GGUFWriter, entries: list[Entry]) -> None:
    for key, value, vtype in entries:
        writer.add_key_value(key, value, vtype)


def _same(source: Any, read_back: Any) -> bool:
    """Equal up to GGUF's float32 storage; a rope scaling's ``rope_theta`` is compared as its own field."""
    if isinstance(source, float) and isinstance(read_back, (int, float)):
        return math.isclose(source, read_back, rel_tol=1e-6)
    if isinstance(source, dict) and isinstance(read_back, dict):
        source, read_back = ({k: v for k, v in d.items() if k != "rope_theta"} for d in (source, read_back))
        return source.keys() == read_back.keys() and all(_same(source[k], read_back[k]) for k in source)
    return source == read_back


def check_round_trip(arch, gguf_arch: str, config: ModelConfig, entries: list[Entry],
                     tensors: dict[str, np.ndarray]) -> None:
    """Write ``entries`` to a tensor-less GGUF, read it back with the reader's ``hf_config`` (given
    the config-carrying ``tensors``) and compare ``arch.config_from`` of both; ConversionError
    listing every field GGUF cannot carry."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "probe.gguf"
        writer = GGUFWriter(str(path), gguf_arch)
        add_entries(writer, entries)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        reader = open_reader(path)
        read_back = arch.config_from(hf_config(Metadata(reader.fields, file=str(path)), list(tensors), {},
                                                 read_tensor=tensors.__getitem__))
        del reader  # release the memory map before the folder goes
    differences = [f"{field.name}: {getattr(config, field.name)!r} would load as {getattr(read_back, field.name)!r}"
                   for field in dataclasses.fields(config) if field.name not in NOT_COMPARED
                   and not _same(getattr(config, field.name), getattr(read_back, field.name))]
    if differences:
        raise ConversionError("GGUF metadata cannot describe this model as configured (llama.cpp fixes these "
                              f"for {gguf_arch!r}): " + "; ".join(differences))
