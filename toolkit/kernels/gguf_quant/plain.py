"""The compiled CPU quantizer as a plain shared library: numpy in, GGUF block bytes out, no torch.

``quant_cpu.cpp`` built with ``-DTOOLKIT_QUANT_PLAIN`` (OpenMP threads instead of torch's, the
compiler's ``_Float16`` instead of ``c10::Half``, a C entry point for ctypes) with the flags of the
torch extension (native.py): the same encoders, so the same bytes. It exists for callers that
must not pay torch's import (~1.5 s quiet, 5 s on a busy machine): ``toolkit convert`` of one GGUF
file into another (plugins/loaders/gguf/direct.py).

Built on first use with the system C++ compiler into ``$TOOLKIT_KERNEL_CACHE`` (or
``$XDG_CACHE_HOME/toolkit/kernels``, as the torch extensions), under a name keyed by the source,
flags, compiler version and CPU flags (``-march=native``), written under a temporary name and
renamed, so concurrent first uses never load a half-written file. Threads: OpenMP's
(``OMP_NUM_THREADS``; all cores by default). Importing this module imports no torch (a test checks).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

from toolkit.core.openmp import passive_waiting
from toolkit.kernels.cache_root import kernel_cache_root

HERE = Path(__file__).parent
SOURCE = HERE / "quant_cpu.cpp"
# the torch extension's flags (gguf_cpu/build.py CFLAGS, native.py's -ffp-contract=off, -fopenmp)
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC",
         "-std=c++17", "-DTOOLKIT_QUANT_PLAIN")
# GGMLQuantizationType number -> (elements, bytes) per block, for the types quant_cpu.cpp encodes
BLOCKS = {2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 12: (256, 144), 13: (256, 176),
          14: (256, 210)}

_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_failure: str | None = None


def _compiler() -> str:
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or "c++"


def _key(compiler: str) -> str:
    digest = hashlib.sha256(SOURCE.read_bytes())
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        version = compiler
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next((line for line in info if line.startswith(("flags", "Features"))), "")
    except OSError:
        cpu = platform.processor()
    for part in (" ".join(FLAGS), version, cpu, platform.machine()):
        digest.update(part.encode())
    return digest.hexdigest()[:16]


def _build() -> Path:
    compiler = _compiler()
    directory = kernel_cache_root() / f"toolkit_gguf_quant_plain_{_key(compiler)}"
    target = directory / "toolkit_gguf_quant_plain.so"
    if target.is_file():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    print(f"toolkit: compiling the CPU quantizer for this machine (once; cached in {directory})",
          file=sys.stderr, flush=True)
    handle, partial = tempfile.mkstemp(dir=directory, suffix=".so.partial")
    os.close(handle)
    try:
        done = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", partial], capture_output=True, text=True,
                              timeout=600)
        if done.returncode:
            raise RuntimeError((done.stderr.strip().splitlines() or [f"{compiler} failed"])[-1])
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


def library() -> ctypes.CDLL | None:
    """The loaded library, built on first use; None when it cannot be built (``failure()`` says why)."""
    global _library, _failure
    with _lock:
        if _library is None and _failure is None:
            try:
                path = _build()
                with passive_waiting():  # its OpenMP runtime reads the wait policy as it loads (core/openmp.py)
                    lib = ctypes.CDLL(str(path))
                lib.toolkit_gguf_quantize.restype = ctypes.c_int
                lib.toolkit_gguf_quantize.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
                _library = lib
            except Exception as error:  # noqa: BLE001 - no compiler, no OpenMP...: callers take the torch path
                _failure = f"{type(error).__name__}: {str(error)[:200]}"
    return _library


def failure() -> str | None:
    return _failure


def quantize_rows(values: np.ndarray, qtype: int) -> tuple[np.ndarray, bool]:
    """float32 [rows, cols] (cols whole blocks of ``qtype``) -> (uint8 [rows, cols / block * type size],
    whether every value was finite). Raises RuntimeError when the library is unavailable."""
    lib = library()
    if lib is None:
        raise RuntimeError(f"the plain CPU quantizer is unavailable ({_failure})")
    elements, size = BLOCKS[int(qtype)]
    values = np.ascontiguousarray(values, dtype=np.float32)
    rows, cols = values.shape
    if cols % elements:
        raise ValueError(f"rows of {cols} are not whole blocks of {elements}")
    out = np.empty((rows, cols // elements * size), dtype=np.uint8)
    status = lib.toolkit_gguf_quantize(values.ctypes.data, out.ctypes.data, values.size // elements, int(qtype))
    if status < 0:
        raise ValueError(f"type {qtype} is not one the CPU quantizer encodes")
    return out, bool(status)
