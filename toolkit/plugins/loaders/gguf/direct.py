"""``toolkit convert A.gguf B.gguf --to gguf:TYPE`` without torch (core/convert_direct.py's contract).

The driver's way (convert.py + writer.py) maps each tensor to its Hugging Face name and back, as a
torch tensor; for a dense GGUF source of an architecture whose name map is one plain table
(leaves.DENSE_LEAVES) that round trip changes nothing: the names come back as they were, a q/k
row permutation and its inverse cancel, and Gemma's norms keep their stored bytes
(writer_names.py). So this plan reads the source's float tensors with numpy, picks each type
with the writer's own TypePlan, encodes with the compiled quantizer built as a plain library
(kernels/gguf_quant/plain.py: the torch extension's source and flags, so its bytes), and writes
through gguf-py's GGUFWriter. Torch is never imported: that import is most of what the command
used to cost (issue 13).

Metadata is the source's, copied as encoded bytes in the source's order, with ``general.name``,
``general.file_type`` and ``general.quantization_version`` set as the driver sets them and the
``tokenizer.*`` fields copied by the driver's own rules (writer_passthrough.py). The driver instead
rebuilds ``{arch}.*`` from the model config; for a file it wrote itself (or any file whose keys are
the ones it writes, in its order) both give the same bytes, and tests/test_gguf_direct_convert.py
compares them. A file from another tool keeps its extra keys here, as llama-quantize keeps them.

It declines (returns None, and the driver converts) anything else: quantized, split or
custom-aligned sources, other architectures, tensors outside the table (``rope_freqs``, experts),
rope scaling keys (the driver derives tensors from them), no target type, a type the compiled
quantizer does not encode, a vocabulary that does not cover the embedding, and any machine where
the plain library cannot be built.
"""
from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGML_QUANT_VERSION, GGMLQuantizationType

from toolkit.core.errors import ConversionError

from .leaves import DENSE_LEAVES, GLOBAL_LEAVES
from .metadata import Metadata
from .metadata_checks import check_globals, check_hparams
from .reader import has_magic, open_reader
from .recipes import TypePlan, recipe_for
from .tokenizer_checks import check_tokenizer_metadata
from .writer_passthrough import PREFIX, TOKENS, RawGGUFWriter, RawValue, copy_tokenizer_fields, value_bytes

Q = GGMLQuantizationType
DENSE = {Q.F32: np.float32, Q.F16: np.float16, Q.BF16: None}
_NAME = re.compile(r"^(?:blk\.(?P<layer>\d+)\.)?(?P<leaf>[A-Za-z0-9_]+)\.(?P<kind>weight|bias)$")
# keys the writer sets itself (GGUF.* are the reader's view of the header, not metadata)
SET_BY_WRITER = frozenset({"general.architecture", "general.name", "general.file_type", "general.quantization_version"})


def direct_plan(source, target_type, *, overrides=(), source_format=None):
    """A DirectRequantize for ``source`` -> ``--to gguf:target_type``, or None (see the module docstring)."""
    if target_type is None or source_format not in (None, "gguf"):
        return None
    path = Path(str(source))
    if not path.is_file() or not has_magic(path):
        return None
    try:
        recipe_for(target_type)
    except ConversionError:
        return None  # the driver reports it, with the list of types
    return DirectRequantize.open(path, target_type, tuple(overrides))


