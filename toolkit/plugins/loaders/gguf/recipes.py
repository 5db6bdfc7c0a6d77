"""Which GGUF type each tensor of a conversion gets: plain types, mixed recipes, overrides, fallbacks.

* A plain target (``F16``, ``Q8_0``, ``Q4_K``...) stores every 2-D weight in that type ("pure",
  like ``llama-quantize --pure``): what you ask for is what every weight gets.
* A mixed recipe follows llama.cpp's ``llama_tensor_get_type`` for its file type: ``Q4_K_M``
  keeps the output head at Q6_K and ``attn_v``/``ffn_down`` at Q6_K on the layers llama.cpp's
  ``use_more_bits`` picks (the first and last eighth, and every third layer between). Checked
  against llama.cpp's own Gemma 3 270M Q4_K_M file (tests/test_gguf_convert_recipes.py).
* Overrides (glob on the Hugging Face or the GGUF name -> type) come first; first match wins.
* 1-D tensors (norms, biases) are always F32, as llama.cpp keeps them.
* A row length that is not a multiple of the type's block falls back as llama.cpp does
  (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, then F16); every fallback is reported.
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Callable

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

from toolkit.core.errors import ConversionError

Q, F = GGMLQuantizationType, LlamaFileType
# Types a conversion can store (the quantized ones are what toolkit.kernels.gguf_quant encodes).
WRITABLE = (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K)
DENSE = (Q.F32, Q.F16, Q.BF16)
PLAIN_FILE_TYPES = {Q.F32: F.ALL_F32, Q.F16: F.MOSTLY_F16, Q.BF16: F.MOSTLY_BF16, Q.Q8_0: F.MOSTLY_Q8_0,
                    Q.Q4_0: F.MOSTLY_Q4_0, Q.Q4_1: F.MOSTLY_Q4_1, Q.Q5_0: F.MOSTLY_Q5_0, Q.Q5_1: F.MOSTLY_Q5_1,
                    Q.Q4_K: F.MOSTLY_Q4_K_S, Q.Q5_K: F.MOSTLY_Q5_K_S, Q.Q6_K: F.MOSTLY_Q6_K}
# llama.cpp's substitutes for a K-quant whose rows are not whole 256-element super-blocks.
FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0, Q.Q8_0: Q.F16, Q.Q4_0: Q.F16, Q.Q4_1: Q.F16,
            Q.Q5_0: Q.F16, Q.Q5_1: Q.F16}
_LAYER_LEAF = re.compile(r"^blk\.(?P<layer>\d+)\.(?P<leaf>[A-Za-z0-9_]+)\.weight$")


def use_more_bits(layer: int, num_layers: int) -> bool:
    """llama.cpp's choice of layers that keep more bits: first and last eighth, every third between."""
    eighth = num_layers // 8
    return layer < eighth or layer >= 7 * num_layers // 8 or (layer - eighth) % 3 == 2


def first_eighth(layer: int, num_layers: int) -> bool:
    return layer < num_layers // 8


def first_four(layer: int, num_layers: int) -> bool:
    return layer < 4


@dataclass(frozen=True)
class Bump:
    """Store GGUF ``leaf`` as ``qtype`` on the layers ``layers(layer, num_layers)`` selects."""

    leaf: str
    qtype: GGMLQuantizationType
    layers: Callable[[int, int], bool]


@dataclass(frozen=True)
class Recipe:
    """A file type: the base type of 2-D weights, the output head's type, and per-layer bumps."""

    base: GGMLQuantizationType
    file_type: LlamaFileType
    output: GGMLQuantizationType | None = None
    bumps: tuple[Bump, ...] = ()


# llama.cpp treats stacked experts' ffn_down_exps as ffn_down
MORE_BITS_Q6 = (Bump("attn_v", Q.Q6_K, use_more_bits), Bump("ffn_down", Q.Q6_K, use_more_bits),
                Bump("ffn_down_exps", Q.Q6_K, use_more_bits))
