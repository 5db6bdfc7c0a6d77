"""A config checked against the tensors its checkpoint holds, before the model is built.

* Weight budget: a config that implies far more weights than the checkpoint's files can hold
  is refused before anything is allocated (a ``num_hidden_layers`` of a million would otherwise
  build layers until the machine runs out of memory).
* Layer count: the layer indices of the tensors the name map places must be exactly
  ``0 .. num_layers - 1``.
* Shapes (when the checkpoint can tell logical shapes without reading data, ``tensor_shapes()``):
  the embedding implies vocab and hidden size, the k/v projections the KV heads, the q projection
  a multiple of the heads (ShapeMismatchError naming the tensor and the config key).

Names are the canonical Hugging Face ones the name map produces; nothing here knows a format.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .config import ModelConfig
from .config_checks import implied_parameters
from .errors import InvalidConfigError, ShapeMismatchError
from .names import NameContext

# The fewest bits per weight any supported storage uses is ~1.56 (1-bit-ish quants); half of that
# leaves room for estimates that overshoot (architectures sharing weights).
MIN_BITS_PER_WEIGHT = 0.75
SLACK_BYTES = 1 << 20
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def check_against_checkpoint(config: ModelConfig, checkpoint, name_map, context: NameContext, *, file: str,
                             tp_size: int = 1) -> None:
    """InvalidConfigError (naming ``file`` and the key) where the config contradicts the tensors."""
    check_weight_budget(config, checkpoint, file=file, tp_size=tp_size)
    mapped = _mapped_names(checkpoint, name_map, context)
    check_layer_count(config, mapped, file=file)
    shapes = getattr(checkpoint, "tensor_shapes", None)
    if callable(shapes):
        check_shapes(config, context, mapped, shapes(), file=file)


def stored_bytes(checkpoint) -> int:
    """Bytes of the files this rank reads (what any config must be able to fill)."""
    total = 0
    for path in checkpoint.files:
        try:
            total += Path(path).stat().st_size
        except OSError:
            continue
    return total


def check_weight_budget(config: ModelConfig, checkpoint, *, file: str, tp_size: int = 1) -> None:
    implied = implied_parameters(config)
    needed = implied * MIN_BITS_PER_WEIGHT / 8 / max(tp_size, 1)
    held = stored_bytes(checkpoint)
    if needed > 2 * held + SLACK_BYTES:
        raise InvalidConfigError(
            f"the config implies at least {implied:,} weights (num_hidden_layers={config.num_layers}, "
            f"hidden_size={config.hidden_size}, intermediate_size={config.intermediate_size}, "
            f"vocab_size={config.vocab_size}, heads={config.num_heads}x{config.head_dim}), far more than the "
            f"checkpoint's {held:,} bytes can hold; refused before allocating anything",
            file=file, key="num_hidden_layers")


def _mapped_names(checkpoint, name_map, context: NameContext) -> dict[str, tuple[str, str]]:
    """checkpoint name -> (canonical HF member name, canonical parameter) for tensors the model takes."""
    packed = context.arch.packed_modules
    result: dict[str, tuple[str, str]] = {}
    for name in checkpoint.tensor_names():
        mapped = name_map.map(name, context)
        if mapped is None or mapped.stored_part is not None and mapped.stored_part != "":
            continue
        canonical = mapped.canonical
        member = canonical
        if mapped.shard_id is not None:
            prefix, _, leaf = canonical.rpartition(".")
            module_path, _, module = prefix.rpartition(".")
            members = packed.get(module, ())
            if isinstance(mapped.shard_id, int) and 0 <= mapped.shard_id < len(members):
                member = f"{module_path}.{members[mapped.shard_id]}.{leaf}"
        result[name] = (member, canonical)
    return result


def check_layer_count(config: ModelConfig, mapped: dict[str, tuple[str, str]], *, file: str) -> None:
    layers = {int(m.group(1)) for _, canonical in mapped.values() if (m := _LAYER.search(canonical))}
    if not layers:
        return  # a layout whose parameters are not "layers.N": nothing to count
    beyond = sorted(i for i in layers if i >= config.num_layers)
    if beyond:
        raise InvalidConfigError(f"the config has {config.num_layers} layers but the checkpoint holds tensors "
                                 f"of layer {beyond[0]}", file=file, key="num_hidden_layers")
    missing = sorted(set(range(config.num_layers)) - layers)
    if missing:
        raise InvalidConfigError(f"the config has {config.num_layers} layers but the checkpoint holds no tensors "
                                 f"for {len(missing)} of them (first: layer {missing[0]})", file=file,
                                 key="num_hidden_layers")


def check_shapes(config: ModelConfig, context: NameContext, mapped: dict[str, tuple[str, str]],
                 shapes: dict[str, Any], *, file: str) -> None:
    hd, hidden = config.head_dim, config.hidden_size
    for name, (member, _) in mapped.items():
        shape = tuple(int(d) for d in shapes.get(name, ()))
        if member == "model.embed_tokens.weight":
            _expect(shape, (config.vocab_size, hidden), name, file, "vocab_size/hidden_size")
        elif member.endswith((".self_attn.k_proj.weight", ".self_attn.v_proj.weight")):
            _expect(shape, (config.num_kv_heads * hd, hidden), name, file, "num_key_value_heads/head_dim/hidden_size")
        elif member.endswith(".self_attn.q_proj.weight"):
            if len(shape) != 2 or shape[1] != hidden or shape[0] % (config.num_heads * hd):
                raise ShapeMismatchError(
                    f"q projection of shape {shape} does not fit num_attention_heads={config.num_heads} x "
                    f"head_dim={hd} over hidden_size={hidden}", file=file, tensor=name, key="num_attention_heads")


def _expect(shape: tuple[int, ...], expected: tuple[int, int], name: str, file: str, keys: str) -> None:
    if shape != expected:
        raise ShapeMismatchError(f"tensor shape {shape} contradicts the config, which implies {expected} ({keys})",
                                 file=file, tensor=name, key=keys.split("/")[0])
