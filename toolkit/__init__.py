"""toolkit: load any LLM checkpoint format through plugins, shard it, run it.

    import toolkit
    m = toolkit.load("path/to/model")          # safetensors, GGUF, ... detected
    m.generate(m.tokenizer.encode("Hello"), max_new_tokens=20)
"""
import sys as _sys

from .core.openmp import passive_waiting as _passive_waiting

if "torch" not in _sys.modules:  # torch's OpenMP runtime reads its wait policy as it loads (core/openmp.py)
    with _passive_waiting():
        import torch  # noqa: F401

from .core.api import load  # noqa: E402
from .core.engine import LLM, RequestOutput, SamplingParams  # noqa: E402
from .core.errors import ToolkitError  # noqa: E402
from .core.hookspecs import hookimpl  # noqa: E402
from .core.loaded import LoadedModel  # noqa: E402

__all__ = ["LLM", "LoadedModel", "RequestOutput", "SamplingParams", "ToolkitError", "hookimpl", "load"]
__version__ = "0.1.0"
