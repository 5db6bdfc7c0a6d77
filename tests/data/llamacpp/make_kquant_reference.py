"""Makes kquant_rows.npz: 8 rows of an off-grid weight matrix and llama-quantize's Q4_K/Q5_K/Q6_K bytes for them.

How it was made (llama.cpp CPU build 0.25.3 ggml, the one in bench/build_llamacpp.sh):
  toolkit convert gemma-3-270m-q4_k_m.gguf g-f32.gguf --to gguf:F32
  # off any quantization grid: ffn_down weights + N(0, (0.1 * their std)^2), numpy seed 0
  python - (noise step: see add_noise below) on a copy, g-f32-noisy.gguf
  for T in Q4_K Q5_K Q6_K; do llama-quantize --pure g-f32-noisy.gguf noisy-$T.gguf $T 2; done
  python tests/data/llamacpp/make_kquant_reference.py /tmp/tokq
Rows are quantized independently (a row is whole 256-element blocks), so llama-quantize's first
rows are exactly its answer for these 8 rows.
"""
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader

TENSOR, ROWS = "blk.3.ffn_down.weight", 8


def add_noise(path: str) -> None:
    reader = GGUFReader(path, "r+")
    rng = np.random.default_rng(0)
    for tensor in reader.tensors:
        if tensor.name.endswith("ffn_down.weight"):
            x = tensor.data
            x += rng.standard_normal(x.shape).astype(np.float32) * (0.1 * float(x.std()))
    reader.data.flush()


def main(folder: Path) -> None:
    def rows(name: str) -> np.ndarray:
        tensor = next(t for t in GGUFReader(str(folder / name)).tensors if t.name == TENSOR)
        return np.array(tensor.data[:ROWS])
    out = {"x": rows("g-f32-noisy.gguf")}
    for qtype in ("Q4_K", "Q5_K", "Q6_K"):
        out[qtype] = rows(f"noisy-{qtype}.gguf")
    np.savez_compressed(Path(__file__).with_name("kquant_rows.npz"), **out)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
