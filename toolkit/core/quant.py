"""The quantization-scheme contract: layers ask a scheme for their parameters and call ``apply``.

No layer looks at which scheme it has. A scheme decides per layer (``scheme_for``), so a
scheme may leave, say, the embedding in full precision by returning another scheme.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

DEFAULT_SCHEME = "unquantized"


@runtime_checkable
class QuantScheme(Protocol):
    """One quantization scheme bound to a params dtype (the activations' dtype)."""

    name: str
    params_dtype: torch.dtype
    # Optional: a sentence saying why ``apply`` cannot run inside a CUDA graph (it waits on the
    # host, say); the engine then decodes eagerly with that note instead of failing to capture.
    # cuda_graph_blocker: str | None

    def scheme_for(self, *, layer_kind: str, prefix: str) -> "QuantScheme":
        """The scheme that should serve this layer (``layer_kind``: linear, embedding, lm_head)."""

    def create_weights(self, layer: nn.Module, *, input_size_per_partition: int,
                       output_partition_sizes: list[int], input_size: int, output_size: int) -> None:
        """Register the layer's weight parameter(s) (ModelParameter subclasses) on ``layer``.

        Weights of the merged/qkv layers are laid out [sum(output_partition_sizes), input]; an
        embedding is created with ``input_size_per_partition`` = embedding dim and one output
        partition = vocab rows on this rank.
        """

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ W.T (+ bias)`` for the layer's weights, through the kernel runtime."""

    def embed(self, layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        """Rows of the layer's [rows, dim] weight for local row indices ``ids``."""

    def process_after_loading(self, layer: nn.Module) -> None:
        """Repack or quantize once every shard of the layer has arrived. Not called for a layer
        whose parameters were all restored with ``load_stored`` (they were saved processed).

        Saving a model's in-memory state (per-rank writers) also uses an optional
        ``stored_metadata() -> JSON-serialisable`` on the scheme: what its factory's
        ``from_checkpoint`` needs to create parameters in the layout ``stored_state()`` holds.
        """


@runtime_checkable
class QuantSchemeFactory(Protocol):
    """What ``register_quant_schemes`` registers."""

    names: tuple[str, ...]

    def from_checkpoint(self, quant_metadata: Any, *, params_dtype: torch.dtype) -> QuantScheme:
        """The scheme a pre-quantized checkpoint requires (metadata as its loader supplies it)."""

    def from_spec(self, spec: str, *, params_dtype: torch.dtype) -> QuantScheme:
        """On-the-fly quantization from a ``--quant`` string (``name`` or ``name:key=value,...``)."""
