"""Architecture-neutral configuration objects.

Checkpoints describe their model in Hugging Face ``config.json`` vocabulary (a loader of
another format translates its own metadata into it); an architecture turns that dict into
a ModelConfig (or a subclass with its own fields).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .errors import MissingMetadataError, OptionError


@dataclass
class ModelConfig:
    """What every decoder-only architecture needs; subclasses add their own fields."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    hidden_act: str = "silu"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


def require(hf_config: dict, key: str, *, source: str = "config") -> Any:
    """``hf_config[key]`` or a MissingMetadataError naming the key and where it was looked for."""
    if key not in hf_config or hf_config[key] is None:
        raise MissingMetadataError(f"required config key {key!r} is missing", file=source)
    return hf_config[key]


def eos_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) else (int(value),)


def base_fields(hf_config: dict, architecture: str, *, source: str = "config") -> dict[str, Any]:
    """The ModelConfig fields shared by Llama-like configs, read from HF vocabulary."""
    num_heads = require(hf_config, "num_attention_heads", source=source)
    hidden = require(hf_config, "hidden_size", source=source)
    return dict(
        architecture=architecture,
        vocab_size=require(hf_config, "vocab_size", source=source),
        hidden_size=hidden,
        intermediate_size=require(hf_config, "intermediate_size", source=source),
        num_layers=require(hf_config, "num_hidden_layers", source=source),
        num_heads=num_heads,
        num_kv_heads=hf_config.get("num_key_value_heads") or num_heads,
        head_dim=hf_config.get("head_dim") or hidden // num_heads,
        rms_norm_eps=hf_config.get("rms_norm_eps", 1e-6),
        rope_theta=_rope_theta(hf_config),
        rope_scaling=_rope_scaling(hf_config),
        max_position_embeddings=hf_config.get("max_position_embeddings", 4096),
        tie_word_embeddings=bool(hf_config.get("tie_word_embeddings", False)),
        attention_bias=bool(hf_config.get("attention_bias", False)),
        hidden_act=hf_config.get("hidden_act", "silu"),
        bos_token_id=hf_config.get("bos_token_id"),
        eos_token_ids=eos_ids(hf_config.get("eos_token_id")),
        torch_dtype=hf_config.get("torch_dtype") or hf_config.get("dtype"),
        raw=hf_config,
    )


def _rope_theta(hf_config: dict) -> float:
    params = hf_config.get("rope_parameters") or {}
    return float(hf_config.get("rope_theta") or params.get("rope_theta") or 10000.0)


def _rope_scaling(hf_config: dict) -> dict | None:
    """Newer transformers write ``rope_parameters`` (with rope_type "default" when unscaled)."""
    scaling = hf_config.get("rope_scaling") or hf_config.get("rope_parameters")
    if not scaling:
        return None
    kind = scaling.get("rope_type") or scaling.get("type")
    return None if kind in (None, "default") else dict(scaling, rope_type=kind)


@dataclass(frozen=True)
class LoadConfig:
    """How to load: the caller's choices, resolved to concrete values by load.py."""

    format: str | None = None
    quant: str | None = None
    dtype: torch.dtype | None = None
    device: torch.device = torch.device("cpu")
    tokenizer: str | None = None
    config_override: str | None = None
    # Mixture-of-experts sharding at tp > 1: True gives ranks whole experts, False splits every
    # expert; None keeps what the model's config says (its ``expert_parallel`` key, default False).
    expert_parallel: bool | None = None
    # The rank this load runs on (set by load.load_local from its ParallelContext), so that
    # loaders of per-rank files can open the right rank's files and check the tp size.
    tp_rank: int = 0
    tp_size: int = 1


DTYPES = {"fp32": torch.float32, "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16,
          "half": torch.float16, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


def parse_dtype(value: str | torch.dtype | None) -> torch.dtype | None:
    """``fp32``/``fp16``/``bf16`` (and their long names) as a torch dtype; OptionError otherwise."""
    if value is None or isinstance(value, torch.dtype):
        return value
    if value not in DTYPES:
        raise OptionError(f"unknown dtype {value!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[value]


def parse_device(value: str | torch.device | None) -> torch.device:
    """The device to load onto: ``cpu``, ``cuda`` or ``cuda:N`` (default: cuda if available, else cpu).

    Raises OptionError for a name torch does not know, a device type toolkit does not run on,
    and a CUDA device this torch build or machine does not have.
    """
    if value is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(value)
    except (RuntimeError, TypeError, ValueError):
        raise OptionError(f"unknown device {value!r}; use cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise OptionError(f"device {value!r} is not supported; use cpu, cuda or cuda:N")
    if device.type == "cuda":
        _check_cuda(value, device)
    return device


def _check_cuda(value, device: torch.device) -> None:
    if torch.version.cuda is None:
        raise OptionError(f"device {value!r}: this torch ({torch.__version__}) was built without CUDA; "
                          "use --device cpu or install a CUDA build of torch")
    count = torch.cuda.device_count()
    if count == 0:
        raise OptionError(f"device {value!r}: no CUDA device is visible (check CUDA_VISIBLE_DEVICES and the driver)")
    if device.index is not None and device.index >= count:
        raise OptionError(f"device {value!r}: only {count} CUDA device(s) visible (cuda:0..cuda:{count - 1})")
