"""A package imported with its ``__init__`` deferred (toolkit/core/lazy_package.py), and gguf-py's."""
from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap

import pytest
from gguf import GGMLQuantizationType as Q

import toolkit
from gguf_fixtures import Spec, write_model
from toolkit.core.lazy_package import defer_package_init


def test_gguf_quick_names_are_the_objects_the_full_init_binds():
    # in a fresh process that imports gguf the usual way (no toolkit): the shortcut's answers must
    # be what gguf's own __init__ binds, for the installed gguf version
    code = textwrap.dedent(f"""
        import importlib, gguf
        wrong = [name for name, sub in {toolkit._GGUF_QUICK_NAMES!r}.items()
                 if getattr(gguf, name) is not getattr(importlib.import_module("gguf." + sub), name)]
        print(wrong)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_a_gguf_load_reads_gguf_without_its_writer_vocab_or_metadata_modules(tmp_path):
    path = write_model(tmp_path / "tiny-q8.gguf", Spec(qtype=Q.Q8_0))
    code = textwrap.dedent(f"""
        import sys, torch, toolkit
        toolkit.load({str(path)!r}, device="cpu")
        print(sorted(m for m in ("gguf.gguf_writer", "gguf.vocab", "gguf.metadata", "yaml") if m in sys.modules))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    """``fakepkg``: ``__init__`` star-imports ``light`` and ``heavy``; importing ``heavy`` is recorded."""
    root = tmp_path / "fakepkg"
    root.mkdir()
    (root / "__init__.py").write_text("from .light import *\nfrom .heavy import *\nINIT_RAN = True\n")
    (root / "light.py").write_text("LIGHT = object()\n_PRIVATE = 1\n")
    (root / "heavy.py").write_text("import sys\nsys.modules['fakepkg_log'].append('heavy')\nHEAVY = 2\n")
    (root / "other.py").write_text("OTHER = 3\n")
    monkeypatch.setitem(sys.modules, "fakepkg_log", [])
    monkeypatch.syspath_prepend(str(tmp_path))
    yield sys.modules["fakepkg_log"]
    for name in [n for n in sys.modules if n == "fakepkg" or n.startswith("fakepkg.")]:
        del sys.modules[name]


def test_quick_names_and_submodules_come_without_the_init(fake_package):
    defer_package_init("fakepkg", quick={"LIGHT": "light"})
    import fakepkg
    from fakepkg import LIGHT, other
    from fakepkg.light import LIGHT as direct

    assert LIGHT is direct and other.OTHER == 3
    assert fake_package == [] and "INIT_RAN" not in vars(fakepkg)
    with pytest.raises(ImportError):  # not a quick name, and not what the __init__ exports
        from fakepkg import _PRIVATE  # noqa: F401
    assert fake_package == ["heavy"]  # ... so asking for it ran the real __init__


def test_any_other_name_runs_the_init_once(fake_package):
    defer_package_init("fakepkg", quick={"LIGHT": "light"})
    import fakepkg

    assert fakepkg.HEAVY == 2 and fakepkg.INIT_RAN and fakepkg.LIGHT is importlib.import_module("fakepkg.light").LIGHT
    with pytest.raises(AttributeError):
        fakepkg.MISSING
    assert fake_package == ["heavy"]


def test_star_import_sees_the_whole_package(fake_package):
    defer_package_init("fakepkg", quick={"LIGHT": "light"})
    namespace: dict = {}
    exec("from fakepkg import *", namespace)
    assert namespace["HEAVY"] == 2 and "LIGHT" in namespace


def test_an_imported_package_is_left_alone(fake_package):
    import fakepkg

    defer_package_init("fakepkg", quick={"LIGHT": "light"})
    assert fakepkg.INIT_RAN and fake_package == ["heavy"]
    assert not any(type(f).__name__ == "_DeferredInit" and f.name == "fakepkg" for f in sys.meta_path)
