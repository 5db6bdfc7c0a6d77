"""GGUF metadata -> Hugging Face ``config.json`` vocabulary, as data tables per architecture.

A GGUF file is its own config: ``{arch}.block_count``, ``{arch}.embedding_length``... under
llama.cpp's names. Adding an architecture means adding an ``ArchSpec`` row: its HF model type,
the keys it reads, and the values llama.cpp hard-codes for it (never stored in the file).
An architecture with no row still gets the shared keys, so the registry can say which
architectures are known.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

from toolkit.core import validate as v
from toolkit.core.records import FrozenRecord

from .hybrid_config import HYBRID_KEYS, hybrid_derived
from .metadata import Metadata
from .metadata_checks import check_hparams
from .moe_names import MIXTRAL_KEYS, MOE_KEYS, mixtral_if_experts, qwen2moe_qkv_bias
from .rope import scaling_from_divisors

# "{arch}.<suffix>" -> HF key, shared by every decoder below. Later rows win on the same HF key.
DECODER_KEYS: dict[str, str] = {
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "attention.sliding_window": "sliding_window",
    "rope.freq_base": "rope_theta",
    "vocab_size": "vocab_size",
}
REQUIRED = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count")

# tokenizer.ggml.<key> -> HF special token id key
TOKEN_ID_KEYS = {"bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id",
                 "padding_token_id": "pad_token_id", "unknown_token_id": "unk_token_id"}


class ArchSpec(FrozenRecord):
    """How one GGUF ``general.architecture`` reads as an HF config.

    :param model_type: HF ``model_type``
    :param architectures: HF ``architectures``
    :param keys: extra "{arch}.<suffix>" -> HF key rows, applied before DECODER_KEYS
    :param constants: HF keys llama.cpp fixes for this architecture (the file does not store them)
    :param derived: functions (config so far) -> more keys, for values computed from others
    :param also: other HF architectures llama.cpp writes under this name (Mixtral as ``llama``)
    :param optional: suffixes of REQUIRED this architecture may lack (Qwen3.5-MoE has no dense FFN)

    A hand-written record, not a dataclass: a GGUF load imports this module (toolkit/core/records.py
    says why).
    """

    model_type: str
    architectures: tuple[str, ...]
    keys: Mapping[str, str]
    constants: Mapping[str, Any]
    derived: tuple[Callable[[dict], dict], ...]
    also: tuple[str, ...]
    optional: tuple[str, ...]

    def __init__(self, model_type: str, architectures: tuple[str, ...], keys: Mapping[str, str] | None = None,
                 constants: Mapping[str, Any] | None = None, derived: tuple[Callable[[dict], dict], ...] = (),
                 also: tuple[str, ...] = (), optional: tuple[str, ...] = ()):
        self.__dict__.update(model_type=model_type, architectures=architectures, keys={} if keys is None else keys,
                             constants={} if constants is None else constants, derived=derived, also=also,
                             optional=optional)


def gemma3_layer_types(config: dict) -> dict:
    """llama.cpp's Gemma 3 pattern: five sliding-window layers, then one global layer."""
    period = config["sliding_window_pattern"]
    return {"layer_types": ["full_attention" if (i + 1) % period == 0 else "sliding_attention"
                            for i in range(config["num_hidden_layers"])]}


def gemma3_query_scale(config: dict) -> dict:
    """llama.cpp scales queries by 1/sqrt(head_dim), except the 62-layer 27B (1/sqrt(hidden / heads))."""
    if config["num_hidden_layers"] == 62:
        return {"query_pre_attn_scalar": config["hidden_size"] // config["num_attention_heads"]}
    return {"query_pre_attn_scalar": config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]}


ARCHS: dict[str, ArchSpec] = {
    # llama.cpp writes n_rot as rope.dimension_count; for Llama it is the head size
    "llama": ArchSpec("llama", ("LlamaForCausalLM",), keys={"rope.dimension_count": "head_dim", **MIXTRAL_KEYS},
                      constants={"hidden_act": "silu"}, derived=(mixtral_if_experts,),
                      also=("MixtralForCausalLM",)),
    "qwen2": ArchSpec("qwen2", ("Qwen2ForCausalLM",), constants={"hidden_act": "silu", "attention_bias": True}),
    "qwen3": ArchSpec("qwen3", ("Qwen3ForCausalLM",), constants={"hidden_act": "silu"}),
    "gemma3": ArchSpec("gemma3_text", ("Gemma3ForCausalLM",),
                       constants={"hidden_activation": "gelu_pytorch_tanh", "hidden_act": "gelu_pytorch_tanh",
                                  "rope_local_base_freq": 10000.0, "sliding_window_pattern": 6,
                                  "final_logit_softcapping": None, "attn_logit_softcapping": None},
                       derived=(gemma3_layer_types, gemma3_query_scale)),
    # llama.cpp renormalises the top-k weights for qwen3moe and not for qwen2moe (no key says so)
    "qwen2moe": ArchSpec("qwen2_moe", ("Qwen2MoeForCausalLM",), keys=MOE_KEYS,
                         constants={"hidden_act": "silu", "norm_topk_prob": False}, derived=(qwen2moe_qkv_bias,)),
    "qwen3moe": ArchSpec("qwen3_moe", ("Qwen3MoeForCausalLM",), keys=MOE_KEYS,
                         constants={"hidden_act": "silu", "norm_topk_prob": True}),
    # Gated DeltaNet hybrids: see hybrid_config.py for the ssm.* keys and the layer kinds
    "qwen35": ArchSpec("qwen3_5_text", ("Qwen3_5ForCausalLM",), keys=HYBRID_KEYS, constants={"hidden_act": "silu"},
                       derived=(hybrid_derived,)),
    # llama.cpp renormalises qwen3next's and qwen35moe's top-k weights (build_moe_ffn norm_w)
    "qwen3next": ArchSpec("qwen3_next", ("Qwen3NextForCausalLM",), keys={**HYBRID_KEYS, **MOE_KEYS},
                          constants={"hidden_act": "silu", "norm_topk_prob": True}, derived=(hybrid_derived,)),
    "qwen35moe": ArchSpec("qwen3_5_moe_text", ("Qwen3_5MoeForCausalLM",), keys={**HYBRID_KEYS, **MOE_KEYS},
                          constants={"hidden_act": "silu", "norm_topk_prob": True}, derived=(hybrid_derived,),
                          optional=("feed_forward_length",)),
}


