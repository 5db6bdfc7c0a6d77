"""GGUF files for the fuzzer: a seed parsed into editable parts and written back byte by byte.

The writer here is deliberately not gguf-py's: it must be able to write what gguf-py refuses to
(invalid UTF-8, values that do not fit their declared type, tensor tables whose offsets, types
or dimensions disagree with the data). Parsing the seed uses gguf-py's reader.
"""
from __future__ import annotations

import math
import random
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q, GGUFReader, GGUFValueType as T

from fuzz_values import NUMBERS

SCALAR_FORMATS = {T.UINT8: "B", T.INT8: "b", T.UINT16: "H", T.INT16: "h", T.UINT32: "I", T.INT32: "i",
                  T.FLOAT32: "f", T.BOOL: "?", T.UINT64: "Q", T.INT64: "q", T.FLOAT64: "d"}
ALIGNMENT = 32


@dataclass
class KV:
    key: str
    vtype: T
    value: Any
    sub: T | None = None


@dataclass
class TensorEntry:
    name: str
    dims: list[int]       # ggml order (fastest first), as stored
    qtype: int
    data: bytes
    offset: int | None = None  # None: where the data is laid out; else this value is written


@dataclass
class GGUFModel:
    kvs: list[KV] = field(default_factory=list)
    tensors: list[TensorEntry] = field(default_factory=list)
    n_dims_override: dict[int, int] = field(default_factory=dict)  # tensor index -> n_dims written

    def kv(self, key: str) -> KV | None:
        return next((kv for kv in self.kvs if kv.key == key), None)


def parse(path: Path) -> GGUFModel:
    reader = GGUFReader(str(path))
    model = GGUFModel()
    for key, fld in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        types = list(fld.types)
        if types[0] == T.ARRAY:
            if types[1] == T.STRING:
                value = [bytes(fld.parts[i]) for i in fld.data]
            else:
                value = [fld.parts[i].tolist()[0] for i in fld.data]
            model.kvs.append(KV(key, T.ARRAY, value, types[1]))
        elif types[0] == T.STRING:
            model.kvs.append(KV(key, T.STRING, bytes(fld.parts[fld.data[0]])))
        else:
            model.kvs.append(KV(key, types[0], fld.parts[fld.data[0]].tolist()[0]))
    for tensor in reader.tensors:
        dims = [int(d) for d in tensor.field.parts[3]]
        model.tensors.append(TensorEntry(tensor.name, dims, int(tensor.tensor_type), bytes(tensor.data.tobytes())))
    return model


def _scalar(vtype: T, value: Any) -> bytes:
    fmt = SCALAR_FORMATS[vtype]
    if fmt in "fd":
        number = float(value) if isinstance(value, (int, float)) else math.nan
        if fmt == "f" and math.isfinite(number) and abs(number) > 3.4e38:
            number = math.copysign(math.inf, number)
        return struct.pack("<" + fmt, number)
    if fmt == "?":
        return struct.pack("<?", bool(value))
    bits = struct.calcsize(fmt) * 8
    number = int(value) if isinstance(value, (int, float)) and math.isfinite(value) else 0
    number %= 1 << bits
    if fmt.islower() and number >= 1 << (bits - 1):
        number -= 1 << bits
    return struct.pack("<" + fmt, number)


def _string(value: Any) -> bytes:
    raw = value if isinstance(value, bytes) else str(value).encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def _value(vtype: T, value: Any, sub: T | None) -> bytes:
    if vtype == T.STRING:
        return _string(value)
    if vtype == T.ARRAY:
        items = list(value)
        body = b"".join(_value(sub, item, None) for item in items)
        return struct.pack("<IQ", int(sub), len(items)) + body
    return _scalar(vtype, value)


