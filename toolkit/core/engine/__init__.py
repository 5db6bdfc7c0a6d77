"""The shared batching engine: continuous batching over a paged KV cache, for any loaded model.

One file per role: ``sequence`` (request state and block arithmetic), ``block_manager``
(paged KV blocks, ref counts, prefix caching), ``state_pool`` (recurrent-state slots),
``scheduler`` (continuous batching, chunked prefill, preemption), ``model_runner`` (inputs,
attention metadata, CUDA graphs), ``sampler``, ``llm`` (the public API).
"""
from .llm import LLM
from .outputs import RequestOutput
from .sampling_params import SamplingParams

__all__ = ["LLM", "RequestOutput", "SamplingParams"]
