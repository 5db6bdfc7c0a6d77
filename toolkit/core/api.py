"""The public Python API: ``toolkit.load``."""
from __future__ import annotations

import os

import torch

from .config import LoadConfig, parse_device, parse_dtype
from .load import Progress, load_local
from .loaded import LoadedModel
from .parallel import SINGLE, ParallelContext


def load(ref, format: str | None = None, quant: str | None = None, dtype: str | torch.dtype | None = None,
         device: str | torch.device | None = None, tp: int = 1, *, tokenizer: str | None = None,
         progress: Progress | None = None, expert_parallel: bool | None = None):
    """Load a model through the plugins.

    :param ref: local file or directory, or a hub repo id (``org/name`` or ``org/name:QUANT``)
    :param format: loader name (default: the loader most confident it reads ``ref``)
    :param quant: on-the-fly quantization scheme (``name`` or ``name:key=value,...``); pre-quantized files pick their own
    :param dtype: ``fp32``/``fp16``/``bf16`` for activations and unquantized weights
        (default fp32 on CPU, the checkpoint's 16-bit dtype on GPU)
    :param device: ``cpu``, ``cuda``, ``cuda:1`` (default cuda if available)
    :param tp: tensor-parallel size. Under torchrun (WORLD_SIZE set) each rank gets its shard;
        from a single process, tp > 1 starts and manages that many worker processes and returns
        a handle whose calls run on all ranks.
    :param expert_parallel: for mixture-of-experts models at tp > 1, True gives each rank ``E / tp``
        whole experts, False splits every expert's intermediate dimension (None: the config's
        ``expert_parallel`` key, default False); OptionError for a model without experts
    :returns: LoadedModel (``.model .config .tokenizer .report .logits() .generate()``)
    """
    device = parse_device(device)
    load_config = LoadConfig(format=format, quant=quant, dtype=parse_dtype(dtype), device=device, tokenizer=tokenizer,
                             expert_parallel=expert_parallel)
    if tp > 1 or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from . import distributed  # noqa: PLC0415 - only multi-rank loads need it

        return distributed.load_parallel(ref, load_config, tp=tp, progress=progress)
    return load_on_rank(ref, load_config, SINGLE, progress)


def load_on_rank(ref, load_config: LoadConfig, parallel: ParallelContext, progress: Progress | None = None) -> LoadedModel:
    """Load this rank's shard in this process."""
    model, arch, config, scheme, tokenizer, report = load_local(ref, load_config, parallel=parallel, progress=progress)
    return LoadedModel(model=model, config=config, tokenizer=tokenizer, report=report, arch=arch, scheme=scheme,
                       parallel=parallel, device=load_config.device)
