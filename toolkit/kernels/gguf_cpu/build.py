"""Compile the CPU GGUF kernels (``gguf_cpu.cpp``) once per machine and cache the result.

``extension()`` returns the compiled module, or ``None`` after one warning when it cannot be
built (no compiler, no ninja, a compile error): callers then fall back to the torch path.

The build uses ``torch.utils.cpp_extension.load`` (needs ``ninja``) with ``-O3 -march=native``.
Because ``-march=native`` bakes the build machine's instruction set into the binary, the cache
directory is keyed by a hash of the sources, the flags, the compiler's version, the CPU's
feature flags and the torch version: a different CPU (or compiler, or source) builds its own
copy instead of loading one that might use instructions it lacks. The cache lives under
``$TOOLKIT_KERNEL_CACHE`` or ``$XDG_CACHE_HOME/toolkit/kernels`` (``~/.cache/toolkit/kernels``).
"""
from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import threading
import warnings
from pathlib import Path

HERE = Path(__file__).parent
SOURCES = [HERE / "gguf_cpu.cpp"]
HEADERS = [HERE / "blocks.h", HERE / "fused.h"]
CFLAGS = ["-O3", "-march=native", "-fno-math-errno"]
_UNSET = object()
_state = {"module": _UNSET}
_lock = threading.Lock()


def cache_root() -> Path:
    if os.environ.get("TOOLKIT_KERNEL_CACHE"):
        return Path(os.environ["TOOLKIT_KERNEL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "toolkit" / "kernels"


def _compiler_version() -> str:
    compiler = os.environ.get("CXX") or shutil.which("c++") or "c++"
    try:
        return subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return compiler


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            return next((line for line in info if line.startswith(("flags", "Features"))), "")
    except OSError:
        return platform.processor()


def build_key(sources=None) -> str:
    """Hash of everything the binary depends on (see the module docstring)."""
    import torch  # noqa: PLC0415

    digest = hashlib.sha256()
    for path in (sources or SOURCES) + HEADERS:
        digest.update(Path(path).read_bytes())
    for part in (" ".join(CFLAGS), _compiler_version(), _cpu_flags(), torch.__version__, platform.machine()):
        digest.update(part.encode())
    return digest.hexdigest()[:16]


def compile_extension(sources=None):
    """Build (or load the cached build of) ``sources``; raises whatever the build raises."""
    from torch.utils import cpp_extension  # noqa: PLC0415

    sources = [str(path) for path in (sources or SOURCES)]
    name = f"toolkit_gguf_cpu_{build_key(sources)}"
    directory = cache_root() / name
    directory.mkdir(parents=True, exist_ok=True)
    if not (directory / f"{name}.so").exists():  # a first build takes ~20-60 s: say why the wait
        print(f"toolkit: compiling the CPU GGUF kernels for this machine (once; cached in {directory})",
              file=sys.stderr, flush=True)
    return cpp_extension.load(name=name, sources=sources, extra_cflags=CFLAGS, extra_include_paths=[str(HERE)],
                              build_directory=str(directory), verbose=False)


def extension():
    """The compiled module, built on first use; ``None`` (after one warning) if it cannot be built."""
    if _state["module"] is _UNSET:
        with _lock:
            if _state["module"] is _UNSET:
                try:
                    _state["module"] = compile_extension()
                except Exception as error:  # noqa: BLE001 - any build failure means: use the torch path
                    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
                    warnings.warn(f"toolkit: compiled CPU GGUF kernels unavailable ({first[:200]}); "
                                  f"using the slower torch dequantize-then-matmul path", RuntimeWarning, stacklevel=2)
                    _state["module"] = None
    return _state["module"]


def reset() -> None:
    """Forget the loaded module (tests use this to force a rebuild or a failure)."""
    _state["module"] = _UNSET
