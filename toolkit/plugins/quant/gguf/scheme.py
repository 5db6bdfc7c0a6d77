"""The ``gguf`` quant scheme: weights stay packed on the device; matmuls and embedding lookups
dequantize on the fly through the kernel runtime (``gguf_matmul``, ``gguf_embedding``).

Every linear layer, the embedding and an untied LM head get a GGUFParameter; a tied LM head
projects through the quantized embedding (``apply`` on the embedding layer). Norms and biases
are the layers' own plain parameters.
"""
from __future__ import annotations

import torch
from torch import nn

from toolkit.core.errors import ToolkitError
from toolkit.kernels import runtime
from toolkit.kernels.int8_blocks import Int8Input, merge
from toolkit.kernels.sibling_launches import siblings
from toolkit.kernels.split_sums import Columns, SplitSums

from .params import GGUFParameter, Segment


class GGUFScheme:
    name = "gguf"

    def __init__(self, params_dtype: torch.dtype):
        self.params_dtype = params_dtype

    def scheme_for(self, *, layer_kind: str, prefix: str) -> "GGUFScheme":
        return self

    def create_weights(self, layer: nn.Module, *, input_size_per_partition: int, output_partition_sizes: list[int],
                       input_size: int, output_size: int) -> None:
        layer.weight = GGUFParameter.empty(sum(output_partition_sizes), input_size_per_partition,
                                           shard_ids=layer.shard_ids)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ W.T (+ bias)``: one ``gguf_matmul`` per segment (run of rows sharing a quant type)."""
        weight: GGUFParameter = layer.weight
        rows, cols = weight.logical_shape
        dtype = self.params_dtype
        # reshape/.to only when they change something: each is a dispatched torch call (~2 us on
        # CPU) even when it returns its input, and a decode step makes ~80 of these matmuls
        flat = x if x.dim() == 2 and x.shape[1] == cols else x.reshape(-1, cols)
        if flat.dtype != dtype:
            flat = flat.to(dtype)
        segments = weight.packed_segments()
        if len(segments) == 1 and segments[0][0].row_start == 0 and segments[0][0].rows == rows:
            out = runtime.call("gguf_matmul", flat, segments[0][1], segments[0][0].qtype, cols)
        else:
            outs = _segment_matmuls("gguf_matmul", flat, segments, cols)
            out = _columns([(segment, part) for (segment, _), part in zip(segments, outs)], rows, flat)
        if out.dtype != dtype:
            out = out.to(dtype)
        if bias is not None:
            out = out + bias
        return out if x.dim() == 2 else out.reshape(*x.shape[:-1], rows)

    def apply_unreduced(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor | SplitSums | Columns:
        """``apply`` without a bias, for a caller whose next op adds split-K partial sums itself
        (``kernels/split_sums.py``): each segment's kernel may return them (``gguf_matmul_unreduced``); a weight of
        several segments answers with their ``Columns``."""
        weight: GGUFParameter = layer.weight
        rows, cols = weight.logical_shape
        segments = weight.packed_segments()
        if (x.dim() != 2 or x.shape[1] != cols or x.dtype != self.params_dtype
                or not _tile_rows([segment for segment, _ in segments], rows)):
            return self.apply(layer, x)   # (rows no segment covers are zeros there)
        pieces = _segment_matmuls("gguf_matmul_unreduced", x, segments, cols)
        return pieces[0] if len(pieces) == 1 else Columns(tuple(pieces))

    def int8_input(self, layer: nn.Module, tokens: int) -> Int8Input | None:
        """The int8 blocks ``apply``'s matmuls read for ``tokens`` rows (every segment's need merged), or None."""
        cols = layer.weight.logical_shape[1]
        return merge(*(runtime.call("gguf_int8_input", data, segment.qtype, cols, tokens)
                       for segment, data in layer.weight.packed_segments()))

    def moe_int8_input(self, layer: nn.Module, tokens: int, top_k: int) -> Int8Input | None:
        """The int8 blocks ``apply_moe`` reads of its input for ``tokens`` rows routed to ``top_k`` experts each."""
        gate_up = layer.gate_up_proj.packed_segments()
        if len(gate_up) != 1 or len(layer.down_proj.packed_segments()) != 1:
            return None     # the mixed-type fallback reads float activations
        segment, data = gate_up[0]
        return runtime.call("gguf_moe_int8_input", data, segment.qtype, layer.gate_up_proj.logical_shape[1],
                            tokens * top_k)

    def embed(self, layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of the table; only those rows are dequantized (rows never loaded, such as
        vocab padding, read as zeros)."""
        weight: GGUFParameter = layer.weight
        cols = weight.logical_shape[1]
        flat = ids.reshape(-1)
        out = None
        for segment, data in weight.packed_segments():
            local = flat - segment.row_start
            inside = (local >= 0) & (local < segment.rows)
            rows = runtime.call("gguf_embedding", local.clamp(0, segment.rows - 1), data, segment.qtype, cols,
                                self.params_dtype)
            rows = torch.where(inside.unsqueeze(-1), rows, torch.zeros((), dtype=rows.dtype, device=rows.device))
            out = rows if out is None else out + rows
        if out is None:
            out = torch.zeros(flat.shape[0], cols, dtype=self.params_dtype, device=ids.device)
        return out.reshape(*ids.shape, cols)

    def create_moe_weights(self, layer: nn.Module, *, num_experts: int, hidden_size: int,
                           intermediate_size_per_partition: int) -> None:
        """Stacked experts kept packed: ``gate_up_proj`` as [E * 2I, H] rows, ``down_proj`` as [E * H, I]."""
        shards = layer.expert_shard_ids
        layer.gate_up_proj = GGUFParameter.empty(2 * intermediate_size_per_partition, hidden_size,
                                                 shard_ids=shards["gate_up_proj"], num_experts=num_experts)
        layer.down_proj = GGUFParameter.empty(hidden_size, intermediate_size_per_partition,
                                              shard_ids=shards["down_proj"], num_experts=num_experts)

    def apply_moe(self, layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor) -> torch.Tensor:
        """One ``gguf_fused_moe`` when each stacked weight has one type (as llama.cpp writes them);
        otherwise (gate and up of different types) the experts are dequantized for a dense one."""
        x = x.to(self.params_dtype)
        gate_up, down = layer.gate_up_proj.packed_segments(), layer.down_proj.packed_segments()
        if len(gate_up) == 1 and len(down) == 1:
            (gu_segment, gu_data), (down_segment, down_data) = gate_up[0], down[0]
            return runtime.call("gguf_fused_moe", x, gu_data, gu_segment.qtype, down_data, down_segment.qtype,
                                topk_weights, topk_ids, layer.activation)
        return runtime.call("fused_moe", x, _dense_experts(layer.gate_up_proj, x.dtype),
                            _dense_experts(layer.down_proj, x.dtype), topk_weights, topk_ids, layer.activation)

    def process_after_loading(self, layer: nn.Module) -> None:
        for param in layer.parameters(recurse=False):
            if isinstance(param, GGUFParameter):
                param.cast_float_segments(self.params_dtype)


