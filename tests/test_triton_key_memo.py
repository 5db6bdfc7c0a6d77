"""Triton's compiler key remembered on disk (toolkit/kernels/triton_key_memo.py): the same key as
Triton's own function, read back in a later process, and recomputed when Triton's files change."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from toolkit.kernels.triton_key_memo import fingerprint, remembered_key


def _fake_triton(root):
    for folder, name, text in (("compiler", "compiler.py", "x = 1\n"), ("backends/nvidia", "driver.py", "y = 2\n"),
                               ("language", "core.py", "z = 3\n"), ("_C", "libtriton.so", "\0" * 64),
                               ("runtime", "cache.py", "def triton_key(): ...\n")):
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / name).write_text(text)
    return root


class Counted:
    def __init__(self, key: str) -> None:
        self.key, self.calls = key, 0

    def __call__(self) -> str:
        self.calls += 1
        return self.key


def test_a_key_is_computed_once_then_read_back_until_a_keyed_file_changes(tmp_path):
    triton_dir, store = str(_fake_triton(tmp_path / "triton")), tmp_path / "store"
    compute = Counted("9.9.9-abc-def")
    assert remembered_key(compute, triton_dir, "9.9.9", store) == "9.9.9-abc-def"
    assert remembered_key(compute, triton_dir, "9.9.9", store) == "9.9.9-abc-def"
    assert compute.calls == 1
    assert len(list(store.glob("*.key"))) == 1 and not list(store.glob("*.tmp"))

    # a reinstalled compiler library: another size, so another fingerprint and Triton's own key again
    (tmp_path / "triton" / "_C" / "libtriton.so").write_text("\0" * 65)
    compute.key = "9.9.9-abc-ghi"
    assert remembered_key(compute, triton_dir, "9.9.9", store) == "9.9.9-abc-ghi"
    assert compute.calls == 2

    # a byte-compiled cache appearing does not change the fingerprint (the key hashes sources)
    before = fingerprint(triton_dir, "9.9.9")
    (tmp_path / "triton" / "compiler" / "__pycache__").mkdir()
    (tmp_path / "triton" / "compiler" / "__pycache__" / "compiler.cpython-311.pyc").write_bytes(b"pyc")
    assert fingerprint(triton_dir, "9.9.9") == before
    # a new source file does
    (tmp_path / "triton" / "language" / "extra.py").write_text("w = 4\n")
    assert fingerprint(triton_dir, "9.9.9") != before
    # and so does another Triton version with the same files
    assert fingerprint(triton_dir, "9.9.8") != fingerprint(triton_dir, "9.9.9")


def test_a_foreign_or_unwritable_store_costs_only_the_computation(tmp_path):
    triton_dir, store = str(_fake_triton(tmp_path / "triton")), tmp_path / "store"
    store.mkdir()
    (store / f"{fingerprint(triton_dir, '9.9.9')}.key").write_text("not a key of this version")
    compute = Counted("9.9.9-abc")
    assert remembered_key(compute, triton_dir, "9.9.9", store) == "9.9.9-abc"
    assert compute.calls == 1
    assert (store / f"{fingerprint(triton_dir, '9.9.9')}.key").read_text() == "9.9.9-abc"

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert remembered_key(compute, triton_dir, "9.9.9", blocked) == "9.9.9-abc"  # the store is a file
    assert remembered_key(compute, triton_dir, "9.9.9", blocked) == "9.9.9-abc"
    assert compute.calls == 3
    assert remembered_key(compute, str(tmp_path / "no-triton-here"), "9.9.9", store) == "9.9.9-abc"

    # a key written but not renamed into place (here a folder holds the key's name) leaves no temporary file
    other = tmp_path / "other-store"
    (other / f"{fingerprint(triton_dir, '9.9.9')}.key").mkdir(parents=True)
    assert remembered_key(compute, triton_dir, "9.9.9", other) == "9.9.9-abc"
    assert not list(other.glob("*.tmp"))


needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")


def _run(code: str, cache_dir, **env) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "TOOLKIT_KERNEL_CACHE": str(cache_dir), **env})
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@needs_triton
def test_the_installed_memo_gives_tritons_own_key_and_a_later_process_reads_it_back(tmp_path):
    # first process: the wrapped key equals Triton's own (lru-cached) function's value
    assert _run("""
        from triton.runtime import cache
        own = cache.triton_key
        from toolkit.kernels import triton_key_memo
        assert triton_key_memo.install()
        assert cache.triton_key is not own
        from triton.runtime import autotuner
        assert autotuner.triton_key is cache.triton_key
        print(cache.triton_key() == own())
        """, tmp_path) == "True"
    assert len(list((tmp_path / "triton_key").glob("*.key"))) == 1
    # second process: Triton's function replaced by one that fails, so the key must come from the file
    assert _run("""
        from triton.runtime import cache
        own = cache.triton_key
        def fails():
            raise AssertionError("Triton's key was computed again")
        cache.triton_key = fails
        from toolkit.kernels import triton_key_memo
        assert triton_key_memo.install()
        key = cache.triton_key()
        cache.triton_key = own
        print(key == own())
        """, tmp_path) == "True"


@needs_triton
def test_the_memo_can_be_switched_off(tmp_path):
    assert _run("""
        from triton.runtime import cache
        own = cache.triton_key
        from toolkit.kernels import triton_key_memo
        print(triton_key_memo.install(), cache.triton_key is own)
        """, tmp_path, TOOLKIT_TRITON_KEY_MEMO="0") == "False True"
    assert not (tmp_path / "triton_key").exists()
