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

from ...core.openmp import passive_waiting
from ..cache_root import kernel_cache_root

HERE = Path(__file__).parent
SOURCES = [HERE / "gguf_cpu.cpp"]
HEADERS = [HERE / "blocks.h", HERE / "fused.h", HERE / "gemm.h", HERE / "pool.h"]
CFLAGS = ["-O3", "-march=native", "-fno-math-errno"]


def openmp_flags() -> list[str]:
    """``-fopenmp`` where torch's ATen was built with OpenMP (Linux wheels).

    Why: ``at::parallel_for`` is a header template whose threaded path is compiled only under
    ``_OPENMP``; without the flag every kernel here silently ran on one thread. The extension's
    libgomp.so.1 dependency resolves to the copy torch already loaded (same soname), so both share
    one OpenMP runtime and ``torch.set_num_threads`` governs the kernels too."""
    import torch  # noqa: PLC0415

    return ["-fopenmp"] if getattr(torch._C, "has_openmp", False) else []
_UNSET = object()


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


def build_key(sources=None, headers=None, cflags=()) -> str:
    """Hash of everything the binary depends on (see the module docstring)."""
    import torch  # noqa: PLC0415

    digest = hashlib.sha256()
    for path in list(sources or SOURCES) + list(HEADERS if headers is None else headers):
        digest.update(Path(path).read_bytes())
    flags = " ".join(CFLAGS + list(cflags) + openmp_flags())
    for part in (flags, _compiler_version(), _cpu_flags(), torch.__version__, platform.machine()):
        digest.update(part.encode())
    return digest.hexdigest()[:16]


def compile_extension(sources=None, headers=None, prefix: str = "toolkit_gguf_cpu", cflags=()):
    """Build (or load the cached build of) ``sources``; raises whatever the build raises.

    :param cflags: compiler flags this module adds to CFLAGS (e.g. ``-ffp-contract=off`` where
        results must match another implementation's float rounding)"""
    sources = [str(path) for path in (sources or SOURCES)]
    include = sorted({str(Path(path).parent) for path in sources} | {str(HERE)})
    name = f"{prefix}_{build_key(sources, headers, cflags)}"
    directory = kernel_cache_root() / name
    built = _load_built(name, directory / f"{name}.so")
    if built is not None:
        return built
    from torch.utils import cpp_extension  # noqa: PLC0415

    directory.mkdir(parents=True, exist_ok=True)
    if not (directory / f"{name}.so").exists():  # a first build takes ~20-60 s: say why the wait
        print(f"toolkit: compiling the CPU kernels {prefix} for this machine (once; cached in {directory})",
              file=sys.stderr, flush=True)
    with passive_waiting():  # the module's OpenMP runtime reads its wait policy as it loads
        return cpp_extension.load(name=name, sources=sources, extra_cflags=CFLAGS + list(cflags) + openmp_flags(),
                                  extra_ldflags=openmp_flags(), extra_include_paths=include,
                                  build_directory=str(directory), verbose=False)


def _load_built(name: str, path: Path):
    """The cached module at ``path``, imported directly; None when absent or not loadable (then
    ``cpp_extension.load`` builds it). Why: the build key already names everything the binary
    depends on, and ``cpp_extension.load`` on a finished build still imports setuptools and runs
    ninja to check it (~0.3 s per module, paid by every ``toolkit`` command that loads one)."""
    if not path.is_file():
        return None
    import importlib.util  # noqa: PLC0415

    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        with passive_waiting():
            spec.loader.exec_module(module)
    except (ImportError, OSError):  # a half-written or foreign file: let the build sort it out
        return None
    return module


class Extension:
    """One compiled module, built on first ``get()``; ``None`` (after one warning) if it cannot be built.

    Each kernel family (the GGUF GEMV here, the fused decoder-layer ops in ``kernels/cpu_fused``)
    owns one, so a family's sources rebuild only its own module."""

    def __init__(self, prefix: str, sources, headers, what: str, cflags=()):
        self.prefix, self.sources, self.headers, self.what = prefix, list(sources), list(headers), what
        self.cflags = tuple(cflags)
        self.module = _UNSET
        self.lock = threading.Lock()

    def get(self):
        if self.module is _UNSET:
            with self.lock:
                if self.module is _UNSET:
                    try:
                        self.module = compile_extension(self.sources, self.headers, self.prefix, self.cflags)
                    except Exception as error:  # noqa: BLE001 - any build failure means: use the torch path
                        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
                        warnings.warn(f"toolkit: compiled {self.what} unavailable ({first[:200]}); "
                                      f"using the slower torch path", RuntimeWarning, stacklevel=3)
                        self.module = None
        return self.module

    def ready(self) -> bool:
        """Built (on this first call if needed) and usable; cheap once decided (asked per op call)."""
        module = self.module
        if module is _UNSET:
            module = self.get()
        return module is not None

    def reset(self) -> None:
        self.module = _UNSET
        from .. import runtime  # noqa: PLC0415 - supports() answers depend on the module: drop cached ones

        runtime.invalidate()


_GGUF = Extension("toolkit_gguf_cpu", SOURCES, HEADERS, "CPU GGUF kernels")


def extension():
    """The compiled GGUF module, built on first use; ``None`` (after one warning) if it cannot be built."""
    if _GGUF.module is _UNSET:
        _GGUF.sources = SOURCES  # tests patch SOURCES to force a failing build
    return _GGUF.get()


def reset() -> None:
    """Forget the loaded module (tests use this to force a rebuild or a failure)."""
    _GGUF.reset()
