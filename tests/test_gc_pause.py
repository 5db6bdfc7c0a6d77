"""The load runs with Python's cyclic garbage collector off, and gives it back as it found it."""
from __future__ import annotations

import gc

import pytest
from gguf import GGMLQuantizationType as Q

import toolkit
from toolkit.core.gc_pause import collector_paused
from gguf_fixtures import Spec, write_model


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_the_collector_is_off_inside_and_on_again_after(collector_on):
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_the_collector_is_on_again_after_an_error(collector_on):
    with pytest.raises(KeyError), collector_paused():
        raise KeyError("boom")
    assert gc.isenabled()


def test_a_collector_the_caller_turned_off_stays_off(collector_on):
    gc.disable()
    with collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_a_load_runs_with_the_collector_off_and_restores_it(collector_on, tmp_path):
    path = write_model(tmp_path / "tiny-q8.gguf", Spec(qtype=Q.Q8_0))
    seen = set()
    toolkit.load(str(path), device="cpu", progress=lambda done, total, name: seen.add(gc.isenabled()))
    assert seen == {False}
    assert gc.isenabled()


def test_a_failed_load_restores_the_collector(collector_on, tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 8)
    with pytest.raises(toolkit.ToolkitError):
        toolkit.load(str(broken), device="cpu", format="gguf")
    assert gc.isenabled()
