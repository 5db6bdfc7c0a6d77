"""toolkit: load any LLM checkpoint format through plugins, shard it, run it.

    import toolkit
    m = toolkit.load("path/to/model")          # safetensors, GGUF, ... detected
    m.generate(m.tokenizer.encode("Hello"), max_new_tokens=20)
"""
import os as _os
import sys as _sys

# OpenMP's default wait policy spins idle worker threads between parallel regions. On a small
# machine where another process holds a core, a spinning worker and the thread that needs that
# core take turns by scheduler timeslices: on the 2-core dev machine with one core busy, a tiny
# torch.bmm went from 34 us (1 thread) to 5.5-14 ms (2 threads), and Gemma 3 270M decode from
# ~70 to ~700 ms per token. Passive waiting costs a futex wake per region instead (73 ms per token
# at 2 threads in the same conditions). Only a default: it must be set before torch (and its
# OpenMP runtime) loads, and a value the user set wins.
if "torch" not in _sys.modules:
    _os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .core.api import load  # noqa: E402
from .core.engine import LLM, RequestOutput, SamplingParams  # noqa: E402
from .core.errors import ToolkitError  # noqa: E402
from .core.hookspecs import hookimpl  # noqa: E402
from .core.loaded import LoadedModel  # noqa: E402

__all__ = ["LLM", "LoadedModel", "RequestOutput", "SamplingParams", "ToolkitError", "hookimpl", "load"]
__version__ = "0.1.0"
