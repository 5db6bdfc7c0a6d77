"""Streaming writer of Hugging Face checkpoints: ``config.json``, ``*.safetensors`` shards
(with ``model.safetensors.index.json`` when more than one) and tokenizer files."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from toolkit.core.config import DTYPES
from toolkit.core.errors import ConversionError, UnknownNameError
from toolkit.core.experts import ExpertStacker, stacked_parts
from toolkit.core.registry import default_registry

SHARD_BYTES = 2 * 2**30
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts")  # the config's expert count, for stacking
# Keys that describe how a *source* file was quantized; the written checkpoint is dense.
DROPPED_CONFIG_KEYS = ("quantization_config",)


def architecture_namer(hf_config: dict):
    """The architecture's own renaming for written checkpoints (its safetensors name map's
    ``hf_namer(config)``, for layouts a source format stores differently), else None."""
    registry = default_registry()
    try:
        arch = registry.architecture(*(hf_config.get("architectures") or []), hf_config.get("model_type"))
        make = getattr(registry.name_map("safetensors", arch.name), "hf_namer", None)
    except UnknownNameError:  # an architecture toolkit does not build: its tensors pass through
        return None
    return make(arch.config_from(hf_config)) if make is not None else None


class HFWriter:
    """``--to safetensors[:fp32|fp16|bf16]`` (default fp32, which holds any dequantized value exactly)."""

    def __init__(self, dest: Path, target_type: str | None, shard_bytes: int = SHARD_BYTES):
        if target_type is not None and target_type not in DTYPES:
            raise ConversionError(f"safetensors cannot store {target_type!r}; choose one of {', '.join(DTYPES)}")
        self.dest, self.dtype = Path(dest), DTYPES[target_type or "fp32"]
        self.shard_bytes = shard_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.shards: list[list[str]] = []
        self.hf_config: dict = {}
        self.tokenizer = None
        self.num_parameters = 0

    def begin(self, *, hf_config: dict, tokenizer: Any | None, num_tensors: int) -> None:
        self.dest.mkdir(parents=True)
        self.hf_config = {k: v for k, v in hf_config.items() if k not in DROPPED_CONFIG_KEYS}
        self.hf_config["torch_dtype"] = str(self.dtype).removeprefix("torch.")
        self.tokenizer = tokenizer
        experts = next((hf_config[k] for k in EXPERT_COUNT_KEYS if hf_config.get(k)), 0)
        self.experts, self.halves = ExpertStacker(int(experts)), {}
        self.namer = architecture_namer(hf_config)

    def add_tensor(self, hf_name: str, tensor: torch.Tensor) -> None:
        """Experts are written in transformers' stacked layout (``mlp.experts.gate_up_proj``
        [E, 2I, H], ``mlp.experts.down_proj`` [E, H, I]), which every MoE family loads: one-expert
        tensors are stacked, and a stacked gate waits for its up (or the other way round)."""
        for name, value in self.experts.add(hf_name, tensor):
            parts = stacked_parts(name)
            if parts is None:
                for final_name, final_value in (self.namer.to_files(name, value) if self.namer else [(name, value)]):
                    self._add(final_name, final_value)
            elif parts[1] in ("gate_proj", "up_proj"):
                self._pair(parts[0], parts[1], value)
            else:
                self._add(name, value)

    def _pair(self, stack: str, proj: str, value: torch.Tensor) -> None:
        self.halves.setdefault(stack, {})[proj] = value
        if len(self.halves[stack]) == 2:
            halves = self.halves.pop(stack)
            self._add(f"{stack}.gate_up_proj", torch.cat([halves["gate_proj"], halves["up_proj"]], dim=-2))

    def _add(self, hf_name: str, tensor: torch.Tensor) -> None:
        value = tensor.to(self.dtype).contiguous()
        if self.pending and self.pending_bytes + value.nbytes > self.shard_bytes:
            self._flush()
        self.pending[hf_name] = value
        self.pending_bytes += value.nbytes
        self.num_parameters += value.numel()

    def _flush(self) -> None:
        index = len(self.shards)
        save_file(self.pending, self.dest / f"part-{index}.tmp", metadata={"format": "pt"})
        self.shards.append(list(self.pending))
        self.pending, self.pending_bytes = {}, 0

    def finish(self) -> dict[str, Any]:
        self.experts.check_done()
        if self.namer is not None:
            self.namer.check_done()
        if self.halves:
            raise ConversionError(f"stacked experts missing their gate or up half: {sorted(self.halves)}")
        if self.pending or not self.shards:
            self._flush()
        self._name_shards()
        (self.dest / "config.json").write_text(json.dumps(self.hf_config, indent=2))
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(self.dest)
        return {"parameters": self.num_parameters, "dtype": str(self.dtype)}

    def _name_shards(self) -> None:
        count = len(self.shards)
        if count == 1:
            (self.dest / "part-0.tmp").rename(self.dest / "model.safetensors")
            return
        weight_map = {}
        for i, names in enumerate(self.shards):
            final = f"model-{i + 1:05d}-of-{count:05d}.safetensors"
            (self.dest / f"part-{i}.tmp").rename(self.dest / final)
            weight_map.update(dict.fromkeys(names, final))
        index = {"metadata": {"total_size": sum((self.dest / f).stat().st_size for f in set(weight_map.values()))},
                 "weight_map": weight_map}
        (self.dest / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
