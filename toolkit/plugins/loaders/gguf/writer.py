"""Streaming GGUF writer: ``toolkit convert SRC DEST --to gguf[:TYPE]``.

The conversion driver hands over Hugging Face-named dense tensors one at a time. Each is
renamed and re-laid-out as llama.cpp stores it (writer_names.py), given its type (recipes.py),
encoded (``toolkit.kernels.gguf_quant``; on the GPU when there is one) and appended to a spill
file at once, so peak memory stays near one tensor.

Why a spill file: a GGUF header lists every tensor (name, shape, type, offset) before the
data, and a streaming writer learns them only one by one. gguf-py's ``GGUFWriter`` supports
exactly this (``use_temp_file``): tensor data goes to a temporary file as it is added, and
``finish`` writes header, metadata and tensor infos, then copies the data after them. The spill
file is an anonymous temporary file in DEST's directory (same disk as the output, never
left behind; gguf-py's default would buffer 256 MiB in memory and then spill to /tmp). The
cost is writing the data twice, sequentially; quantizing dominates.
"""
from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_VERSION, GGMLQuantizationType

from toolkit.core.errors import ConversionError
from toolkit.core.experts import ExpertStacker, stacked_parts
from toolkit.core.registry import default_registry
from toolkit.kernels.gguf_quant import quantize

from .recipes import TypePlan, recipe_for
from .writer_metadata import add_entries, arch_entries, check_round_trip, gguf_architecture, rope_tensors
from .writer_names import namer_for
from .writer_passthrough import RawGGUFWriter, copy_tokenizer_fields, copyable, has_tokenizer_fields
from .writer_tokenizer import add_vocab, special_entries, vocab_from

Q = GGMLQuantizationType
F16_MAX = float(torch.finfo(torch.float16).max)


