"""The built-in architecture plugins' registrations, deferred (core/deferred.py).

Each class below is one plugin of the ``toolkit`` entry-point group (``pyproject.toml``:
``gemma3 = "toolkit.plugins.models.registrations:Gemma3"``), so each can still be listed, allowed
or disabled by name. They register ``Deferred`` entries: what an architecture answers to and which
name map reads its checkpoints, without importing the model's module. A load imports the one
architecture it builds; registering all of them imported every model's layers (~9 ms of a first
load on the dev box, twice that on the H100 host). ``resolve`` checks each entry against its object
on first use, and tests/test_deferred.py resolves them all.
"""
from __future__ import annotations

from toolkit.core.deferred import Deferred
from toolkit.core.hookspecs import hookimpl

MODELS = "toolkit.plugins.models"


def _arch(module: str, attribute: str, name: str, *aliases: str) -> Deferred:
    return Deferred(f"{MODELS}.{module}:{attribute}", name=name, aliases=aliases)


def _names(module: str, attribute: str, architecture: str) -> Deferred:
    return Deferred(f"{MODELS}.{module}:{attribute}", format="safetensors", architecture=architecture)


class Llama:
    """Llama and Mistral (the generic HF name map serves their checkpoints)."""

    @staticmethod
    @hookimpl
    def register_architectures(register):
        register(_arch("llama", "LLAMA", "llama", "LlamaForCausalLM", "MistralForCausalLM", "mistral"))


class Qwen:
    """Qwen2 and Qwen3 dense."""

    @staticmethod
    @hookimpl
    def register_architectures(register):
        register(_arch("qwen", "QWEN2", "qwen2", "Qwen2ForCausalLM"))
        register(_arch("qwen", "QWEN3", "qwen3", "Qwen3ForCausalLM"))


class QwenMoE:
    """Qwen2-MoE and Qwen3-MoE."""

    @staticmethod
    @hookimpl
    def register_architectures(register):
        register(_arch("qwen_moe", "QWEN2_MOE", "qwen2_moe", "Qwen2MoeForCausalLM"))
        register(_arch("qwen_moe", "QWEN3_MOE", "qwen3_moe", "Qwen3MoeForCausalLM"))

    @staticmethod
    @hookimpl
    def register_name_maps(register):
        register(_names("qwen_moe", "QWEN2_MOE_NAMES", "qwen2_moe"))
        register(_names("qwen_moe", "QWEN3_MOE_NAMES", "qwen3_moe"))


class Mixtral:
    @staticmethod
    @hookimpl
    def register_architectures(register):
        register(_arch("mixtral", "MIXTRAL", "mixtral", "MixtralForCausalLM"))

    @staticmethod
    @hookimpl
    def register_name_maps(register):
        register(_names("mixtral", "MIXTRAL_NAMES", "mixtral"))


class Gemma3:
    @staticmethod
    @hookimpl
    def register_architectures(register):
        register(_arch("gemma3", "GEMMA3", "gemma3", "Gemma3ForCausalLM", "gemma3_text",
                       "Gemma3ForConditionalGeneration"))

    @staticmethod
    @hookimpl
    def register_name_maps(register):
        register(_names("gemma3", "GEMMA3_NAMES", "gemma3"))


class Qwen3Hybrid:
    """Qwen3.5, Qwen3-Next and Qwen3.5-MoE: Gated DeltaNet layers between attention layers."""

    @staticmethod
    @hookimpl
    def register_architectures(register):
        register(_arch("qwen3_hybrid", "QWEN3_5", "qwen3_5", "Qwen3_5ForCausalLM", "qwen3_5_text",
                       "Qwen3_5ForConditionalGeneration", "qwen3_5"))
        register(_arch("qwen3_hybrid", "QWEN3_NEXT", "qwen3_next", "Qwen3NextForCausalLM"))
        register(_arch("qwen3_hybrid", "QWEN3_5_MOE", "qwen3_5_moe", "Qwen3_5MoeForCausalLM", "qwen3_5_moe_text",
                       "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe"))

    @staticmethod
    @hookimpl
    def register_name_maps(register):
        register(_names("qwen3_hybrid", "QWEN3_5_NAMES", "qwen3_5"))
        register(_names("qwen3_hybrid", "QWEN3_NEXT_NAMES", "qwen3_next"))
        register(_names("qwen3_hybrid", "QWEN3_5_MOE_NAMES", "qwen3_5_moe"))
