"""Building blocks shared by Llama-family decoders: attention, gated MLP, layer stack, causal LM.

Parameter names follow Hugging Face (``model.layers.N.self_attn.qkv_proj``...) with q/k/v and
gate/up fused; ``PACKED_MODULES`` tells name maps how the fused ones are assembled.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from toolkit.core.config import ModelConfig
from toolkit.core.errors import InvalidConfigError
from toolkit.core.layers import (Attention, AttentionMetadata, MergedColumnParallelLinear, ParallelLMHead,
                                 QKVParallelLinear, RMSNorm, RotaryEmbedding, RowParallelLinear, VocabParallelEmbedding)
from toolkit.core.parallel import ParallelContext
from toolkit.core.quant import QuantScheme
from toolkit.core.records import FrozenRecord
from toolkit.kernels.int8_blocks import gated, requested
from toolkit.kernels.split_sums import SplitSums, reduced

PACKED_MODULES = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}

ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
               "gelu": F.gelu}


class AttentionOptions(FrozenRecord):
    """Per-layer attention choices an architecture makes (never per format). A hand-written record,
    not a dataclass: every model build imports this module (toolkit/core/records.py says why)."""

    qkv_bias: bool
    qk_norm: bool
    norm_offset: float
    rope_theta: float
    rope_scaling: dict | None
    sliding_window: int | None
    scale: float | None
    logit_softcap: float | None

    def __init__(self, qkv_bias: bool = False, qk_norm: bool = False, norm_offset: float = 0.0,
                 rope_theta: float = 10000.0, rope_scaling: dict | None = None, sliding_window: int | None = None,
                 scale: float | None = None, logit_softcap: float | None = None):
        self.__dict__.update(qkv_bias=qkv_bias, qk_norm=qk_norm, norm_offset=norm_offset, rope_theta=rope_theta,
                             rope_scaling=rope_scaling, sliding_window=sliding_window, scale=scale,
                             logit_softcap=logit_softcap)


class DecoderAttention(nn.Module):
    def __init__(self, config: ModelConfig, options: AttentionOptions, *, quant: QuantScheme,
                 parallel: ParallelContext, prefix: str):
        super().__init__()
        hd = config.head_dim
        self.qkv_proj = QKVParallelLinear(config.hidden_size, hd, config.num_heads, config.num_kv_heads, quant=quant,
                                          parallel=parallel, prefix=f"{prefix}.qkv_proj", bias=options.qkv_bias)
        self.o_proj = RowParallelLinear(config.num_heads * hd, config.hidden_size, quant=quant, parallel=parallel,
                                        prefix=f"{prefix}.o_proj", bias=False)
        if options.qk_norm:
            dtype = quant.params_dtype
            self.q_norm = RMSNorm(hd, config.rms_norm_eps, weight_offset=options.norm_offset, dtype=dtype)
            self.k_norm = RMSNorm(hd, config.rms_norm_eps, weight_offset=options.norm_offset, dtype=dtype)
        self.qk_norm = options.qk_norm
        self.rotary = RotaryEmbedding(hd, base=options.rope_theta, scaling=options.rope_scaling)
        self.attn = Attention(self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads, hd,
                              scale=options.scale or hd ** -0.5, sliding_window=options.sliding_window,
                              logit_softcap=options.logit_softcap)

    def int8_input(self, tokens: int):
        """What the block reads of its input (the q/k/v projection's need; ``kernels/int8_blocks.py``)."""
        return self.qkv_proj.int8_input(tokens)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, attn: AttentionMetadata,
                unreduced: bool = False) -> torch.Tensor | SplitSums:
        """The block's output; ``unreduced``: the caller's next op (``RMSNorm.forward_add``) takes the output
        projection's split-K partial sums (``kernels/split_sums.py``)."""
        # q, k and v may stay split-K partial sums too: the rotary op that stores k and v adds them as it loads
        q, k, v = self.qkv_proj.split(self.qkv_proj(hidden, unreduced=True))
        # the q/k norms and rotary run inside attention: with a KV cache, in the one op that stores k and v
        qk_norm = (self.q_norm, self.k_norm) if self.qk_norm else None
        return self.o_proj(self.attn(q, k, v, attn, rotary=self.rotary, positions=positions, qk_norm=qk_norm,
                                     feeds=self.o_proj), unreduced=unreduced)


