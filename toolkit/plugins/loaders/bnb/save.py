"""Write a toolkit model quantized by a bnb scheme as transformers' pre-quantized layout.

4-bit: ``X.weight`` (packed uint8 [n/2, 1]) plus ``QuantState.as_dict(packed=True)`` under
``X.weight.*``; 8-bit: ``X.weight`` (int8), ``X.SCB``, ``X.weight_format``. Fused layers
(qkv_proj, gate_up_proj) are written back as their checkpoint modules, one quant state each,
which is how they were quantized. Everything else is written as it is held.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import torch
from safetensors.torch import save_file

from toolkit.core.convert import unpacked_name
from toolkit.core.errors import ConversionError
from toolkit.plugins.quant.bnb import Bnb4bitParameter, Bnb8bitParameter

ROW_FORMAT = torch.tensor(0, dtype=torch.uint8)  # bitsandbytes' "row" int8 layout


def save_pretrained(loaded, dest: Path) -> dict:
    """Write ``dest/{model.safetensors, config.json, tokenizer files}``; returns summary facts."""
    model, parallel, scheme = getattr(loaded, "model", None), getattr(loaded, "parallel", None), loaded.scheme
    if model is None or parallel is None or parallel.tp_size != 1:
        raise ConversionError("saving a bitsandbytes checkpoint needs the whole model in this process (tp=1)")
    if not hasattr(scheme, "hf_quantization_config"):
        raise ConversionError(f"the model is quantized with {scheme.name!r}, not a bitsandbytes scheme; load it "
                              "with quant='bnb-nf4', 'bnb-fp4' or 'bnb-int8' first")
    tensors = dict(hf_tensors(model, loaded.arch.packed_modules))
    dest.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    (dest / "config.json").write_text(json.dumps(_hf_config(loaded.config.raw, scheme), indent=2))
    if loaded.tokenizer is not None:
        loaded.tokenizer.save_pretrained(dest)
    return {"tensors": len(tensors), "quantization": scheme.hf_quantization_config()}


def hf_tensors(model: torch.nn.Module, packed_modules) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of the checkpoint, under Hugging Face names, as standalone contiguous tensors."""
    for module_name, module in model.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            canonical = f"{module_name}.{param_name}" if module_name else param_name
            for name, tensor in _param_tensors(module, canonical, param, packed_modules):
                yield name, tensor.detach().to("cpu", copy=True).contiguous()


def _param_tensors(module, canonical: str, param, packed_modules):
    shard_ids = param.shard_ids if len(getattr(param, "shard_ids", ())) > 1 else (None,)
    names = [unpacked_name(canonical, shard_id, packed_modules) for shard_id in shard_ids]
    if isinstance(param, Bnb4bitParameter):
        for name, (packed, state) in zip(names, param.segments()):
            yield name, packed.view(-1, 1)
            for key, value in state.as_dict(packed=True).items():
                yield f"{name}.{key}", value
    elif isinstance(param, Bnb8bitParameter):
        for segment, name in enumerate(names):
            rows = param.segment_rows(segment)
            module_prefix = name.removesuffix("weight")
            yield name, param.data[rows]
            yield module_prefix + "SCB", param.scb[rows]
            yield module_prefix + "weight_format", ROW_FORMAT
    elif len(names) > 1:  # a fused layer's bias: one piece per checkpoint module
        yield from zip(names, param.data.split(list(module.output_partition_sizes)))
    elif hasattr(module, "num_real_rows"):  # vocab-parallel tables carry padding rows
        yield canonical, param.data[: module.num_real_rows]
    else:
        yield canonical, param.data


def _hf_config(raw: dict, scheme) -> dict:
    config = dict(raw)
    config["quantization_config"] = scheme.hf_quantization_config()
    dtype = str(scheme.params_dtype).removeprefix("torch.")
    for key in [k for k in ("dtype", "torch_dtype") if k in config] or ["dtype"]:
        config[key] = dtype
    return config
