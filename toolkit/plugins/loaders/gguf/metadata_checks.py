"""Types and ranges of the GGUF metadata the config is read from, checked under llama.cpp's key names.

Run before the metadata is translated into Hugging Face vocabulary, so an error names the GGUF key
the user can see with ``toolkit inspect`` (``llama.block_count``, not ``num_hidden_layers``).
The shared core checks (``toolkit.core.config_checks``) then run on the translated config too.
"""
from __future__ import annotations

from toolkit.core import validate as v

from .metadata import Metadata

# "{arch}.<suffix>" -> (minimum, maximum) of integer hyperparameters
INT_KEYS: dict[str, tuple[int, int]] = {
    "context_length": (1, v.MAX_POSITIONS), "block_count": (1, v.MAX_LAYERS),
    "embedding_length": (1, v.MAX_SIZE), "feed_forward_length": (1, v.MAX_SIZE),
    "attention.head_count": (1, v.MAX_HEADS), "attention.head_count_kv": (1, v.MAX_HEADS),
    "attention.key_length": (1, 1 << 16), "attention.value_length": (1, 1 << 16),
    "attention.sliding_window": (0, v.MAX_POSITIONS), "rope.dimension_count": (1, 1 << 16),
    "vocab_size": (1, v.MAX_SIZE), "rope.scaling.original_context_length": (1, v.MAX_POSITIONS),
}
# "{arch}.<suffix>" of positive finite numbers
REAL_KEYS = ("attention.layer_norm_rms_epsilon", "rope.freq_base", "rope.scaling.factor")
TEXT_KEYS = ("rope.scaling.type",)
TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "eot_token_id", "padding_token_id", "unknown_token_id")
GLOBAL_INTS = {"split.count": (1, 1 << 16), "split.no": (0, 1 << 16), "split.tensors.count": (0, 1 << 32),
               "general.file_type": (0, 1 << 16)}


def check_hparams(metadata: Metadata, arch: str) -> None:
    """InvalidConfigError naming the file and the GGUF key for a value of the wrong type or range."""
    file = metadata.file
    for suffix, (low, high) in INT_KEYS.items():
        key = f"{arch}.{suffix}"
        if key in metadata:
            v.integer(metadata[key], key=key, file=file, minimum=low, maximum=high)
    for suffix in REAL_KEYS:
        key = f"{arch}.{suffix}"
        if key in metadata:
            v.real(metadata[key], key=key, file=file)
    for suffix in TEXT_KEYS:
        key = f"{arch}.{suffix}"
        if key in metadata:
            v.text(metadata[key], key=key, file=file)
    check_globals(metadata)


def check_globals(metadata: Metadata) -> None:
    """Keys outside ``{arch}.*`` that the checkpoint reads before the tokenizer: split facts, token ids."""
    for key, (low, high) in GLOBAL_INTS.items():
        if key in metadata:
            v.integer(metadata[key], key=key, file=metadata.file, minimum=low, maximum=high)
    for suffix in TOKEN_ID_KEYS:
        key = f"tokenizer.ggml.{suffix}"
        if key in metadata:
            v.integer(metadata[key], key=key, file=metadata.file, minimum=0)