class DirectRequantize:
    def __init__(self, path: Path, reader, metadata: Metadata, arch: str, target: str, overrides):
        self.path, self.reader, self.metadata, self.arch = path, reader, metadata, arch
        self.target, self.overrides = target.upper(), overrides
        self.tensors = list(reader.tensors)
        names = {t.name for t in self.tensors}
        self.plan = TypePlan(self.target, overrides, num_layers=int(metadata[f"{arch}.block_count"]),
                             tied="output.weight" not in names)  # as the GGUF config reads "tied"

    @classmethod
    def open(cls, path: Path, target: str, overrides) -> DirectRequantize | None:
        reader = open_reader(path)
        metadata = Metadata(reader.fields, file=str(path))
        check_globals(metadata)
        arch = metadata.get("general.architecture")
        if arch not in DENSE_LEAVES or any(key.startswith(("split.", f"{arch}.rope.scaling.")) or key == "general.alignment"
                                           for key in metadata):
            return None
        if f"{arch}.block_count" not in metadata or TOKENS not in metadata:
            return None
        check_hparams(metadata, arch)
        check_tokenizer_metadata(metadata)
        vocab = metadata.get(f"{arch}.vocab_size") or metadata.length(TOKENS)
        if metadata.length(TOKENS) != vocab:
            return None  # the driver pads the vocabulary
        plan = cls(path, reader, metadata, arch, target, overrides)
        if not all(plan._plain(t) for t in plan.tensors):
            return None
        from toolkit.kernels.gguf_quant import plain  # noqa: PLC0415

        if plan.quantized_types() and plain.library() is None:
            print(f"warning: the plain CPU quantizer is unavailable ({plain.failure()}); converting through torch",
                  file=sys.stderr)
            return None
        return plan

    # ---- what the driver would do ----------------------------------------------------------
    def hf_name(self, gguf_name: str) -> str | None:
        """The Hugging Face name the driver hands its writer (None: not a plain table leaf)."""
        match = _NAME.match(gguf_name)
        if match is None:
            return None
        if match["layer"] is None:
            module = GLOBAL_LEAVES.get(match["leaf"])
            return f"{module}.{match['kind']}" if module else None
        module = DENSE_LEAVES[self.arch].get(match["leaf"])
        return f"model.layers.{match['layer']}.{module}.{match['kind']}" if module else None

    @staticmethod
    def shape(tensor) -> tuple[int, ...]:
        return tuple(int(d) for d in reversed(tensor.shape.tolist()))

    def choice(self, tensor):
        return self.plan.choose(self.hf_name(tensor.name), tensor.name, self.shape(tensor))

    def _plain(self, tensor) -> bool:
        """A float tensor under a table name, stored as F32 or a type the compiled quantizer encodes."""
        if self.hf_name(tensor.name) is None or int(tensor.tensor_type) not in (Q.F32, Q.F16, Q.BF16):
            return False
        from toolkit.kernels.gguf_quant.plain import BLOCKS  # noqa: PLC0415

        qtype = self.choice(tensor).qtype
        return qtype == Q.F32 or int(qtype) in BLOCKS

    def quantized_types(self) -> set:
        return {self.choice(t).qtype for t in self.tensors} - {Q.F32}

    # ---- writing -------------------------------------------------------------------------------
    def write(self, dest: Path, progress=None):
        from toolkit.kernels.gguf_quant import plain  # noqa: PLC0415

        writer = RawGGUFWriter(str(dest), self.arch)
        notes = self._metadata(writer, dest)
        choices = [self.choice(t) for t in self.tensors]
        for tensor, choice in zip(self.tensors, choices):
            shape = self.shape(tensor)
            if choice.qtype == Q.F32:
                writer.add_tensor_info(tensor.name, shape, np.dtype(np.float32), 4 * int(tensor.n_elements))
            else:
                elements, size = GGML_QUANT_SIZES[choice.qtype]
                writer.add_tensor_info(tensor.name, (*shape[:-1], shape[-1] // elements * size), np.dtype(np.uint8),
                                       int(tensor.n_elements) // elements * size, raw_dtype=choice.qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        types, fallbacks = Counter(), []
        source_bytes = parameters = data_bytes = 0
        with Spooler(writer.write_tensor_data) as spool:
            for done, (tensor, choice) in enumerate(zip(self.tensors, choices), start=1):
                hf_name, shape = self.hf_name(tensor.name), self.shape(tensor)
                values = _float32(tensor, shape)
                if choice.qtype == Q.F32:
                    if values.size and not np.isfinite(values).all():
                        raise ConversionError(f"tensor {hf_name!r} holds non-finite values; refusing to convert it")
                    data = values
                else:
                    if choice.fallback_from is not None:
                        fallbacks.append(f"{tensor.name}: {choice.fallback_from.name} -> {choice.qtype.name} "
                                         f"(rows of {shape[-1]} are not whole {choice.fallback_from.name} blocks)")
                    data, finite = plain.quantize_rows(values.reshape(-1, shape[-1]), int(choice.qtype))
                    if not finite:
                        raise ConversionError(f"tensor {hf_name!r} holds non-finite values; refusing to quantize it")
                spool.put(data)
                types[choice.qtype.name] += 1
                source_bytes += int(tensor.n_bytes)
                parameters += values.size
                data_bytes += data.nbytes
                if progress is not None:
                    progress(done, len(self.tensors), hf_name)
        writer.close()
        facts = {"parameters": parameters, "gguf_type": self.target, "file_type": self.plan.recipe.file_type.name,
                 "architecture": self.arch, "bits_per_weight": 8 * data_bytes / max(parameters, 1),
                 "tensor_types": dict(sorted(types.items())), "fallbacks": fallbacks, "notes": notes}
        return facts, (source_bytes, len(self.tensors), parameters)

    def _metadata(self, writer, dest: Path) -> list[str]:
        """The source's keys in its order (see the module docstring); returns the tokenizer notes."""
        notes, tokenizer_done = [], False
        wanted = {"general.name": lambda: writer.add_name(dest.stem),
                  "general.file_type": lambda: writer.add_file_type(int(self.plan.recipe.file_type)),
                  "general.quantization_version": lambda: writer.add_quantization_version(GGML_QUANT_VERSION)}
        for key in self.metadata:
            if key.startswith("GGUF.") or key == "general.architecture":
                continue
            if key in wanted:
                wanted.pop(key)()
            elif key.startswith(PREFIX):
                if not tokenizer_done:
                    notes += copy_tokenizer_fields(writer, self.metadata, gguf_arch=self.arch)
                    tokenizer_done = True
            else:
                field = self.metadata.field(key)
                writer.add_key_value(key, RawValue(value_bytes(field)), field.types[0])
        for add in wanted.values():  # keys the source lacks
            add()
        return notes


class Spooler:
    """Calls ``write`` on each item ``put`` here, in order, on a thread of its own: the file is
    written while the next tensor is quantized (both release the GIL). The first error in
    ``write`` is raised by the next ``put`` or on leaving the block; an error in the block stops
    the thread (the caller's staging then discards the file)."""

    def __init__(self, write, depth: int = 4):
        import queue  # noqa: PLC0415
        import threading  # noqa: PLC0415

        self.write, self.error = write, None
        self.queue = queue.Queue(maxsize=depth)
        self.thread = threading.Thread(target=self._run, name="gguf-direct-writer", daemon=True)

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            if self.error is None:
                try:
                    self.write(item)
                except BaseException as error:  # noqa: BLE001 - handed to the caller's thread
                    self.error = error

    def put(self, item) -> None:
        if self.error is not None:
            raise self.error
        self.queue.put(item)

    def __enter__(self) -> Spooler:
        self.thread.start()
        return self

    def __exit__(self, kind, error, trace) -> None:
        self.queue.put(None)
        self.thread.join()
        if kind is None and self.error is not None:
            raise self.error


def _float32(tensor, shape: tuple[int, ...]) -> np.ndarray:
    """The tensor's values as float32 in its logical shape (a view of the file for F32)."""
    qtype = Q(int(tensor.tensor_type))
    raw = np.asarray(tensor.data)
    if qtype == Q.BF16:
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    return raw.view(DENSE[qtype]).reshape(shape).astype(np.float32, copy=False)