class GatedMLP(nn.Module):
    def __init__(self, config: ModelConfig, *, quant: QuantScheme, parallel: ParallelContext, prefix: str):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [config.intermediate_size] * 2, quant=quant,
                                                       parallel=parallel, prefix=f"{prefix}.gate_up_proj")
        self.down_proj = RowParallelLinear(config.intermediate_size, config.hidden_size, quant=quant,
                                           parallel=parallel, prefix=f"{prefix}.down_proj")
        if config.hidden_act not in ACTIVATIONS:
            raise InvalidConfigError(f"activation {config.hidden_act!r} is not supported ({', '.join(ACTIVATIONS)})",
                                     key="hidden_act")
        self.act = ACTIVATIONS[config.hidden_act]
        self.activation = config.hidden_act

    def int8_input(self, tokens: int):
        """What the block reads of its input (the gate/up projection's need; ``kernels/int8_blocks.py``)."""
        return self.gate_up_proj.int8_input(tokens)

    def forward(self, x: torch.Tensor, unreduced: bool = False) -> torch.Tensor | SplitSums:
        """The block's output; ``unreduced``: the caller's next op takes the down projection's split-K partial
        sums (``kernels/split_sums.py``)."""
        # act(gate) * up as one op (one kernel on CUDA instead of an activation and a product), adding the gate/up
        # projection's split-K partial sums as it reads them and writing the int8 blocks the down projection
        # reads where it reads them
        tokens = x.numel() // x.shape[-1]
        return self.down_proj(gated(self.gate_up_proj(x, unreduced=True), self.activation,
                                    requested(self.down_proj, tokens)), unreduced=unreduced)


def add_norm(norm: RMSNorm, hidden: torch.Tensor, residual: torch.Tensor | None,
             feeds=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(norm(hidden + residual), hidden + residual)`` as one op; the first layer has no residual yet.
    ``feeds``: the module the normalised output goes to (``RMSNorm``'s int8 blocks).

    Layers pass the residual stream on instead of adding their output to it, so that every
    residual add is the one in the next norm's kernel (and the model's final norm absorbs the
    last); the sum is rounded to the activation dtype exactly as a separate add would round it.
    """
    if residual is None:
        hidden = reduced(hidden)
        return norm(hidden, feeds), hidden
    return norm.forward_add(hidden, residual, feeds)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x)).

    ``forward(positions, hidden, residual, attn) -> (hidden, residual)``: the block's output (a tensor, or
    split-K partial sums, ``kernels/split_sums.py``) and the residual stream it has not yet been added to (see
    ``add_norm``).
    """

    def __init__(self, config: ModelConfig, options: AttentionOptions, *, quant, parallel, prefix: str):
        super().__init__()
        dtype = quant.params_dtype
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype)
        self.self_attn = DecoderAttention(config, options, quant=quant, parallel=parallel, prefix=f"{prefix}.self_attn")
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype)
        self.mlp = GatedMLP(config, quant=quant, parallel=parallel, prefix=f"{prefix}.mlp")

    def forward(self, positions, hidden, residual, attn):
        # both blocks hand their last projection's split-K partial sums on (``kernels/split_sums.py``): the next
        # norm's residual add takes them (this layer's post-attention norm, the next layer's input norm, or the
        # model's final norm)
        normed, residual = add_norm(self.input_layernorm, hidden, residual, self.self_attn)
        attended = self.self_attn(positions, normed, attn, unreduced=True)
        normed, residual = self.post_attention_layernorm.forward_add(attended, residual, self.mlp)
        return self.mlp(normed, unreduced=True), residual


class DecoderModel(nn.Module):
    """Embedding, a stack of layers built by ``make_layer(index, prefix)``, final norm.

    Each layer is called ``layer(positions, hidden, residual, attn) -> (hidden, residual)``; the
    final norm adds the last layer's output to the residual stream.
    """

    def __init__(self, config: ModelConfig, make_layer, *, quant, parallel, norm_offset: float = 0.0,
                 embed_scale: float | None = None):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, quant=quant,
                                                   parallel=parallel, prefix="model.embed_tokens")
        self.layers = nn.ModuleList(make_layer(i, f"model.layers.{i}") for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, weight_offset=norm_offset,
                            dtype=quant.params_dtype)
        self.embed_scale = embed_scale

    def forward(self, input_ids, positions, attn):
        hidden = self.embed_tokens(input_ids)
        if self.embed_scale is not None:  # Gemma: scaled in the activation dtype, as transformers does
            hidden = hidden * torch.tensor(self.embed_scale, dtype=hidden.dtype)
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, attn)
        return add_norm(self.norm, hidden, residual)[0]


class CausalLM(nn.Module):
    """``forward(input_ids, positions, attn) -> hidden``; ``compute_logits(hidden) -> logits``."""

    def __init__(self, config: ModelConfig, model: DecoderModel, *, quant, parallel, final_logit_softcap=None):
        super().__init__()
        self.config, self.model = config, model
        tied = model.embed_tokens if config.tie_word_embeddings else None
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, quant=quant, parallel=parallel,
                                      prefix="lm_head", tied_to=tied)
        self.final_logit_softcap = final_logit_softcap

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, attn)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        if self.final_logit_softcap:
            logits = torch.tanh(logits / self.final_logit_softcap) * self.final_logit_softcap
        return logits