class GGUFFileWriter:
    """``begin`` / ``add_tensor`` / ``finish`` for one GGUF file at ``dest``.

    :param dest: the file to write (the driver passes a staging path it renames when done)
    :param target_type: a plain type or recipe (recipes.RECIPES); None: BF16 for a bfloat16
        source, else F16 (llama.cpp's converter default)
    :param overrides: (glob on the HF or GGUF name, type), first match wins
    """

    def __init__(self, dest: Path, target_type: str | None = None, overrides: tuple[tuple[str, str], ...] = ()):
        self.dest, self.target, self.overrides = Path(dest), target_type, overrides
        if target_type is not None:
            recipe_for(target_type)  # an unknown type fails before the source is read
        self.types: Counter[str] = Counter()
        self.fallbacks: list[str] = []
        self.notes: list[str] = []
        self.num_parameters = self.data_bytes = 0
        self.source = None  # a GGUF checkpoint whose tokenizer fields are copied (copies_tokenizer)

    def copies_tokenizer(self, checkpoint) -> bool:
        """Part of the TensorWriter contract (optional): a GGUF source's ``tokenizer.*`` fields are
        copied as stored (writer_passthrough.py), so the driver need not build its tokenizer."""
        self.source = checkpoint if has_tokenizer_fields(checkpoint) else None
        return self.source is not None

    # ---- the TensorWriter contract ---------------------------------------------------------
    def begin(self, *, hf_config: dict, tokenizer: Any | None, num_tensors: int) -> None:
        registry = default_registry()
        arch = registry.architecture(*(hf_config.get("architectures") or []), hf_config.get("model_type"))
        config = arch.config_from(hf_config)
        self.gguf_arch = gguf_architecture(arch, registry)
        self.namer = namer_for(registry.name_map("gguf", arch.name), config, self.gguf_arch, arch.packed_modules)
        self.experts = ExpertStacker(getattr(config, "num_experts", 0))
        self.target = (self.target or ("BF16" if config.torch_dtype == "bfloat16" else "F16")).upper()
        self.plan = TypePlan(self.target, self.overrides, num_layers=config.num_layers,
                             tied=config.tie_word_embeddings)
        entries, config_tensors = arch_entries(self.gguf_arch, config), rope_tensors(config)
        entries += getattr(self.namer, "extra_entries", list)()
        check_round_trip(arch, self.gguf_arch, config, entries, config_tensors)
        self.dest.parent.mkdir(parents=True, exist_ok=True)
        self.writer = RawGGUFWriter(str(self.dest), self.gguf_arch, use_temp_file=True)
        self.writer.temp_file = tempfile.TemporaryFile(dir=self.dest.parent)  # see the module docstring
        self.writer.add_type("model")
        self.writer.add_name(self.dest.stem)
        add_entries(self.writer, entries)
        self.writer.add_file_type(int(self.plan.recipe.file_type))
        self.writer.add_quantization_version(GGML_QUANT_VERSION)
        self._add_tokenizer(tokenizer, config)
        for name, values in config_tensors.items():  # not parameters: counted as tensors only
            self.writer.add_tensor(name, values)
            self.types["F32"] += 1

    def add_tensor(self, hf_name: str, tensor: torch.Tensor) -> None:
        """One tensor; one-expert tensors wait until their projection's experts are all here (GGUF
        stacks them), and a stacked gate+up is written as llama.cpp's separate gate and up."""
        for name, values in self.experts.add(hf_name, tensor):
            parts = stacked_parts(name)
            if parts is not None and parts[1] == "gate_up_proj":
                gate, up = values.chunk(2, dim=-2)
                self._add(f"{parts[0]}.gate_proj", gate)
                self._add(f"{parts[0]}.up_proj", up)
            else:
                self._add(name, values)

    def _add(self, hf_name: str, tensor: torch.Tensor) -> None:
        for gguf_name, values in self.namer.to_files(hf_name, tensor):  # a namer may split or drop a tensor
            self._add_one(hf_name, gguf_name, values)

    def _add_one(self, hf_name: str, gguf_name: str, values: torch.Tensor) -> None:
        choice = self.plan.choose(hf_name, gguf_name, tuple(values.shape))
        if choice.fallback_from is not None:
            self.fallbacks.append(f"{gguf_name}: {choice.fallback_from.name} -> {choice.qtype.name} "
                                  f"(rows of {values.shape[-1]} are not whole {choice.fallback_from.name} blocks)")
        data = encode(values, choice.qtype, name=hf_name)
        self.writer.add_tensor(gguf_name, data, raw_dtype=None if choice.qtype in (Q.F32, Q.F16) else choice.qtype)
        self.types[choice.qtype.name] += 1
        self.num_parameters += values.numel()
        self.data_bytes += data.nbytes

    def finish(self) -> dict[str, Any]:
        self.experts.check_done()
        self.writer.write_header_to_file()
        self.writer.write_kv_data_to_file()
        self.writer.write_tensors_to_file()  # header and tensor infos, then the spilled data
        self.writer.close()
        return {"parameters": self.num_parameters, "gguf_type": self.target,
                "file_type": self.plan.recipe.file_type.name, "architecture": self.gguf_arch,
                "bits_per_weight": 8 * self.data_bytes / max(self.num_parameters, 1),
                "tensor_types": dict(sorted(self.types.items())), "fallbacks": self.fallbacks, "notes": self.notes}

    # ---- pieces -----------------------------------------------------------------------------
    def _add_tokenizer(self, tokenizer, config) -> None:
        if self.source is not None:
            if copyable(self.source.metadata, config.vocab_size):
                self.notes += copy_tokenizer_fields(self.writer, self.source.metadata, gguf_arch=self.gguf_arch)
                return
            tokenizer = self.source.tokenizer()  # rows past the vocabulary: pad it as for any source
        if tokenizer is None:
            self.notes.append("the source has no tokenizer: none was written (transformers cannot load the "
                              "file; toolkit needs --tokenizer)")
            return
        vocab = vocab_from(tokenizer, gguf_arch=self.gguf_arch, vocab_size=config.vocab_size)
        specials = special_entries(tokenizer, bos=config.bos_token_id, eos=config.eos_token_ids)
        if len(config.eos_token_ids) > 2:
            self.notes.append(f"eos ids {config.eos_token_ids}: GGUF keeps eos and eot only "
                              f"({config.eos_token_ids[0]}, {config.eos_token_ids[-1]})")
        add_vocab(self.writer, vocab, specials)
        self.notes += vocab.notes


def encode(values: torch.Tensor, qtype: GGMLQuantizationType, *, name: str) -> np.ndarray:
    """``values`` as the bytes (or plain array) gguf-py writes for ``qtype``; ConversionError for
    values the type cannot hold (non-finite anywhere, beyond the float16 range for F16)."""
    values = values.detach()
    if qtype not in (Q.F32, Q.F16, Q.BF16):  # the quantizer checks as it encodes (no extra pass)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        return quantize(values.to(device), qtype, name=name, check_finite=True).cpu().numpy()
    peak = _peak(values)
    if not np.isfinite(peak):
        raise ConversionError(f"tensor {name!r} holds non-finite values; refusing to convert it")
    if qtype == Q.F16 and peak > F16_MAX:
        raise ConversionError(f"tensor {name!r} has values up to {peak:.3g}, beyond float16; choose BF16 or F32")
    if qtype == Q.F32:
        return values.to("cpu", torch.float32).contiguous().numpy()
    if qtype == Q.F16:
        return values.to("cpu", torch.float16).contiguous().numpy()
    return values.to("cpu", torch.bfloat16).contiguous().view(torch.uint8).numpy()  # BF16: raw bytes, typed by raw_dtype


def _peak(values: torch.Tensor) -> float:
    """max |value| (NaN if any is NaN) without a tensor-sized temporary such as ``abs()`` makes."""
    if not values.numel():
        return 0.0
    low, high = torch.aminmax(values)
    return max(-low.item(), high.item()) if not (low.isnan() or high.isnan()) else float("nan")
