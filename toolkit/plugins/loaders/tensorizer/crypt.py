"""Keys for tensorizer's optional encryption (libsodium through libnacl).

A ``str`` key is a passphrase (tensorizer derives the key with Argon2id and stores the salt
in the file); ``bytes`` is a raw 32-byte key. ``toolkit.load`` cannot pass loader options,
so reading takes the key from the environment: ``TOOLKIT_TENSORIZER_KEY`` (passphrase) or
``TOOLKIT_TENSORIZER_KEY_FILE`` (a file holding the raw key); ``TOOLKIT_TENSORIZER_VERIFY_HASH=1``
turns on tensorizer's per-tensor hash verification.
"""
from __future__ import annotations

import os
from pathlib import Path

from toolkit.core.errors import CheckpointError, ConversionError

KEY_ENV, KEY_FILE_ENV, VERIFY_ENV = "TOOLKIT_TENSORIZER_KEY", "TOOLKIT_TENSORIZER_KEY_FILE", \
    "TOOLKIT_TENSORIZER_VERIFY_HASH"

Key = str | bytes


def encryption_params(key: Key | None):
    """tensorizer EncryptionParams for ``key`` (None: no encryption)."""
    if key is None:
        return None
    from tensorizer import EncryptionParams  # noqa: PLC0415 - optional dependency

    try:
        return EncryptionParams(key) if isinstance(key, bytes) else EncryptionParams.from_string(key)
    except (RuntimeError, ValueError) as exc:  # libsodium missing, or a key of the wrong size
        raise ConversionError(f"cannot encrypt with tensorizer: {exc}") from exc


def decryption_params(key: Key | None):
    if key is None:
        return None
    from tensorizer import DecryptionParams  # noqa: PLC0415 - optional dependency

    try:
        return DecryptionParams.from_key(key) if isinstance(key, bytes) else DecryptionParams.from_string(key)
    except (RuntimeError, ValueError) as exc:
        raise CheckpointError(f"cannot decrypt with tensorizer: {exc}") from exc


def encryption_available() -> bool:
    """Whether tensorizer found a usable libsodium (through libnacl)."""
    try:
        from tensorizer import _crypt  # noqa: PLC0415 - tensorizer's own flag for it
    except ImportError:
        return False
    return bool(getattr(_crypt, "available", False))


def key_from_environment() -> Key | None:
    if os.environ.get(KEY_ENV):
        return os.environ[KEY_ENV]
    if os.environ.get(KEY_FILE_ENV):
        return Path(os.environ[KEY_FILE_ENV]).read_bytes()
    return None


def verify_from_environment() -> bool:
    return os.environ.get(VERIFY_ENV, "").strip().lower() in ("1", "true", "yes", "on")
