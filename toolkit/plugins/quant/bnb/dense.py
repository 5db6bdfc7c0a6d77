"""Layers a bitsandbytes scheme leaves in full precision (embedding, LM head, ``llm_int8_skip_modules``).

They use the unquantized scheme's layout and matmul; their parameter also accepts a
bitsandbytes object (dequantized with bitsandbytes), so a checkpoint that did quantize such
a layer still loads, exactly as its quantized values say.
"""
from __future__ import annotations

import torch
from torch import nn

from toolkit.core.params import ModelParameter
from toolkit.plugins.quant.unquantized import UnquantizedScheme

from .tensors import Bnb4bitTensor, Bnb8bitTensor


class DenseParameter(ModelParameter):
    def stored_state(self) -> dict[str, torch.Tensor]:
        return super().stored_state()  # declared on purpose: the memory is ``data`` alone

    def load_stored(self, loaded, *, part: str = "") -> None:
        super().load_stored(loaded, part=part)

    def _load_placed(self, loaded, placement) -> None:
        super()._load_placed(_dense(loaded, self.dtype), placement)

    def _store_whole(self, loaded) -> None:
        super()._store_whole(_dense(loaded, self.dtype))


class DenseScheme(UnquantizedScheme):
    """UnquantizedScheme whose weights dequantize bitsandbytes objects on arrival."""

    def create_weights(self, layer: nn.Module, *, input_size_per_partition: int, output_partition_sizes: list[int],
                       input_size: int, output_size: int) -> None:
        data = torch.zeros(sum(output_partition_sizes), input_size_per_partition, dtype=self.params_dtype)
        layer.weight = DenseParameter(data, output_dim=0, input_dim=1, shard_ids=layer.shard_ids)


def _dense(loaded, dtype: torch.dtype):
    if isinstance(loaded, (Bnb4bitTensor, Bnb8bitTensor)):
        return loaded.to_dense().to(dtype)
    return loaded