def _dense_experts(param: GGUFParameter, dtype: torch.dtype) -> torch.Tensor:
    """[E, rows, cols] dequantized (the mixed-type fallback)."""
    rows, cols = param.logical_shape
    out = torch.empty(rows, cols, dtype=dtype, device=param.data.device)
    for segment, data in param.packed_segments():
        out[segment.row_start:segment.row_start + segment.rows] = runtime.call("gguf_dequantize", data, segment.qtype,
                                                                              cols, dtype)
    return out.view(param.num_experts, rows // param.num_experts, cols)


def _tile_rows(segments: list[Segment], rows: int) -> bool:
    """Whether ``segments``, in order, cover rows ``0 .. rows - 1`` with no gap."""
    covered = 0
    for segment in segments:
        if segment.row_start != covered:
            return False
        covered += segment.rows
    return covered == rows


def _segment_matmuls(op: str, x: torch.Tensor, segments: list, cols: int) -> list:
    """Runtime op ``op`` of ``x`` with each ``(segment, data)``, in order. They all read ``x``, so the launches after
    the first are its siblings (``kernels/sibling_launches``): on a GPU they may start before it ends."""
    (first, data), rest = segments[0], segments[1:]
    outs = [runtime.call(op, x, data, first.qtype, cols)]
    with siblings():
        outs += [runtime.call(op, x, data, segment.qtype, cols) for segment, data in rest]
    return outs


def _columns(parts: list[tuple[Segment, torch.Tensor]], rows: int, x: torch.Tensor) -> torch.Tensor:
    """Segment outputs side by side as ``[tokens, rows]``; rows no segment covers are zero."""
    if parts and _tile_rows([segment for segment, _ in parts], rows):
        return parts[0][1] if len(parts) == 1 else torch.cat([out for _, out in parts], dim=-1)
    out = torch.zeros(x.shape[0], rows, dtype=parts[0][1].dtype if parts else x.dtype, device=x.device)
    for segment, values in parts:
        out[:, segment.row_start:segment.row_start + segment.rows] = values
    return out


class GGUFSchemeFactory:
    names = ("gguf",)

    def from_checkpoint(self, quant_metadata, *, params_dtype: torch.dtype) -> GGUFScheme:
        return GGUFScheme(params_dtype)

    def from_spec(self, spec: str, *, params_dtype: torch.dtype) -> GGUFScheme:
        raise ToolkitError(f"--quant {spec}: GGUF weights come packed in .gguf files; quantizing other "
                           "checkpoints to GGUF on the fly is not supported (load a .gguf file instead)")
