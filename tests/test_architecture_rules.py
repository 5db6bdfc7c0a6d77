"""The rules that keep the core clean, checked on the source tree.

1. Nothing under core/ imports toolkit.plugins (absolute, relative or by a string handed
   to importlib): plugins reach the core only through entry points.
2. No file under core/ names a file format or quantization scheme. Each checker is also run
   on planted samples, so a checker that matches nothing cannot pass silently.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import toolkit.core

# The installed package's own files (an editable install or a wheel run from a copy of tests/).
CORE = Path(toolkit.core.__file__).resolve().parent
FORBIDDEN_PACKAGE = "toolkit.plugins"

# Formats and schemes that only plugins may name. Letters/digits may not touch a match on
# either side, but "_" and "-" may (so "bnb_4bit" and "Q4_K_M" are caught, "fp48" is not).
_NAMES = ["gguf", "ggml", "ggjt", "bitsandbytes", "bnb", "nf4", "fp4", "int4_weight", "tensorizer", "awq", "gptq",
          "exl2", "marlin", r"iq\d_\w+", r"q\d_[01k]", "q8_0", "fp8_e4m3", "mxfp4"]
FORBIDDEN_NAMES = re.compile(rf"(?<![a-z0-9])(?:{'|'.join(_NAMES)})(?![a-z0-9])", re.IGNORECASE)


def core_files() -> list[Path]:
    return sorted(CORE.rglob("*.py"))


def _module_package(path: Path) -> list[str]:
    """``core/layers/linear.py`` -> ["toolkit", "core", "layers"] (the package the file sits in)."""
    return ["toolkit", "core", *path.relative_to(CORE).parent.parts]


def plugin_imports(source: str, package: list[str]) -> list[str]:
    """Every import in ``source`` that reaches toolkit.plugins (``package``: the file's package)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            targets = [module] + [f"{module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if func in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                targets = [node.args[0].value]
        found += [t for t in targets if t == FORBIDDEN_PACKAGE or t.startswith(FORBIDDEN_PACKAGE + ".")]
    return found


def format_mentions(text: str) -> list[tuple[int, str]]:
    """(line number, matched word) for every format or scheme name in ``text``."""
    return [(number, match.group(0)) for number, line in enumerate(text.splitlines(), start=1)
            for match in FORBIDDEN_NAMES.finditer(line)]


# ---- the checkers catch planted violations ---------------------------------------------------
@pytest.mark.parametrize("source, package", [
    ("import toolkit.plugins.loaders.safetensors", ["toolkit", "core"]),
    ("from toolkit.plugins import models", ["toolkit", "core"]),
    ("from ..plugins.quant import unquantized", ["toolkit", "core"]),
    ("from ...plugins import models", ["toolkit", "core", "layers"]),
    ("from .. import plugins", ["toolkit", "core"]),
    ("import importlib\nimportlib.import_module('toolkit.plugins.models.llama')", ["toolkit", "core"]),
])
def test_import_checker_catches_planted_imports(source, package):
    assert plugin_imports(source, package)


@pytest.mark.parametrize("source, package", [
    ("from ..kernels import runtime", ["toolkit", "core", "layers"]),
    ("from .plugins import PluginSet", ["toolkit", "core"]),  # core/plugins.py, the manager itself
    ("import toolkit.kernels.reference", ["toolkit", "core"]),
    ("from . import registry", ["toolkit", "core"]),
])
def test_import_checker_allows_core_imports(source, package):
    assert plugin_imports(source, package) == []


@pytest.mark.parametrize("text", ["GGUF", "if fmt == 'gguf':", "import bitsandbytes as bnb", "bnb_4bit_quant_type",
                                  "scheme 'nf4'", "Q4_K_M", "q8_0", "ggml_type", "IQ4_XS", "use tensorizer",
                                  "BNB-NF4", "q5_1", "fp4 weights"])
def test_name_checker_catches_planted_names(text):
    hits = format_mentions(f"x = 1\n{text}\n")
    assert hits and {line for line, _ in hits} == {2}


@pytest.mark.parametrize("text", ["number of blocks", "logits", "fp48", "nf40", "subnbnb",
                                  "qkv_proj", "q_proj", "hf_config", "safetensors-style names"])
def test_name_checker_ignores_ordinary_words(text):
    assert format_mentions(text) == []


# ---- the rules hold for the real tree ----------------------------------------------------------
def test_core_has_python_files():
    assert len(core_files()) > 10 and (CORE / "load.py") in core_files()


def test_core_never_imports_plugins():
    offenders = {str(path.relative_to(CORE.parent)): hits for path in core_files()
                 if (hits := plugin_imports(path.read_text(), _module_package(path)))}
    assert offenders == {}, "core/ must stay format-agnostic: word these generically or move them into a plugin"


def test_core_never_names_a_format_or_scheme():
    offenders = {str(path.relative_to(CORE.parent)): hits for path in core_files()
                 if (hits := format_mentions(path.read_text()))}
    assert offenders == {}, "core/ must stay format-agnostic: word these generically or move them into a plugin"
