"""A layer's fixed-size per-sequence state (recurrent / linear-attention layers).

``Attention`` declares a KV cache that grows with the sequence; ``RecurrentState`` declares
state of constant size per sequence (a conv window, a recurrent matrix...). A model layer owns
one and reads ``tensors`` during its forward. Whoever runs the model (the engine, or a
one-sequence generate) binds ``tensors[name]`` of shape [num_slots, *shape] and puts the
batch's slot per sequence in ``AttentionMetadata.state_slots``; with nothing bound every
sequence starts from a zero state and nothing is kept (what ``logits()`` needs).
"""
from __future__ import annotations

import math

import torch
from torch import nn

StateShapes = dict[str, tuple[tuple[int, ...], torch.dtype]]


class RecurrentState(nn.Module):
    """Declares named states ``{name: (shape, dtype)}``; ``dtype=None`` means the activation dtype."""

    def __init__(self, shapes: dict[str, tuple[tuple[int, ...], torch.dtype | None]]):
        super().__init__()
        self.shapes = dict(shapes)
        self.tensors: dict[str, torch.Tensor] | None = None

    def resolved_shapes(self, activation_dtype: torch.dtype) -> StateShapes:
        return {name: (shape, dtype or activation_dtype) for name, (shape, dtype) in self.shapes.items()}

    def bytes_per_slot(self, activation_dtype: torch.dtype) -> int:
        return sum(math.prod(shape) * torch.empty((), dtype=dtype).element_size()
                   for shape, dtype in self.resolved_shapes(activation_dtype).values())

    def get(self, name: str) -> torch.Tensor | None:
        return None if self.tensors is None else self.tensors[name]


def recurrent_states(model: nn.Module) -> list[RecurrentState]:
    return [module for module in model.modules() if isinstance(module, RecurrentState)]


def allocate_states(states: list[RecurrentState], num_slots: int, dtype: torch.dtype,
                    device: torch.device | str) -> list[dict[str, torch.Tensor]]:
    """Zeroed [num_slots, *shape] tensors for every declared state."""
    return [{name: torch.zeros((num_slots, *shape), dtype=state_dtype, device=device)
             for name, (shape, state_dtype) in state.resolved_shapes(dtype).items()} for state in states]


def bind_states(states: list[RecurrentState], tensors: list[dict[str, torch.Tensor]] | None) -> None:
    for state, bound in zip(states, tensors or [None] * len(states)):
        state.tensors = bound
