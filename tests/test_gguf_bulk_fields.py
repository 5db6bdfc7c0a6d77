"""Bulk array fields (fields.py) read exactly what gguf-py's own GGUFReader reads, and refuse
what it refuses (a string that is not UTF-8 on its own, even when the bytes around it are)."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter

from toolkit.core.errors import CorruptFileError
from toolkit.plugins.loaders.gguf.fields import NumericArrayField, StringArrayField
from toolkit.plugins.loaders.gguf.metadata import Metadata
from toolkit.plugins.loaders.gguf.reader import open_reader

STRINGS = ["", "a", "▁the", "<0x0A>", "日本語", "", "🙂x", " \t", "é" * 40, ""]


def _write(path, strings, numbers):
    writer = GGUFWriter(str(path), "llama")
    writer.add_array("test.strings", strings)
    writer.add_array("test.empty", [])
    writer.add_array("test.floats", numbers)
    writer.add_array("test.ints", [3, -1, 7])
    writer.add_string("test.single", "x")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_same_values_and_parts_as_gguf_py(tmp_path):
    path = _write(tmp_path / "m.gguf", STRINGS, [0.5, -2.0, 1e-3])
    ours, theirs = open_reader(path).fields, GGUFReader(str(path)).fields
    assert isinstance(ours["test.strings"], StringArrayField)
    assert isinstance(ours["test.floats"], NumericArrayField)
    for key in theirs:
        assert ours[key].contents() == theirs[key].contents(), key
        assert ours[key].types == theirs[key].types, key
    strings = ours["test.strings"]
    assert strings.contents() == STRINGS and strings.contents(6) == "🙂x" and strings.contents(slice(2, 4)) == STRINGS[2:4]
    # gguf-py's per-string parts, made on demand, are the same views gguf-py makes
    assert len(strings.parts) == len(theirs["test.strings"].parts)
    for mine, its in zip(strings.parts, theirs["test.strings"].parts):
        assert bytes(mine) == bytes(its)
    assert [bytes(strings.parts[i]) for i in strings.data] == [s.encode() for s in STRINGS]
    assert Metadata(ours, file=str(path)).length("test.strings") == len(STRINGS)
    assert ours["test.floats"].contents(1) == -2.0


def test_string_cut_inside_a_character_is_refused(tmp_path):
    # "é" is c3 a9: split across two strings the concatenation is valid UTF-8, each half is not
    path = _write(tmp_path / "bad.gguf", ["ok", "é"], [1.0])
    raw = bytearray(path.read_bytes())
    at = raw.index(b"\x02\x00\x00\x00\x00\x00\x00\x00ok")
    raw[at:at + 8 + 2 + 8 + 2] = (b"\x03" + b"\x00" * 7 + b"ok\xc3" + b"\x01" + b"\x00" * 7 + b"\xa9")
    path.write_bytes(bytes(raw))
    with pytest.raises(UnicodeDecodeError):
        GGUFReader(str(path)).fields["test.strings"].contents()  # gguf-py refuses it too
    metadata = Metadata(open_reader(path).fields, file=str(path))
    with pytest.raises(CorruptFileError, match="test.strings"):
        metadata["test.strings"]
    # the check that makes no strings (tokenizer_checks.py) refuses it the same way
    with pytest.raises(CorruptFileError, match="test.strings"):
        metadata.check_decodable("test.strings")
    Metadata(open_reader(_write(tmp_path / "good.gguf", ["ok", "é"], [1.0])).fields, file="g").check_decodable(
        "test.strings")


def test_truncated_string_array_names_the_file(tmp_path):
    path = _write(tmp_path / "t.gguf", ["a" * 50] * 4, [1.0])
    raw = path.read_bytes()
    at = raw.index(b"a" * 50)
    (tmp_path / "cut.gguf").write_bytes(raw[:at + 20])
    with pytest.raises(CorruptFileError, match="cut.gguf"):
        open_reader(tmp_path / "cut.gguf")


def test_numeric_values_view_the_file(tmp_path):
    path = _write(tmp_path / "n.gguf", ["a"], [0.25, 4.0])
    field = open_reader(path).fields["test.floats"]
    assert field.values.dtype == np.float32 and field.values.tolist() == [0.25, 4.0]
    assert bytes(field.value_bytes())[-8:] == np.array([0.25, 4.0], np.float32).tobytes()


def test_tensor_table_and_scalars_match_gguf_py(tmp_path):
    """``FastGGUFReader._get`` slices a plain view of the map, not gguf-py's memmap: the same tensor
    table (names, types, shapes, offsets, bytes) and the same scalar fields, as arrays of the file."""
    from gguf import GGMLQuantizationType as Q

    from gguf_fixtures import Spec, write_model

    path = write_model(tmp_path / "tiny.gguf", Spec("llama", Q.Q4_0, types={"attn_v": Q.Q8_0, "ffn_down": Q.F16}))
    ours, theirs = open_reader(path), GGUFReader(str(path))
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, its in zip(ours.tensors, theirs.tensors):
        assert (mine.tensor_type, mine.n_elements, mine.n_bytes, mine.data_offset) == \
            (its.tensor_type, its.n_elements, its.n_bytes, its.data_offset), its.name
        assert mine.shape.tolist() == its.shape.tolist() and mine.data.shape == its.data.shape, its.name
        assert np.array_equal(np.asarray(mine.data), np.asarray(its.data)), its.name
    scalars = [key for key, field in theirs.fields.items() if len(field.data) == 1]
    assert scalars and ours.data_offset == theirs.data_offset and ours.alignment == theirs.alignment
    for key in scalars:
        assert ours.fields[key].contents() == theirs.fields[key].contents(), key
    assert not isinstance(ours.tensors[0].data, np.memmap)  # the faster path is the one taken
