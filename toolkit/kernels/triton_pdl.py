"""Programmatic dependent launch (PDL, Hopper and newer) for the Triton kernels of a decode step.

Why: a decode step is a chain of ~10 small kernels per layer, each waiting for the one before it. Even
replayed from a CUDA graph, every kernel boundary costs its launch, the ramp-up of its first programs and
the first round trip to memory, about a microsecond or two of idle GPU while a 1.5B model's step is ~1 ms
of ~250 kernels. Launched with PDL, a kernel's programs may become resident while the kernel before it
finishes; they block in ``griddepcontrol.wait`` until it has completed and its writes are visible.

The contract of a kernel that takes ``PDL`` (a constexpr, True only when launched with ``launch_pdl``):
- it calls ``wait_for_previous(PDL)`` before it reads anything an earlier kernel wrote and before it
  writes anything (an earlier kernel may still read it); only data no kernel writes during this step may
  be read before the wait: weights, and in the KV cache the positions written by earlier steps (the split
  decode attention loads its first tile of those before it waits, the new token's K/V after);
- the wait also lets the next kernel start launching (``griddepcontrol.launch_dependents``), after the
  wait, not before, so that at most two kernels overlap: the next one's programs are placed as this
  one's last programs run. The GGUF matmuls read their first weights before their wait, so launching them
  early pays; whether they let the next kernel in early was measured per kernel (H100, batch-1 decode,
  docs/benchmarks.md). The tensor-core matmuls (2+ tokens) and the Triton GEMV (``triton_gemv_tokens``) do not:
  a kernel placed early beside them waits through their whole run (all GEMVs letting the next in once made
  batch-1 decode 13-18% slower; the Triton GEMV alone now: the 1.5B Q4_0 -7%). The Gluon one-token GEMVs do
  (``GLUON_GEMV_EARLY_LAUNCH``): 8B Q4_K_M +1.1%, 1.5B Q4_K_M +1.5%, the Q4_0 file (none of them) even.
``launch_options(device)`` gives both keyword arguments of a launch; they are off on a CPU (the Triton
interpreter has no ``griddepcontrol``), before sm_90, and with ``TOOLKIT_PDL=0``.
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

try:  # Triton >= 3.3
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    HAVE_GDC = True
except ImportError:  # pragma: no cover - older Triton: launch_options never turns PDL on
    gdc_launch_dependents = gdc_wait = None
    HAVE_GDC = False


# TOOLKIT_PDL_EARLY=0: no kernel lets the next one launch before it exits (read when this module is imported;
# measured on an H100 against the default in docs/benchmarks.md).
EARLY_LAUNCH = tl.constexpr(os.environ.get("TOOLKIT_PDL_EARLY", "1") != "0")
# TOOLKIT_PDL_GEMV_EARLY=0: the Gluon one-token GEMVs keep the next kernel out until they exit, as the other matmuls
# do; =all: the Triton GEMV (triton_gemv_tokens) lets it in early too; anything else (default): the Gluon GEMVs only.
# Read when this module is imported (A/B in fresh processes).
_GEMV_EARLY = os.environ.get("TOOLKIT_PDL_GEMV_EARLY", "gluon")
GLUON_GEMV_EARLY_LAUNCH = tl.constexpr(EARLY_LAUNCH.value and _GEMV_EARLY != "0")
TRITON_GEMV_EARLY_LAUNCH = tl.constexpr(EARLY_LAUNCH.value and _GEMV_EARLY == "all")


@triton.jit
def wait_for_previous(PDL: tl.constexpr, LAUNCH_NEXT: tl.constexpr = True):
    """With ``PDL``: wait until the previous kernel has completed, then (``LAUNCH_NEXT``) let the next one
    launch. A matmul passes ``LAUNCH_NEXT=False`` (the next kernel's programs, placed early, would wait beside it
    for its whole run) or, measured faster, its ``*_EARLY_LAUNCH`` switch."""
    if PDL:
        gdc_wait()
        if LAUNCH_NEXT and EARLY_LAUNCH:
            gdc_launch_dependents()


def pdl_enabled(device: torch.device) -> bool:
    """Whether kernels launched on ``device`` use PDL: CUDA, sm_90 or newer, ``TOOLKIT_PDL`` not ``0`` (read at
    every launch, so a process can compare both)."""
    if device.type != "cuda" or not HAVE_GDC or os.environ.get("TOOLKIT_PDL", "1") == "0":
        return False
    return _capable(torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index))


@functools.lru_cache(maxsize=None)
def _capable(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device)[0] >= 9


def launch_options(device: torch.device) -> dict:
    """The keyword arguments that launch a PDL-taking kernel on ``device``: ``PDL`` and ``launch_pdl``."""
    on = pdl_enabled(device)
    return {"PDL": on, "launch_pdl": on}
