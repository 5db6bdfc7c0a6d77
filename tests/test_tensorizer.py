"""Tensorizer: the same per-rank stored state, serialized with tensorizer (optionally encrypted
and hash-verified). Reloads must be bit-identical with identical logits, at tp=1 and tp=2."""
from __future__ import annotations

import pytest
import torch

import toolkit
from test_sharded import PROMPT, assert_same_state, load_bnb_or_skip, stored_parameters, write_tiny_gguf
from toolkit.core.checkpoint import Source
from toolkit.core.config import LoadConfig
from toolkit.core.errors import ConversionError
from toolkit.core.registry import default_registry
from toolkit.plugins.loaders.sharded.errors import ChecksumMismatchError, TensorParallelMismatchError
from toolkit.plugins.loaders.tensorizer import DecryptionError, TensorizerLoader
from toolkit.plugins.loaders.tensorizer.crypt import KEY_ENV, KEY_FILE_ENV, VERIFY_ENV, encryption_available

KEY = bytes(range(32))  # a raw key (fast); passphrases go through Argon2id
needs_libsodium = pytest.mark.skipif(not encryption_available(), reason="tensorizer found no libsodium")


def loader():
    return default_registry().loader("tensorizer")


def save_tensorizer(loaded, dest: str, key=None) -> dict:
    return default_registry().loader("tensorizer").save(loaded, dest, {"encryption_key": key})


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in (KEY_ENV, KEY_FILE_ENV, VERIFY_ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def plain(tiny_llama):
    return toolkit.load(tiny_llama.path, device="cpu")


@pytest.fixture(scope="module")
def plain_state(plain, tmp_path_factory):
    dest = tmp_path_factory.mktemp("tensorizer") / "state"
    save_tensorizer(plain, str(dest))
    return dest


def test_reload_with_hash_verification_is_bit_identical(plain, plain_state, monkeypatch):
    monkeypatch.setenv(VERIFY_ENV, "1")
    reloaded = toolkit.load(plain_state, device="cpu")
    assert reloaded.report.format == "tensorizer"
    assert sorted(p.name for p in plain_state.glob("model-rank-*")) == ["model-rank-0.tensors"]
    assert_same_state(stored_parameters(plain), stored_parameters(reloaded))
    assert torch.equal(plain.logits(PROMPT), reloaded.logits(PROMPT))
    assert reloaded.tokenizer.encode("a tiny test") == plain.tokenizer.encode("a tiny test")


def test_tampered_tensor_fails_hash_verification(plain_state, tmp_path, monkeypatch):
    broken = tmp_path / "broken"
    broken.mkdir()
    for path in plain_state.iterdir():
        (broken / path.name).write_bytes(path.read_bytes())
    data = bytearray((broken / "model-rank-0.tensors").read_bytes())
    data[-100] ^= 0x10  # inside the last tensor's data (the file ends with an 8-byte footer)
    (broken / "model-rank-0.tensors").write_bytes(bytes(data))
    monkeypatch.setenv(VERIFY_ENV, "1")
    with pytest.raises(ChecksumMismatchError, match="hash verification failed.*model-rank-0.tensors"):
        toolkit.load(broken, device="cpu")


@needs_libsodium
def test_encrypted_with_a_raw_key(plain, tmp_path, monkeypatch):
    dest = tmp_path / "secret"
    assert save_tensorizer(plain, str(dest), key=KEY)["encrypted"]
    assert KEY not in (dest / "model-rank-0.tensors").read_bytes()
    with pytest.raises(DecryptionError, match="encrypted.*TOOLKIT_TENSORIZER_KEY"):
        toolkit.load(dest, device="cpu")
    (tmp_path / "wrong.key").write_bytes(bytes(32))
    monkeypatch.setenv(KEY_FILE_ENV, str(tmp_path / "wrong.key"))
    with pytest.raises(DecryptionError, match="cannot decrypt"):
        toolkit.load(dest, device="cpu")
    (tmp_path / "right.key").write_bytes(KEY)
    monkeypatch.setenv(KEY_FILE_ENV, str(tmp_path / "right.key"))
    reloaded = toolkit.load(dest, device="cpu")
    assert_same_state(stored_parameters(plain), stored_parameters(reloaded))


@needs_libsodium
def test_encrypted_with_a_passphrase_through_the_loader_object(plain, tmp_path):
    dest = tmp_path / "secret"
    save_tensorizer(plain, str(dest), key="correct horse battery staple")
    own = TensorizerLoader(key="correct horse battery staple", verify_hash=True)
    checkpoint = own.open(Source(str(dest), dest, tuple(dest.iterdir())), LoadConfig())
    found = {name: tensor for name, _, tensor in checkpoint.read_tensors()}
    expected = {key.rstrip(":"): value for key, value in stored_parameters(plain).items()}
    assert_same_state(expected, found)


def test_interrupted_save_leaves_nothing(plain, tmp_path, monkeypatch):
    from tensorizer import TensorSerializer

    real, calls = TensorSerializer.write_tensor, []

    def fail_midway(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise OSError("disk full (simulated)")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(TensorSerializer, "write_tensor", fail_midway)
    with pytest.raises(OSError, match="disk full"):
        save_tensorizer(plain, str(tmp_path / "state"))
    assert list(tmp_path.iterdir()) == []


def test_unknown_option_is_refused(plain, tmp_path):
    with pytest.raises(ConversionError, match="encryption_key"):
        loader().save(plain, tmp_path / "state", {"key": "x"})


@needs_libsodium
def test_gguf_model_reloads_bit_identical(tmp_path, monkeypatch):
    original = toolkit.load(write_tiny_gguf(tmp_path / "tiny.gguf"), device="cpu")
    save_tensorizer(original, str(tmp_path / "state"), key=KEY)
    (tmp_path / "k").write_bytes(KEY)
    monkeypatch.setenv(KEY_FILE_ENV, str(tmp_path / "k"))
    reloaded = toolkit.load(tmp_path / "state", device="cpu")
    assert reloaded.report.format == "tensorizer" and reloaded.report.scheme == "gguf"
    assert_same_state(stored_parameters(original), stored_parameters(reloaded))
    assert torch.equal(original.logits(PROMPT), reloaded.logits(PROMPT))


def test_bnb_model_reloads_bit_identical(tiny_llama, tmp_path):
    original = load_bnb_or_skip(tiny_llama.path, "bnb-nf4")
    save_tensorizer(original, str(tmp_path / "state"))
    reloaded = toolkit.load(tmp_path / "state", device="cpu")
    assert_same_state(stored_parameters(original), stored_parameters(reloaded))
    assert torch.equal(original.logits(PROMPT), reloaded.logits(PROMPT))


def test_tp2_reload_is_bit_identical_with_identical_logits(tiny_llama, tmp_path):
    dest = tmp_path / "state"
    with toolkit.load(tiny_llama.path, device="cpu", tp=2) as model:
        assert loader().save(model, dest)["tp"] == 2
        states, logits = model.run_all(stored_parameters), model.logits(PROMPT)
    with toolkit.load(dest, device="cpu", tp=2) as reloaded:
        assert reloaded.report.format == "tensorizer"
        for expected, found in zip(states, reloaded.run_all(stored_parameters)):
            assert_same_state(expected, found)
        assert torch.equal(reloaded.logits(PROMPT), logits)
    with pytest.raises(TensorParallelMismatchError, match="saved at tp=2"):
        toolkit.load(dest, device="cpu")
