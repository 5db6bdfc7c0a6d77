"""Shared fixtures: a tiny random Llama with a real tokenizer, registry isolation, GPU skipping.

Test files may add their own fixtures; these are the ones several files use.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from hf_fixtures import save_hf_model

TOKENIZER_VOCAB = 511  # odd: no tensor-parallel size divides it


def _corpus() -> list[str]:
    """Made-up words from a fixed seed: enough distinct pairs for BPE to fill TOKENIZER_VOCAB."""
    rng = random.Random(0)
    syllables = "ka lo mi ne ru sa to vi pe do ga li mo zu re ta fi bo cha qu".split()
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(400)]
    return [" ".join(rng.choice(words) for _ in range(12)) for _ in range(300)] + [
        "The capital of France is Paris.", "Hello, my name is toolkit."]


def pytest_collection_modifyitems(config, items):
    """``@pytest.mark.gpu`` tests are skipped where there is no CUDA device."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def save_tiny_tokenizer(path: Path, vocab_size: int = TOKENIZER_VOCAB) -> int:
    """A byte-level BPE tokenizer trained on a made-up corpus, saved as a transformers fast tokenizer.
    Returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: PLC0415
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(path)
    return tokenizer.get_vocab_size()


@dataclass(frozen=True)
class TinyModel:
    path: Path
    reference: torch.nn.Module  # the transformers model that wrote ``path`` (fp32, eval)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> TinyModel:
    """A random Llama (hidden 64, 2 layers, 4 heads / 2 KV heads, vocab 511) saved with
    ``save_pretrained``, every parameter randomized, plus a BPE tokenizer covering every id
    (so decoded completions compare meaningfully). Read-only: copy it to modify."""
    path = tmp_path_factory.mktemp("tiny-llama")
    vocab = save_tiny_tokenizer(path)
    reference = save_hf_model(path, "llama", vocab=vocab)
    return TinyModel(path, reference)


@pytest.fixture
def fresh_registry():
    """Forget the cached plugin registry before and after a test that changes plugins or TOOLKIT_* vars."""
    from toolkit.core.registry import reset_default_registry  # noqa: PLC0415

    reset_default_registry()
    yield
    reset_default_registry()


@pytest.fixture
def runtime_with_test_kernels(monkeypatch):
    """The kernel runtime, loaded, with registrations a test adds that end with the test."""
    from toolkit.kernels import runtime  # noqa: PLC0415

    runtime.candidates("rms_norm", "cpu")  # the registry is loaded before it is copied
    monkeypatch.setattr(runtime, "_OPS", {name: list(impls) for name, impls in runtime._OPS.items()})
    monkeypatch.setattr(runtime, "_CANDIDATES", {})
    monkeypatch.setattr(runtime, "_RESOLVED", {})
    return runtime


@pytest.fixture(autouse=True, scope="session")
def _private_tokenizer_cache(tmp_path_factory):
    """Built GGUF tokenizers are cached under a session folder, never the user's cache."""
    import os  # noqa: PLC0415

    previous = os.environ.get("TOOLKIT_TOKENIZER_CACHE")
    os.environ["TOOLKIT_TOKENIZER_CACHE"] = str(tmp_path_factory.mktemp("tokenizer-cache"))
    yield
    if previous is None:
        os.environ.pop("TOOLKIT_TOKENIZER_CACHE", None)
    else:
        os.environ["TOOLKIT_TOKENIZER_CACHE"] = previous
