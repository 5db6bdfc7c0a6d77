"""The bitsandbytes schemes: 4-bit NF4/FP4 and LLM.int8, on the fly or from a pre-quantized checkpoint.

Names: ``bnb-nf4``, ``bnb-fp4``, ``bnb-int8`` for on-the-fly quantization (``--quant``), and
``bnb`` for checkpoints saved with transformers' ``BitsAndBytesConfig`` (their
``quantization_config`` decides which). Linear layers get self-sharding quantized parameters;
embeddings, the LM head and skipped modules stay in full precision, as in transformers.
"""
from __future__ import annotations

import importlib
import re

import torch
from torch import nn

from toolkit.kernels import runtime
from toolkit.kernels.bnb import SMALL_BATCH_MAX_TOKENS

from . import experts
from .dense import DenseScheme
from .factory import CHECKPOINT_SCHEME, SPEC_NAMES, BnbFactory  # noqa: F401 - BnbFactory: its old home
from .layout import Layout
from .notes import NoteLog
from .options import FourBitOptions, Int8Options



class _BnbScheme:
    """What the 4-bit and 8-bit schemes share: layer choice, notes, the dense fallback."""

    def __init__(self, options, params_dtype: torch.dtype, *, prequantized: bool):
        self.options, self.params_dtype, self.prequantized = options, params_dtype, prequantized
        self.log = NoteLog()
        self.dense = DenseScheme(params_dtype)

    @property
    def notes(self) -> list[str]:
        """Lines for the load report (re-quantized slices and similar); read by the load pipeline."""
        return self.log.lines()

    quantized_kinds = ("linear",)

    def scheme_for(self, *, layer_kind: str, prefix: str):
        if layer_kind not in self.quantized_kinds or _is_skipped(prefix, self.options.skip_modules):
            return self.dense
        return self

    def create_weights(self, layer: nn.Module, *, input_size_per_partition: int, output_partition_sizes: list[int],
                       input_size: int, output_size: int) -> None:
        layout = Layout.of(layer, input_size_per_partition=input_size_per_partition,
                           output_partition_sizes=output_partition_sizes, input_size=input_size,
                           output_size=output_size, dtype=self.params_dtype, prequantized=self.prequantized,
                           log=self.log)
        # through the package's lazy attribute: the parameter modules import bitsandbytes
        parameter_class = getattr(importlib.import_module(__package__), self.parameter_class_name)
        layer.weight = parameter_class.empty(layout, self.options, layer.shard_ids)

    def stored_metadata(self) -> dict:
        """What ``BnbFactory.from_checkpoint`` needs to rebuild this scheme for a stored (sharded) model."""
        return self.hf_quantization_config()

    def embed(self, layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("bitsandbytes leaves embeddings unquantized (scheme_for returns the dense scheme)")

    def process_after_loading(self, layer: nn.Module) -> None:
        return None  # every segment is quantized as it arrives


class Bnb4bitScheme(_BnbScheme):
    options: FourBitOptions
    parameter_class_name = "Bnb4bitParameter"

    @property
    def quantized_kinds(self) -> tuple[str, ...]:
        # experts are quantized on the fly only: transformers' bnb checkpoints keep 3-D experts dense
        return ("linear",) if self.prequantized else ("linear", "moe")

    def create_moe_weights(self, layer: nn.Module, *, num_experts: int, hidden_size: int,
                           intermediate_size_per_partition: int) -> None:
        experts.create_dense_experts(layer, self.params_dtype, num_experts=num_experts, hidden_size=hidden_size,
                                     intermediate_size_per_partition=intermediate_size_per_partition)

    def apply_moe(self, layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor) -> torch.Tensor:
        return experts.apply_experts(layer, x.to(self.params_dtype), topk_weights, topk_ids)

    def process_after_loading(self, layer: nn.Module) -> None:
        if hasattr(layer, "expert_shard_ids"):  # a MoE layer: its dense experts are quantized now
            experts.quantize_experts(layer, self.options)
        elif len(layer.weight.quant_states) > 1:  # a fused projection: statistics back to back
            layer.weight.gather_statistics()

    @property
    def name(self) -> str:
        return CHECKPOINT_SCHEME if self.prequantized else f"bnb-{self.options.quant_type}"

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        x = x.to(self.params_dtype)
        weight = layer.weight
        if len(weight.quant_states) == 1:
            return runtime.call("bnb_4bit_matmul", x, weight.data, weight.quant_states[0], bias)
        # a fused projection (q/k/v, gate/up): one op over all segments, which a kernel can run in one
        # launch once their statistics lie back to back (a model restored from a stored state skipped
        # process_after_loading: gathered here on its first call)
        weight.gather_statistics()
        return runtime.call("bnb_4bit_matmul_segments", x, weight.data, weight.quant_states, bias)

    def hf_quantization_config(self) -> dict:
        """``quantization_config`` for a checkpoint of this model that transformers loads."""
        return {"quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": False,
                "bnb_4bit_quant_type": self.options.quant_type,
                "bnb_4bit_use_double_quant": self.options.double_quant,
                "bnb_4bit_compute_dtype": _dtype_name(self.params_dtype), "bnb_4bit_quant_storage": "uint8",
                "llm_int8_skip_modules": list(self.options.skip_modules) or None}


class Bnb8bitScheme(_BnbScheme):
    options: Int8Options
    parameter_class_name = "Bnb8bitParameter"

    @property
    def name(self) -> str:
        return CHECKPOINT_SCHEME if self.prequantized else "bnb-int8"

    @property
    def cuda_graph_blocker(self) -> str | None:
        """LLM.int8 with a threshold picks the outlier columns of each batch on the host
        (bitsandbytes' ``outliers.any()``), which no CUDA graph can capture. Where a CUDA kernel
        of ``bnb_int8_matmul`` is registered (``toolkit.kernels.bnb``: weight-only int8, no outlier
        search), steps of up to ``cuda_graph_max_tokens`` tokens run that instead and are captured."""
        if self.options.threshold > 0 and not _has_cuda_kernel("bnb_int8_matmul"):
            return (f"bitsandbytes int8 with outlier threshold {self.options.threshold:g} finds outlier columns "
                    "on the host at every matmul (use bnb-int8:threshold=0 for CUDA graphs)")
        return None

    @property
    def cuda_graph_max_tokens(self) -> int | None:
        """With an outlier threshold, only steps the small-batch kernel takes are capturable: decode
        batches of more sequences (and longer prefills) run bitsandbytes' LLM.int8 eagerly."""
        return SMALL_BATCH_MAX_TOKENS if self.options.threshold > 0 else None

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        weight = layer.weight
        return runtime.call("bnb_int8_matmul", x.to(self.params_dtype), weight.data, weight.scb,
                            self.options.threshold, bias)

    def hf_quantization_config(self) -> dict:
        return {"quant_method": "bitsandbytes", "load_in_8bit": True, "load_in_4bit": False,
                "llm_int8_threshold": self.options.threshold, "llm_int8_has_fp16_weight": False,
                "llm_int8_skip_modules": list(self.options.skip_modules) or None}


def make_scheme(options, params_dtype: torch.dtype, *, prequantized: bool):
    """The 4-bit or int8 scheme for ``options``."""
    scheme = Bnb8bitScheme if isinstance(options, Int8Options) else Bnb4bitScheme
    return scheme(options, params_dtype, prequantized=prequantized)


def _is_skipped(prefix: str, patterns: tuple[str, ...]) -> bool:
    """transformers' rule for ``llm_int8_skip_modules``: a module-boundary prefix/regex match, or a suffix."""
    boundary = r"(?:(?<=\.)|(?=\.|$))"
    return any(re.match(rf"(?:{pattern}){boundary}", prefix) or prefix.endswith(pattern) for pattern in patterns)


def _has_cuda_kernel(op_name: str) -> bool:
    """Whether a CUDA implementation of ``op_name`` is registered (beyond the any-device reference)
    and importable: a lazily imported kernel is imported here (the engine asks before it runs it)."""
    def usable(impl) -> bool:
        materialize = getattr(impl.fn, "materialize", None)
        return materialize is None or materialize() is not None

    return any(impl.device == "cuda" and usable(impl) for impl in runtime.candidates(op_name, "cuda"))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
