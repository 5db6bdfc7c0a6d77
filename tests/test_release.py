"""A load hands its checkpoint to a background thread that closes it and drops it (core/release.py):
the load returns without waiting for that (the file's unmapping), and ``release.wait`` waits."""
from __future__ import annotations

import threading
import weakref

import pytest
from gguf import GGMLQuantizationType as Q

import toolkit
from toolkit.core import release
from toolkit.plugins.loaders.gguf.checkpoint import GGUFCheckpoint
from gguf_fixtures import Spec, write_model


@pytest.fixture
def model_path(tmp_path):
    return write_model(tmp_path / "tiny-q8.gguf", Spec(qtype=Q.Q8_0))


@pytest.fixture
def blocked_close(monkeypatch):
    """GGUFCheckpoint.close waits for ``go`` and records the thread it ran on."""
    go, seen = threading.Event(), []
    original = GGUFCheckpoint.close

    def close(self):
        seen.append(threading.current_thread())
        assert go.wait(10)
        original(self)

    monkeypatch.setattr(GGUFCheckpoint, "close", close)
    yield go, seen
    go.set()
    release.wait()


def test_the_load_returns_while_the_checkpoint_is_still_being_closed(model_path, blocked_close, monkeypatch):
    monkeypatch.delenv("TOOLKIT_BACKGROUND_RELEASE", raising=False)
    go, seen = blocked_close
    loaded = toolkit.load(str(model_path), device="cpu")  # would wait 10 s and fail if close ran here
    assert loaded.model is not None
    assert len(seen) == 1 and seen[0] is not threading.main_thread() and seen[0].daemon
    go.set()
    release.wait()
    assert not seen[0].is_alive()


def test_the_checkpoint_is_dropped_on_the_release_thread(model_path, monkeypatch):
    # its last reference goes there, so whatever it alone keeps mapped is unmapped there
    monkeypatch.delenv("TOOLKIT_BACKGROUND_RELEASE", raising=False)
    dropped_on = []
    original_init = GGUFCheckpoint.__init__

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        weakref.finalize(self, lambda: dropped_on.append(threading.current_thread()))

    monkeypatch.setattr(GGUFCheckpoint, "__init__", init)
    loaded = toolkit.load(str(model_path), device="cpu")
    release.wait()
    assert len(dropped_on) == 1 and dropped_on[0].name == "toolkit-release"
    assert loaded.logits([1, 2, 3]).shape[-1] > 0  # the model owns its weights


def test_switched_off_the_close_runs_before_the_load_returns(model_path, monkeypatch):
    monkeypatch.setenv("TOOLKIT_BACKGROUND_RELEASE", "0")
    seen = []
    original = GGUFCheckpoint.close
    monkeypatch.setattr(GGUFCheckpoint, "close", lambda self: (seen.append(threading.current_thread()),
                                                               original(self)))
    toolkit.load(str(model_path), device="cpu")
    assert seen == [threading.current_thread()]


def test_a_failing_close_is_a_warning_and_the_model_is_still_loaded(model_path, monkeypatch):
    monkeypatch.delenv("TOOLKIT_BACKGROUND_RELEASE", raising=False)

    def broken_close(self):
        raise OSError("disk went away")

    monkeypatch.setattr(GGUFCheckpoint, "close", broken_close)
    with pytest.warns(RuntimeWarning, match="GGUFCheckpoint.*OSError: disk went away"):
        loaded = toolkit.load(str(model_path), device="cpu")
        release.wait()
    assert loaded.model is not None


def test_a_failed_load_still_releases_its_checkpoint(tmp_path, monkeypatch):
    monkeypatch.delenv("TOOLKIT_BACKGROUND_RELEASE", raising=False)
    path = write_model(tmp_path / "tiny.gguf", Spec(qtype=Q.Q8_0))
    closed = []
    original = GGUFCheckpoint.close
    monkeypatch.setattr(GGUFCheckpoint, "close", lambda self: (closed.append(True), original(self)))
    with pytest.raises(toolkit.ToolkitError):
        toolkit.load(str(path), device="cpu", quant="no-such-scheme")
    release.wait()
    assert closed == [True]