# Always F32, as llama.cpp's converter and quantizer keep them: MoE routers, and the recurrent
# layers' small conv1d weights (llama.cpp's CUDA ssm_conv asserts an F32 kernel: an F16 one aborts it)
F32_LEAVES = frozenset({"ffn_gate_inp", "ffn_gate_inp_shexp", "ssm_conv1d"})
RECIPES: dict[str, Recipe] = {
    **{qtype.name: Recipe(qtype, file_type) for qtype, file_type in PLAIN_FILE_TYPES.items()},
    "Q4_K_M": Recipe(Q.Q4_K, F.MOSTLY_Q4_K_M, Q.Q6_K, MORE_BITS_Q6),
    "Q4_K_S": Recipe(Q.Q4_K, F.MOSTLY_Q4_K_S, Q.Q6_K,
                     (Bump("attn_v", Q.Q5_K, first_four), Bump("ffn_down", Q.Q5_K, first_eighth))),
    "Q5_K_M": Recipe(Q.Q5_K, F.MOSTLY_Q5_K_M, Q.Q6_K, MORE_BITS_Q6),
    "Q5_K_S": Recipe(Q.Q5_K, F.MOSTLY_Q5_K_S, Q.Q6_K),
}


def writable_type(name: str, *, what: str) -> GGMLQuantizationType:
    """A type name a conversion can store (case-insensitive); ConversionError naming the choices."""
    qtype = getattr(Q, name.strip().upper(), None)
    if qtype not in WRITABLE:
        raise ConversionError(f"{what}: GGUF type {name!r} cannot be written; choose one of "
                              f"{', '.join(t.name for t in WRITABLE)}")
    return qtype


def recipe_for(target: str) -> Recipe:
    recipe = RECIPES.get(target.strip().upper())
    if recipe is None:
        raise ConversionError(f"--to gguf:{target}: unknown GGUF type; choose one of {', '.join(RECIPES)}")
    return recipe


@dataclass(frozen=True)
class Choice:
    """The type a tensor is stored as; ``fallback_from`` is the type that did not fit its rows."""

    qtype: GGMLQuantizationType
    fallback_from: GGMLQuantizationType | None = None


class TypePlan:
    """Picks each tensor's type from a recipe, overrides and the tensor's shape.

    :param target: a plain type or recipe name (see RECIPES)
    :param overrides: (glob, type name) pairs matched on the HF name or the GGUF name
    :param num_layers: decoder layers (the recipes' layer rules are fractions of it)
    :param tied: the embedding doubles as the output head (then it gets the head's type)
    """

    def __init__(self, target: str, overrides: tuple[tuple[str, str], ...], *, num_layers: int, tied: bool):
        self.recipe = recipe_for(target)
        self.overrides = [(glob, writable_type(kind, what=f"override {glob}={kind}")) for glob, kind in overrides]
        self.num_layers, self.tied = num_layers, tied

    def choose(self, hf_name: str, gguf_name: str, shape: tuple[int, ...]) -> Choice:
        match = _LAYER_LEAF.match(gguf_name)
        # 2-D norm weights too: "_norm.weight" is F32 in llama.cpp's converter whatever the shape
        if len(shape) <= 1 or gguf_name.endswith("_norm.weight") or (match and match["leaf"] in F32_LEAVES):
            return Choice(Q.F32)
        wanted = self._override(hf_name, gguf_name) or self._recipe_type(gguf_name)
        return fitting(wanted, shape[-1])

    def _override(self, hf_name: str, gguf_name: str) -> GGMLQuantizationType | None:
        for glob, qtype in self.overrides:
            if fnmatch.fnmatchcase(hf_name, glob) or fnmatch.fnmatchcase(gguf_name, glob):
                return qtype
        return None

    def _recipe_type(self, gguf_name: str) -> GGMLQuantizationType:
        recipe = self.recipe
        is_head = gguf_name == "output.weight" or (self.tied and gguf_name == "token_embd.weight")
        if is_head and recipe.output is not None:
            return recipe.output
        match = _LAYER_LEAF.match(gguf_name)
        for bump in recipe.bumps if match else ():
            if bump.leaf == match["leaf"] and bump.layers(int(match["layer"]), self.num_layers):
                return bump.qtype
        return recipe.base


def fitting(qtype: GGMLQuantizationType, row_length: int) -> Choice:
    """``qtype`` if whole blocks fit a row of ``row_length``, else the first fallback that fits."""
    wanted = qtype
    while row_length % GGML_QUANT_SIZES[qtype][0]:
        qtype = FALLBACK[qtype]
    return Choice(qtype, None if qtype == wanted else wanted)
