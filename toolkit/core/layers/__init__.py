"""Shared layers. None of them branches on format or quantization scheme."""
from .attention import Attention, AttentionMetadata
from .embedding import ParallelLMHead, VocabParallelEmbedding
from .linear import ColumnParallelLinear, MergedColumnParallelLinear, QKVParallelLinear, ReplicatedLinear, RowParallelLinear
from .norm import RMSNorm
from .recurrent import RecurrentState
from .rotary import RotaryEmbedding

__all__ = ["Attention", "AttentionMetadata", "ColumnParallelLinear", "MergedColumnParallelLinear", "ParallelLMHead",
           "QKVParallelLinear", "RMSNorm", "RecurrentState", "ReplicatedLinear", "RotaryEmbedding", "RowParallelLinear",
           "VocabParallelEmbedding"]
