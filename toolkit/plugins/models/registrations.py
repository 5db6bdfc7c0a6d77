"""The built-in architecture plugins' registrations, deferred (core/deferred.py).

Each ``_plugin`` class below is one plugin of the ``toolkit`` entry-point group (``pyproject.toml``:
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


def _plugin(module: str, archs: tuple[tuple[str, ...], ...], names: tuple[tuple[str, str], ...] = ()) -> type:
    """One plugin over ``toolkit.plugins.models.<module>``: its architectures ``(ATTRIBUTE, name, *aliases)``
    and its safetensors name maps ``(ATTRIBUTE, architecture)``, each registered as a ``Deferred``."""
    target = f"{MODELS}.{module}"

    class Plugin:
        @staticmethod
        @hookimpl
        def register_architectures(register):
            for attribute, name, *aliases in archs:
                register(Deferred(f"{target}:{attribute}", name=name, aliases=tuple(aliases)))

        @staticmethod
        @hookimpl
        def register_name_maps(register):
            for attribute, architecture in names:
                register(Deferred(f"{target}:{attribute}", format="safetensors", architecture=architecture))

    return Plugin


# Llama and Mistral (the generic HF name map serves their checkpoints)
Llama = _plugin("llama", (("LLAMA", "llama", "LlamaForCausalLM", "MistralForCausalLM", "mistral"),))
# Qwen2 and Qwen3 dense
Qwen = _plugin("qwen", (("QWEN2", "qwen2", "Qwen2ForCausalLM"), ("QWEN3", "qwen3", "Qwen3ForCausalLM")))
QwenMoE = _plugin("qwen_moe", (("QWEN2_MOE", "qwen2_moe", "Qwen2MoeForCausalLM"),
                               ("QWEN3_MOE", "qwen3_moe", "Qwen3MoeForCausalLM")),
                  (("QWEN2_MOE_NAMES", "qwen2_moe"), ("QWEN3_MOE_NAMES", "qwen3_moe")))
Mixtral = _plugin("mixtral", (("MIXTRAL", "mixtral", "MixtralForCausalLM"),), (("MIXTRAL_NAMES", "mixtral"),))
Gemma3 = _plugin("gemma3", (("GEMMA3", "gemma3", "Gemma3ForCausalLM", "gemma3_text",
                             "Gemma3ForConditionalGeneration"),), (("GEMMA3_NAMES", "gemma3"),))
# Qwen3.5, Qwen3-Next and Qwen3.5-MoE: Gated DeltaNet layers between attention layers
Qwen3Hybrid = _plugin("qwen3_hybrid",
                      (("QWEN3_5", "qwen3_5", "Qwen3_5ForCausalLM", "qwen3_5_text", "Qwen3_5ForConditionalGeneration",
                        "qwen3_5"),
                       ("QWEN3_NEXT", "qwen3_next", "Qwen3NextForCausalLM"),
                       ("QWEN3_5_MOE", "qwen3_5_moe", "Qwen3_5MoeForCausalLM", "qwen3_5_moe_text",
                        "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe")),
                      (("QWEN3_5_NAMES", "qwen3_5"), ("QWEN3_NEXT_NAMES", "qwen3_next"),
                       ("QWEN3_5_MOE_NAMES", "qwen3_5_moe")))
