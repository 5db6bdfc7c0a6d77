"""The kept index of a large GGUF string array: reused only when the file's own bytes prove it.

The expected strings come from gguf-py's own ``GGUFReader`` (one element at a time), never from
the index under test."""
from __future__ import annotations

import os

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter

from toolkit.plugins.loaders.gguf import string_index
from toolkit.plugins.loaders.gguf.reader import FastGGUFReader, open_reader

KEY = "test.strings"
COUNT = string_index.MIN_STRINGS + 17


def _strings(seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    alphabet = list("abcxyz \n\u2581\u00e9\u65e5\U0001f600")
    return ["".join(rng.choice(alphabet, size=int(n))) for n in rng.integers(0, 12, size=COUNT)]


def _write(path, strings: list[str]):
    writer = GGUFWriter(str(path), "llama")
    writer.add_array(KEY, strings)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


_READ: dict[bytes, list[str]] = {}  # gguf-py is slow on 8k strings: each distinct file is read once


def _gguf_py_strings(path) -> list[str]:
    content = path.read_bytes()
    if content not in _READ:
        field = GGUFReader(str(path)).fields[KEY]
        _READ[content] = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    return _READ[content]


def _entries(root) -> list:
    return sorted((root / string_index.FOLDER).glob("*")) if (root / string_index.FOLDER).exists() else []


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("TOOLKIT_TOKENIZER_CACHE", str(root))
    return root


def _no_scan(monkeypatch):
    def scanned(self, start, count):
        raise AssertionError("scanned")

    monkeypatch.setattr(FastGGUFReader, "_scan_string_starts", scanned)


def test_the_second_open_reuses_the_index(tmp_path, cache, monkeypatch):
    path = _write(tmp_path / "a.gguf", _strings(0))
    expected = _gguf_py_strings(path)
    assert open_reader(path).fields[KEY].contents() == expected
    (entry,) = _entries(cache)
    assert entry.suffix == ".npy"
    with monkeypatch.context() as patch:
        _no_scan(patch)
        assert open_reader(path).fields[KEY].contents() == expected  # from the index, proven


@pytest.mark.parametrize("damage", ["shifted", "garbage", "truncated", "wrong_length", "other_file"])
def test_a_stale_or_damaged_index_is_never_trusted(tmp_path, cache, monkeypatch, damage):
    path = _write(tmp_path / "a.gguf", _strings(1))
    expected = _gguf_py_strings(path)
    open_reader(path)
    (entry,) = _entries(cache)
    starts = np.load(entry)
    if damage == "shifted":  # one string one byte longer, the next one shorter: every start but one right
        starts[COUNT // 2] += 1
        np.save(entry, starts)
    elif damage == "garbage":
        entry.write_bytes(b"not an npy file")
    elif damage == "truncated":
        entry.write_bytes(entry.read_bytes()[:100])
    elif damage == "wrong_length":
        np.save(entry, starts[:-1])
    else:  # rewritten in place with the same size and modification time: two neighbours swapped
        stat = os.stat(path)
        strings = _strings(1)
        i = next(i for i in range(COUNT - 1) if len(strings[i].encode()) != len(strings[i + 1].encode()))
        strings[i], strings[i + 1] = strings[i + 1], strings[i]
        _write(path, strings)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        assert os.stat(path).st_size == stat.st_size
        expected = _gguf_py_strings(path)
        assert expected == strings
    assert open_reader(path).fields[KEY].contents() == expected  # scanned again, right
    # and the index was rewritten, so the next open needs no scan
    with monkeypatch.context() as patch:
        _no_scan(patch)
        assert open_reader(path).fields[KEY].contents() == expected


def test_prove_accepts_only_the_exact_chain(tmp_path, cache):
    path = _write(tmp_path / "a.gguf", _strings(2))
    reader = open_reader(path)
    field = reader.fields[KEY]
    raw, starts = reader._bytes(), field._starts.copy()  # noqa: SLF001
    start = int(starts[0]) - 8
    assert string_index.prove(raw, start, starts) == field.span[1]
    for index in (0, 1, COUNT // 3, COUNT - 1):
        for delta in (-1, 1):
            bad = starts.copy()
            bad[index] += delta
            assert string_index.prove(raw, start, bad) is None
    # a shorter chain is a chain too (of that many strings: load() also checks the count)
    assert string_index.prove(raw, start, starts[:-1]) == int(starts[-1]) - 8
    assert string_index.prove(raw, start + 1, starts) is None
    huge = starts.copy()
    huge[-1] = len(raw) - 4  # a "length" read from the file's last bytes
    assert string_index.prove(raw, start, huge) is None


def test_no_index_without_a_cache_or_for_small_arrays(tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLKIT_TOKENIZER_CACHE", "off")
    path = _write(tmp_path / "a.gguf", _strings(3))
    assert open_reader(path).fields[KEY].contents() == _gguf_py_strings(path)
    root = tmp_path / "cache"
    monkeypatch.setenv("TOOLKIT_TOKENIZER_CACHE", str(root))
    small = _write(tmp_path / "small.gguf", _strings(3)[: string_index.MIN_STRINGS - 1])
    assert open_reader(small).fields[KEY].contents() == _gguf_py_strings(small)
    assert _entries(root) == []
