"""Bad GGUF input fails with a typed error naming what and where, never a crash or a hang."""
from __future__ import annotations

import struct

import pytest
from gguf import GGMLQuantizationType as Q, GGUFReader

import toolkit
from gguf_fixtures import Spec, write_model
from toolkit.core.config import LoadConfig
from toolkit.core.errors import (CorruptFileError, MissingMetadataError, ShardingError, SourceError,
                                 UnknownArchitectureError, UnsupportedQuantTypeError)
from toolkit.core.load import load_local
from toolkit.core.parallel import ParallelContext

TENSOR = "blk.0.attn_q.weight"


@pytest.fixture
def model(tmp_path):
    return write_model(tmp_path / "m.gguf", Spec("llama", Q.Q8_0))


def patch(path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)


def tensor_info_offset(path, name: str) -> tuple[int, int]:
    """Byte positions of a tensor's type field and data-offset field in the tensor-info table."""
    field = next(t.field for t in GGUFReader(path).tensors if t.name == name)
    n_dims = int(field.parts[2][0])
    type_at = field.offset + 8 + len(name.encode()) + 4 + 8 * n_dims
    return type_at, type_at + 4


def test_truncated_inside_tensor_data(model):
    size = model.stat().st_size
    with open(model, "r+b") as handle:
        handle.truncate(size - 1000)
    with pytest.raises(CorruptFileError, match=r"past the end of the file .*truncated") as info:
        toolkit.load(str(model), device="cpu")
    assert info.value.file == str(model) and info.value.tensor


def test_truncated_inside_metadata(model):
    with open(model, "r+b") as handle:
        handle.truncate(2000)  # inside the token list
    with pytest.raises(CorruptFileError, match="past the end of the file") as info:
        toolkit.load(str(model), device="cpu")
    assert info.value.file == str(model)


def test_wrong_magic(model):
    patch(model, 0, b"GGML")
    with pytest.raises(SourceError, match="no loader recognises"):
        toolkit.load(str(model), device="cpu")
    with pytest.raises(CorruptFileError, match=r"wrong magic b'GGML'") as info:
        toolkit.load(str(model), format="gguf", device="cpu")
    assert info.value.file == str(model)


def test_tensor_data_offset_past_end(model):
    _, offset_at = tensor_info_offset(model, TENSOR)
    patch(model, offset_at, struct.pack("<Q", 1 << 40))
    with pytest.raises(CorruptFileError, match="past the end of the file") as info:
        toolkit.load(str(model), device="cpu")
    assert info.value.tensor == TENSOR


def test_counts_that_cannot_fit_fail_fast(model):
    patch(model, 16, struct.pack("<Q", 1 << 50))  # metadata entry count
    with pytest.raises(CorruptFileError, match="more than a"):
        toolkit.load(str(model), device="cpu")


def test_unknown_quant_type(model):
    type_at, _ = tensor_info_offset(model, TENSOR)
    patch(model, type_at, struct.pack("<I", 99))
    with pytest.raises(UnsupportedQuantTypeError, match="unknown GGML tensor type 99") as info:
        toolkit.load(str(model), device="cpu")
    assert info.value.tensor == TENSOR and info.value.file == str(model)


def test_known_type_the_kernels_do_not_run(tmp_path):
    from toolkit.kernels.gguf import is_supported

    qtype = next(t for t in (Q.Q8_K, Q.Q8_1) if not is_supported(int(t)))
    spec = Spec("llama", Q.Q8_0, hidden=256, ffn=512, types={"attn_k": qtype})
    path = write_model(tmp_path / "m.gguf", spec)
    with pytest.raises(UnsupportedQuantTypeError, match=qtype.name) as info:
        toolkit.load(str(path), device="cpu")
    assert info.value.tensor == "blk.0.attn_k.weight"


def test_tensor_parallel_split_that_cuts_a_block(tmp_path):
    """ffn_down has 256 input features = one Q4_K block per row: two ranks would split the block."""
    path = write_model(tmp_path / "m.gguf", Spec("llama", Q.Q4_K, hidden=256, ffn=256))
    with pytest.raises(ShardingError, match="cuts Q4_K blocks") as info:
        load_local(str(path), LoadConfig(), parallel=ParallelContext(tp_rank=0, tp_size=2))
    assert info.value.tensor.endswith("attn_output.weight") or info.value.tensor.endswith("ffn_down.weight")


def test_missing_metadata_key(model):
    data = model.read_bytes().replace(b"llama.block_count", b"llama.xlock_count", 1)
    model.write_bytes(data)
    with pytest.raises(MissingMetadataError, match="'llama.block_count'") as info:
        toolkit.load(str(model), device="cpu")
    assert info.value.file == str(model)


def test_architecture_with_no_plugin(tmp_path):
    path = write_model(tmp_path / "m.gguf", Spec("phi2", Q.Q8_0))
    with pytest.raises(UnknownArchitectureError, match=r"'phi2'.*known architectures: .*llama"):
        toolkit.load(str(path), device="cpu")


def test_not_a_file_at_all(tmp_path):
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(CorruptFileError, match="wrong magic"):
        toolkit.load(str(empty), format="gguf", device="cpu")
