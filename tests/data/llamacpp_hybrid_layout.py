"""Record the tensor layout and metadata llama.cpp's own converter writes for the tiny hybrid models.

Runs llama.cpp's convert_hf_to_gguf.py (its vendored gguf-py) on the checkpoints of
tests/hybrid_fixtures.py, F32, and saves names, shapes, types and the ``{arch}.*`` metadata as
JSON (tests/data/llamacpp_hybrid_layout.json), which test_gguf_hybrid.py compares our writer to.
The tiny models have no real tokenizer, so the converter's ``set_vocab`` is replaced by a no-op:
the tokenizer is not what is compared. ``--no-mtp``: the tiny models have no MTP block. Command (from the repository root):

    .venv/bin/python tests/data/llamacpp_hybrid_layout.py /work/dl/llama_cpp_python-0.3.36/vendor/llama.cpp
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# llama.cpp's qwen3next architecture has sparse-MoE FFNs only (no dense ffn_gate/up/down), so the
# dense-MLP tiny Qwen3-Next cannot be converted by it; the MoE one can.
ONLY = ("qwen3_5", "qwen3_next_moe", "qwen3_5_moe")
RUNNER = """
import sys
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[1:]]
sys.path.insert(0, {root!r}); sys.path.insert(1, {root!r} + "/gguf-py")
import conversion.base as base
base.TextModel.set_vocab = lambda self: None
import runpy
runpy.run_path({root!r} + "/convert_hf_to_gguf.py", run_name="__main__")
"""


def fingerprint(values) -> list[float]:
    """Sum and a position-weighted sum of the values (in file order): catches wrong values and
    permuted rows or columns alike."""
    import numpy as np  # noqa: PLC0415

    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    return [float(flat.sum()), float((flat * np.linspace(-1.0, 1.0, flat.size)).sum())]


def layout(path: Path, root: str) -> dict:
    sys.path.insert(0, root + "/gguf-py")
    from gguf import GGUFReader  # noqa: PLC0415 - llama.cpp's vendored copy

    reader = GGUFReader(str(path))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    meta = {}
    for name, field in reader.fields.items():
        if name.startswith(arch + "."):
            value = field.contents()
            meta[name] = value
    tensors = {t.name: {"shape": [int(d) for d in t.shape], "type": t.tensor_type.name,
                        "fingerprint": fingerprint(t.data)} for t in reader.tensors}
    return {"architecture": arch, "metadata": meta, "tensors": tensors}


def main(root: str) -> None:
    sys.path.insert(0, str(HERE.parent))
    from hybrid_fixtures import save_hybrid  # noqa: PLC0415

    out = {}
    with tempfile.TemporaryDirectory() as folder:
        for kind in ONLY:
            src, dst = Path(folder) / kind, Path(folder) / f"{kind}.gguf"
            save_hybrid(src, kind)
            script = Path(folder) / "run.py"
            script.write_text(RUNNER.format(root=root))
            subprocess.run([sys.executable, str(script), str(src), "--outfile", str(dst), "--outtype", "f32", "--no-mtp"],
                           check=True)
            out[kind] = layout(dst, root)
    (HERE / "llamacpp_hybrid_layout.json").write_text(json.dumps(out, indent=1, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1])