def serialize(model: GGUFModel) -> bytes:
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(model.tensors), len(model.kvs)))
    for kv in model.kvs:
        out += _string(kv.key) + struct.pack("<I", int(kv.vtype)) + _value(kv.vtype, kv.value, kv.sub)
    position, offsets = 0, []
    for tensor in model.tensors:
        offsets.append(position)
        position += -(-len(tensor.data) // ALIGNMENT) * ALIGNMENT
    for index, tensor in enumerate(model.tensors):
        n_dims = model.n_dims_override.get(index, len(tensor.dims))
        dims = (tensor.dims + [1] * n_dims)[:n_dims]
        offset = offsets[index] if tensor.offset is None else tensor.offset
        out += _string(tensor.name) + struct.pack("<I", n_dims) + struct.pack(f"<{n_dims}Q", *[d % (1 << 64) for d in dims])
        out += struct.pack("<IQ", tensor.qtype % (1 << 32), offset % (1 << 64))
    out += b"\x00" * (-len(out) % ALIGNMENT)
    for tensor in model.tensors:
        out += tensor.data + b"\x00" * (-len(tensor.data) % ALIGNMENT)
    return bytes(out)


# ---- mutations -------------------------------------------------------------------------------------
TYPED_ABSURD = [(T.UINT32, None), (T.INT32, None), (T.UINT64, None), (T.INT64, None), (T.FLOAT32, None),
                (T.STRING, None), (T.BOOL, None), (T.ARRAY, T.INT32), (T.ARRAY, T.STRING), (T.ARRAY, T.FLOAT32)]
EXTRA_KEYS = ["attention.key_length", "attention.value_length", "rope.dimension_count", "rope.scaling.type",
              "rope.scaling.factor", "attention.sliding_window", "vocab_size", "context_length"]
GLOBAL_EXTRA = ["general.alignment", "split.count", "split.no", "tokenizer.ggml.unknown_token_id",
                "tokenizer.ggml.eot_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
                "tokenizer.ggml.scores", "tokenizer.ggml.merges", "tokenizer.ggml.pre", "tokenizer.chat_template"]


def absurd_kv_value(rng: random.Random) -> tuple[T, Any, T | None]:
    vtype, sub = rng.choice(TYPED_ABSURD)
    if vtype == T.STRING:
        return vtype, rng.choice([b"", b"x", b"\xff\xfe", b"yarn", b"linear", b"none", b"../x"]), None
    if vtype == T.BOOL:
        return vtype, rng.random() < 0.5, None
    if vtype == T.ARRAY:
        if sub == T.STRING:
            return vtype, rng.choice([[b"a"], [b"\xff"], [b"a b", b"x"]]), sub
        return vtype, rng.choice([[1, 2], [0], [2**31 - 1] * 3]), sub
    if vtype == T.FLOAT32:
        return vtype, rng.choice(NUMBERS), None
    return vtype, rng.choice([n for n in NUMBERS if isinstance(n, int)]), None


def mutate_kv(model: GGUFModel, rng: random.Random) -> str:
    arch = model.kv("general.architecture").value.decode()
    roll = rng.random()
    if roll < 0.15:
        kv = rng.choice(model.kvs)
        model.kvs.remove(kv)
        return f"delete {kv.key}"
    if roll < 0.35:
        key = rng.choice([f"{arch}.{k}" for k in EXTRA_KEYS] + GLOBAL_EXTRA)
        if model.kv(key) is None:
            vtype, value, sub = absurd_kv_value(rng)
            if key == "general.alignment" and rng.random() < 0.7:
                vtype, value, sub = T.UINT32, rng.choice([0, 1, 3, 16, 64, 1 << 20]), None
            model.kvs.append(KV(key, vtype, value, sub))
            return f"add {key} = {vtype.name} {value!r:.60}"
    hyper = [kv for kv in model.kvs if kv.key.startswith(arch + ".") or kv.key.startswith("tokenizer.")]
    kv = rng.choice(hyper if hyper and rng.random() < 0.8 else model.kvs)
    if kv.vtype == T.ARRAY and rng.random() < 0.5:
        return _mutate_array(kv, rng)
    if rng.random() < 0.5 and kv.vtype in SCALAR_FORMATS:  # same type, absurd value
        kv.value = rng.choice([n for n in NUMBERS if kv.vtype in (T.FLOAT32, T.FLOAT64) or isinstance(n, int)])
        return f"set {kv.key} = {kv.value!r}"
    kv.vtype, kv.value, kv.sub = absurd_kv_value(rng)
    return f"set {kv.key} = {kv.vtype.name} {kv.value!r:.60}"


def _mutate_array(kv: KV, rng: random.Random) -> str:
    items = kv.value
    roll = rng.random()
    if roll < 0.25:
        kv.value = items[: len(items) // 2]
        return f"truncate array {kv.key} to {len(kv.value)}"
    if roll < 0.35:
        kv.value = []
        return f"empty array {kv.key}"
    if roll < 0.5:
        kv.sub = T.INT32 if kv.sub == T.STRING else T.STRING
        kv.value = [1] * len(items) if kv.sub == T.INT32 else [b"x"] * len(items)
        return f"array {kv.key} as {kv.sub.name}"
    index = rng.randrange(len(items)) if items else 0
    if not items:
        return "empty array (unchanged)"
    if kv.sub == T.STRING:
        items[index] = rng.choice([b"\xff", b"", b"abc", b"a  b", b" ", b"zz qq", items[index] + b"\xc3"])
    else:
        items[index] = rng.choice(NUMBERS)
    return f"{kv.key}[{index}] = {items[index]!r:.40}"


def mutate_table(model: GGUFModel, rng: random.Random) -> str:
    """Tensor-table damage with the data left where it is: dims, type, offsets, n_dims."""
    index = rng.randrange(len(model.tensors))
    tensor = model.tensors[index]
    roll = rng.randrange(6)
    if roll == 0:
        axis = rng.randrange(len(tensor.dims))
        tensor.dims[axis] = rng.choice([0, 1, tensor.dims[axis] - 1, tensor.dims[axis] + 1, 2**40, 2**63])
        return f"{tensor.name}: dims -> {tensor.dims}"
    if roll == 1:
        tensor.qtype = rng.choice([99, 4, 5, int(Q.F32), int(Q.F16), int(Q.Q4_0), int(Q.Q4_K), 1 << 31])
        return f"{tensor.name}: type -> {tensor.qtype}"
    if roll == 2:
        other = rng.randrange(len(model.tensors))
        laid = _layout(model)
        tensor.offset, model.tensors[other].offset = laid[other], laid[index]
        return f"{tensor.name}: offset swapped with tensor {other}"
    if roll == 3:
        laid = _layout(model)[index]
        tensor.offset = rng.choice([0, laid + 1, laid + 16, laid - ALIGNMENT, 2**40, 2**64 - 1])
        return f"{tensor.name}: offset -> {tensor.offset}"
    if roll == 4:
        for entry in model.tensors:
            entry.offset = 0
        return "every offset 0"
    model.n_dims_override[index] = rng.choice([0, 1, 3, 4, 5, 1 << 20])
    return f"{tensor.name}: n_dims -> {model.n_dims_override[index]}"


def _layout(model: GGUFModel) -> list[int]:
    position, offsets = 0, []
    for tensor in model.tensors:
        offsets.append(position)
        position += -(-len(tensor.data) // ALIGNMENT) * ALIGNMENT
    return offsets


def mutate_tensors(model: GGUFModel, rng: random.Random) -> str:
    """Consistent files whose tensors contradict the config: dropped, extra, reshaped."""
    index = rng.randrange(len(model.tensors))
    tensor = model.tensors[index]
    roll = rng.randrange(5)
    block, type_bytes = GGML_QUANT_SIZES[Q(tensor.qtype)]
    row_bytes = tensor.dims[0] // block * type_bytes
    if roll == 0:
        del model.tensors[index]
        return f"drop {tensor.name}"
    if roll == 1:
        layer = rng.choice([7, 99, 2, 1 << 20])
        name = rng.choice([f"blk.{layer}.attn_q.weight", "blk.0.mystery.weight", "output.weight", "rope_freqs.weight"])
        if any(t.name == name for t in model.tensors):
            name = f"blk.{layer}.attn_k.weight"
        model.tensors.append(TensorEntry(name, list(tensor.dims), tensor.qtype, tensor.data))
        return f"add {name} shaped like {tensor.name}"
    if roll == 2 and len(tensor.dims) == 2 and tensor.dims[1] > 1:  # one row short
        tensor.dims[1] -= 1
        tensor.data = tensor.data[: row_bytes * tensor.dims[1]]
        return f"{tensor.name}: one row short -> {tensor.dims}"
    if roll == 3 and len(tensor.dims) == 2:  # flattened to 1-D
        tensor.dims = [tensor.dims[0] * tensor.dims[1]]
        return f"{tensor.name}: flattened to {tensor.dims}"
    if len(tensor.dims) == 2 and tensor.qtype in (int(Q.F32), int(Q.F16)) and tensor.dims[0] > 1:  # one column short
        itemsize = 4 if tensor.qtype == int(Q.F32) else 2
        rows = [tensor.data[r * row_bytes:(r + 1) * row_bytes][:-itemsize] for r in range(tensor.dims[1])]
        tensor.dims[0] -= 1
        tensor.data = b"".join(rows)
        return f"{tensor.name}: one column short -> {tensor.dims}"
    del model.tensors[index]
    return f"drop {tensor.name}"
