"""Triton's compiler key, remembered on disk for each installed Triton.

Before a process looks up its first kernel in Triton's on-disk cache, Triton computes
``triton.runtime.cache.triton_key()``: a SHA-256 of its frontend, compiler, backends and language
sources and of its compiler library, ``_C/libtriton.so`` (~0.4 GB). On an H100 host that was
0.30-0.37 s of a fresh process's first token, the largest part after Triton's import
(docs/benchmarks.md, "The first token's fixed costs", session 33). The key changes only when those
files do.

``install()`` wraps that function. The wrapped key is read from a file under
``kernel_cache_root()/triton_key/`` named by a fingerprint of every file the key could read (the
path, size, modification time in ns and inode of each file under Triton's ``compiler``,
``backends``, ``language`` and ``_C`` folders and of ``runtime/cache.py``, plus Triton's version
and folder). Any other case (no such file, an unreadable or foreign one, a fingerprint that
cannot be taken) calls Triton's own function and stores what it returns, written under a temporary
name and renamed so a concurrent reader never sees half a key. A reinstalled or edited Triton gets
new modification times, so a new fingerprint and Triton's own key again.

``TOOLKIT_TRITON_KEY_MEMO=0`` leaves Triton's function in place.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Callable

from .cache_root import kernel_cache_root

# Triton's folders (and one file) whose contents triton_key() hashes; a superset is fine: it only
# makes the fingerprint change more often than the key
_KEYED_FOLDERS = ("compiler", "backends", "language", "_C")
_KEYED_FILES = (os.path.join("runtime", "cache.py"),)
_installed = False


def fingerprint(triton_dir: str, version: str) -> str:
    """A digest of the identity (path, size, mtime in ns, inode) of every file ``triton_key()`` may
    read under ``triton_dir``; byte-compiled caches (``__pycache__``) are skipped, as the key reads
    sources. Raises OSError when a folder cannot be listed."""
    digest = hashlib.sha256(f"{version}\0{os.path.realpath(triton_dir)}".encode())
    paths = [os.path.join(triton_dir, name) for name in _KEYED_FILES]
    for folder in _KEYED_FOLDERS:
        top = os.path.join(triton_dir, folder)
        if not os.path.isdir(top):
            continue
        for root, folders, files in os.walk(top, onerror=_raise):
            folders[:] = sorted(name for name in folders if name != "__pycache__")
            paths.extend(os.path.join(root, name) for name in files)
    for path in sorted(paths):
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            digest.update(f"{path}\0missing\n".encode())
            continue
        digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\0{stat.st_ino}\n".encode())
    return digest.hexdigest()


def _raise(error: OSError) -> None:
    raise error


def remembered_key(compute: Callable[[], str], triton_dir: str, version: str, store: Path) -> str:
    """``compute()``'s value, read from ``store`` when a file for this fingerprint holds one (it starts
    with ``version``, as Triton's key does), else computed and written there. A store that cannot be
    read or written costs only the computation."""
    try:
        path = store / f"{fingerprint(triton_dir, version)}.key"
    except OSError:
        return compute()
    try:
        key = path.read_text(encoding="utf-8")
        if key.startswith(version) and len(key) > len(version):
            return key
    except (OSError, UnicodeDecodeError):
        pass
    key = compute()
    temporary = None
    try:
        store.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=store, suffix=".tmp", delete=False) as handle:
            temporary = handle.name
            handle.write(key)
        os.replace(temporary, path)
    except OSError:
        if temporary is not None:  # written but not renamed (a full disk, say): leave no half-made file behind
            with contextlib.suppress(OSError):
                os.unlink(temporary)
    return key


def install() -> bool:
    """Wrap Triton's ``triton_key`` (in ``triton.runtime.cache`` and the autotuner, which imported it by
    name) with ``remembered_key``; once per process. Returns whether the wrapper is in place. Imports
    Triton (the caller is about to import a kernel module, which does)."""
    global _installed
    if _installed:
        return True
    if os.environ.get("TOOLKIT_TRITON_KEY_MEMO") == "0":
        return False
    try:
        import triton  # noqa: PLC0415
        from triton.runtime import autotuner, cache  # noqa: PLC0415
    except Exception:  # noqa: BLE001 - a Triton that fails to import is the kernel import's to report
        return False
    original = getattr(cache, "triton_key", None)
    if not callable(original):  # a Triton whose key lives elsewhere: nothing to wrap
        return False
    original = getattr(original, "__wrapped__", original)  # past functools.lru_cache, to Triton's own function
    triton_dir = os.path.dirname(os.path.abspath(triton.__file__))
    version = str(getattr(triton, "__version__", ""))
    store = kernel_cache_root() / "triton_key"

    @functools.lru_cache(maxsize=None)
    def triton_key() -> str:
        return remembered_key(original, triton_dir, version, store)

    cache.triton_key = triton_key
    if getattr(autotuner, "triton_key", None) is not None:
        autotuner.triton_key = triton_key
    _installed = True
    return True
