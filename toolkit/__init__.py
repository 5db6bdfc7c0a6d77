"""toolkit: load any LLM checkpoint format through plugins, shard it, run it.

    import toolkit
    m = toolkit.load("path/to/model")          # safetensors, GGUF, ... detected
    m.generate(m.tokenizer.encode("Hello"), max_new_tokens=20)
"""
from .core.api import load
from .core.engine import LLM, RequestOutput, SamplingParams
from .core.errors import ToolkitError
from .core.hookspecs import hookimpl
from .core.loaded import LoadedModel

__all__ = ["LLM", "LoadedModel", "RequestOutput", "SamplingParams", "ToolkitError", "hookimpl", "load"]
__version__ = "0.1.0"