def hf_config(metadata: Metadata, tensor_names: list[str], tensor_types: Mapping[str, str],
              read_tensor: Callable[[str], Any] | None = None) -> dict:
    """The HF config dict a GGUF file describes (MissingMetadataError for a required key).

    :param read_tensor: name -> values, for the few small tensors that carry config (``rope_freqs``)
    """
    arch = v.text(metadata.require("general.architecture"), key="general.architecture", file=metadata.file)
    check_hparams(metadata, arch)
    spec = ARCHS.get(arch)
    config: dict[str, Any] = {"model_type": spec.model_type if spec else arch,
                              "architectures": list(spec.architectures) if spec else []}
    if spec is not None:  # an unknown architecture fails later, listing the known ones
        for suffix in (s for s in REQUIRED if s not in spec.optional):
            metadata.require(f"{arch}.{suffix}")
    for suffix, hf_key in {**(spec.keys if spec else {}), **DECODER_KEYS}.items():
        if f"{arch}.{suffix}" in metadata:
            config[hf_key] = metadata[f"{arch}.{suffix}"]
    config.update(_file_facts(metadata, arch, tensor_names, tensor_types))
    if "rope_freqs.weight" in tensor_names and read_tensor is not None and "rope_scaling" not in config:
        config.update(_rope_from_tensor(config, read_tensor("rope_freqs.weight"), metadata.file))
    if spec is not None:
        config.update(spec.constants)
        for derive in spec.derived:
            config.update(derive(config))
    return config


def _file_facts(metadata: Metadata, arch: str, tensor_names: list[str], tensor_types: Mapping[str, str]) -> dict:
    """Keys read from the tensors and the tokenizer rather than from ``{arch}.*``."""
    names = set(tensor_names)
    facts: dict[str, Any] = {
        # llama.cpp writes output.weight only when the head is not the embedding
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": "blk.0.attn_q.bias" in names,
    }
    vocab = metadata.get(f"{arch}.vocab_size") or metadata.length("tokenizer.ggml.tokens")
    if vocab:
        facts["vocab_size"] = vocab
    for gguf_key, hf_key in TOKEN_ID_KEYS.items():
        if f"tokenizer.ggml.{gguf_key}" in metadata:
            facts[hf_key] = metadata[f"tokenizer.ggml.{gguf_key}"]
    eot = metadata.get("tokenizer.ggml.eot_token_id")
    if eot is not None and eot != facts.get("eos_token_id"):  # llama.cpp stops at either
        facts["eos_token_id"] = [i for i in (facts.get("eos_token_id"), eot) if i is not None]
    scaling = _rope_scaling(metadata, arch)
    if scaling:
        facts["rope_scaling"] = scaling
    dtype = _half_dtype(tensor_types)
    if dtype:
        facts["torch_dtype"] = dtype
    return facts


def _rope_scaling(metadata: Metadata, arch: str) -> dict | None:
    kind = metadata.get(f"{arch}.rope.scaling.type")
    if kind in (None, "none"):
        return None
    scaling: dict[str, Any] = {"rope_type": kind}
    if f"{arch}.rope.scaling.factor" in metadata:
        scaling["factor"] = metadata[f"{arch}.rope.scaling.factor"]
    if f"{arch}.rope.scaling.original_context_length" in metadata:
        scaling["original_max_position_embeddings"] = metadata[f"{arch}.rope.scaling.original_context_length"]
    return scaling


def _rope_from_tensor(config: dict, divisors, file: str) -> dict:
    """llama.cpp stores Llama 3 rotary scaling as per-frequency divisors; recover the HF dict."""
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    dim = config.get("head_dim") or (hidden // heads if heads and hidden else None)
    if dim is None:
        return {}
    scaling = scaling_from_divisors(divisors, rotary_dim=dim, base=float(config.get("rope_theta", 10000.0)), file=file)
    return {"rope_scaling": scaling} if scaling else {}


def _half_dtype(tensor_types: Mapping[str, str]) -> str | None:
    """A file of F16 (or BF16) weights runs in that dtype on accelerators."""
    kinds = set(tensor_types.values())
    return "bfloat16" if "BF16" in kinds else "float16" if "F16" in kinds else None
