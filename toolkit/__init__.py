"""toolkit: load any LLM checkpoint format through plugins, shard it, run it.

    import toolkit
    m = toolkit.load("path/to/model")          # safetensors, GGUF, ... detected
    m.generate(m.tokenizer.encode("Hello"), max_new_tokens=20)

``load``, ``LLM`` and the other names load torch on first use, not at ``import toolkit``: commands
that need no model (``toolkit convert`` re-quantizing a file) then start without torch's import.
"""
from .core.openmp import wait_passively_when_imported as _wait_passively_when_imported

_wait_passively_when_imported("torch")  # torch's OpenMP runtime reads its wait policy as it loads (core/openmp.py)

from .core.lazy_package import defer_package_init as _defer_package_init  # noqa: E402

# gguf-py's __init__ star-imports its writer, vocab (sentencepiece) and metadata (yaml) modules,
# ~35 ms of a GGUF load, which reads files only; these names come from their own submodules
# (tests/test_lazy_package.py checks they are the objects the full __init__ binds), any other runs it.
_GGUF_QUICK_NAMES = {name: "constants" for name in ("GGML_QUANT_SIZES", "GGML_QUANT_VERSION", "GGMLQuantizationType",
                                                   "GGUFValueType", "LlamaFileType", "TokenType", "GGUF_MAGIC")}
_GGUF_QUICK_NAMES["GGUFReader"] = "gguf_reader"
_defer_package_init("gguf", quick=_GGUF_QUICK_NAMES)

from .core.errors import ToolkitError  # noqa: E402
from .core.hookspecs import hookimpl  # noqa: E402
from .core.lazy import lazy_attributes as _lazy_attributes  # noqa: E402

_LAZY = {"load": "toolkit.core.api", "LLM": "toolkit.core.engine", "RequestOutput": "toolkit.core.engine",
         "SamplingParams": "toolkit.core.engine", "LoadedModel": "toolkit.core.loaded"}


__getattr__ = _lazy_attributes(__name__, _LAZY)


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["LLM", "LoadedModel", "RequestOutput", "SamplingParams", "ToolkitError", "hookimpl", "load"]
__version__ = "0.1.0"
