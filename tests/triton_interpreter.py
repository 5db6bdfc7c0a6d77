"""Shared by the test files that run Triton kernels in Triton's interpreter on the CPU.

The interpreter switch (``TRITON_INTERPRET=1``) is read when ``@triton.jit`` decorates, so a file
whose process imported Triton compiled earlier (a run of several files) cannot interpret its
kernels; it then reruns itself in a fresh process with the switch on (``rerun_in_fresh_process``).
The files that compile kernels for a GPU ahead of time do the opposite: a fresh process with the
switch off (``compile_in_fresh_process``).
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest


def rerun_in_fresh_process(path: str) -> None:
    """Run the test file ``path`` with the interpreter on; every test but the one calling this must pass."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", path],
                          capture_output=True, text=True, env=env, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"\d+ passed, 1 skipped(, \d+ warnings?)? in .*", summary), done.stdout[-1000:]  # all but the caller ran


def compile_in_fresh_process(script: str):
    """Run ``script`` (Python printing JSON on its last line) in a fresh process without the interpreter
    switch, so Triton compiles for real; that JSON, decoded."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def ptx_loop(ptx: str) -> list[str]:
    """The lines of the longest labelled region of ``ptx`` that branches back to its own label: a kernel's main
    loop, for tests that read what the compiler made of it."""
    lines, best = [line.strip() for line in ptx.splitlines()], []
    for start, line in enumerate(lines):
        label = re.match(r"(\$L__BB\d+_\d+):", line)
        if label:
            back = re.compile(r"\bbra(\.uni)?\s+" + re.escape(label.group(1)) + ";")
            end = next((i for i in range(start + 1, len(lines)) if back.search(lines[i])), None)
            if end is not None and end - start > len(best):
                best = lines[start:end + 1]
    return best


def fix_loop_bounds() -> None:
    """Let Triton 3.6's interpreter take a loop bound from a kernel argument under numpy >= 2.4: it
    calls ``int()`` on a one-element array, which numpy now rejects; this makes that conversion take
    the array's single element (the interpreter only; compiled kernels never run this code)."""
    from triton.runtime import interpreter  # noqa: PLC0415

    original = interpreter._patch_lang_tensor
    if getattr(original, "index_fixed", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched.index_fixed = True
    interpreter._patch_lang_tensor = patched


def start_interpreter(gpu_tests: str) -> bool:
    """The prologue of an interpreter test file, called before anything imports Triton: skips the file
    where Triton is missing or CUDA is present (``gpu_tests`` names the file that checks the compiled
    kernels there), turns the interpreter on if Triton is not imported yet, and returns whether it is
    on (with ``fix_loop_bounds`` applied). A file whose process imported Triton compiled gets False:
    its ``rerun_in_fresh_process`` test then runs it again."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed", allow_module_level=True)
    import torch  # noqa: PLC0415

    if torch.cuda.is_available():
        pytest.skip(f"CUDA present: the compiled kernels are tested by {gpu_tests}", allow_module_level=True)
    if "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    import triton.language.standard  # noqa: PLC0415

    interpreted = type(triton.language.standard.zeros).__name__ == "InterpretedFunction"
    if interpreted:
        fix_loop_bounds()
    return interpreted


# The GGUF and MoE kernel modules in import order: a module's jit functions are bound when it is imported,
# so one imported compiled (by an earlier test file) makes every later one in the chain compiled too.
GGUF_CHAIN = ("toolkit.kernels.triton_int8", "toolkit.kernels.triton_reduce", "toolkit.kernels.gguf.triton_words",
              "toolkit.kernels.gguf.triton_dp4a", "toolkit.kernels.gguf.triton_kernels", "toolkit.kernels.gguf.triton_mmq",
              "toolkit.kernels.gguf.triton_dot16", "toolkit.kernels.gguf.dot16_ops", "toolkit.kernels.gguf.gluon_ops",
              "toolkit.kernels.gguf.gluon_gemv_ops",
              "toolkit.kernels.gguf.dp4a_ops",
              "toolkit.kernels.gguf.triton_ops",
              "toolkit.kernels.moe_triton", "toolkit.kernels.gguf_moe.triton_moe")


def interpreted_modules(*names: str) -> list:
    """The modules ``names`` (given in import order), with their kernels running under the interpreter:
    if any jit function one of them defines was bound compiled (an earlier test file imported it), all
    of them are reloaded, in order, so each rebinds the names it imports from the ones before it."""
    import importlib  # noqa: PLC0415

    modules = [importlib.import_module(name) for name in names]

    def compiled(module) -> bool:
        return any(type(value).__name__ == "JITFunction" and value.__module__ == module.__name__
                   for value in vars(module).values())

    if any(compiled(module) for module in modules):
        modules = [importlib.reload(module) for module in modules]
    return modules


def interpreted_gguf_chain() -> None:
    """Make the GGUF and MoE kernel modules run under the interpreter (``interpreted_modules``)."""
    interpreted_modules(*GGUF_CHAIN)


# The fused-op kernel modules in import order (the rounding and split-sum helpers first: the fused kernels call them).
FUSED_CHAIN = ("toolkit.kernels.triton_int8", "toolkit.kernels.triton_reduce", "toolkit.kernels.fused.triton_kernels",
               "toolkit.kernels.fused.ops")


def interpreted_fused_ops():
    """``toolkit.kernels.fused.ops`` with its kernels running under the interpreter (``interpreted_modules``)."""
    return interpreted_modules(*FUSED_CHAIN)[-1]
