"""Our K-quant / Q8_0 quantizer against llama-quantize on the same F32 GGUF: weight RMSE and time.

For each type, llama-quantize (``--pure``, so every matrix gets that type; its thread count =
``--threads``) quantizes the F32 file; then our ``quantize()`` (torch on the CPU, the same
thread count) quantizes every tensor llama-quantize quantized, to the same type. Both outputs
are decoded with gguf-py's ``dequantize`` (an independent decoder) and compared with the F32
weights. Printed per type: RMSE over all those tensors (ours, llama.cpp, ratio: < 1 means ours
is more accurate), and seconds (our quantize() calls alone, our whole ``toolkit convert``
with ``--convert``, and llama-quantize's wall time).

    # an F32 GGUF of a real model (dequantized Gemma 3 270M here)
    toolkit convert gemma-3-270m-q4_k_m.gguf g-f32.gguf --to gguf:F32
    LD_LIBRARY_PATH=/path/llama.cpp/build/bin python bench/bench_quantize_vs_llamacpp.py g-f32.gguf \\
        --llama-quantize /path/llama.cpp/build/bin/llama-quantize --threads 2 --types Q4_K,Q5_K,Q6_K,Q8_0

``--limit N`` uses the first N quantized tensors only (the RMSE part; quick checks).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from toolkit.kernels.gguf_quant import quantize


def run_llama_quantize(binary: str, source: Path, dest: Path, qtype: str, threads: int) -> float:
    start = time.perf_counter()
    subprocess.run([binary, "--pure", str(source), str(dest), qtype, str(threads)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def run_convert(source: Path, dest: Path, qtype: str, threads: int) -> float:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "toolkit", "convert", str(source), str(dest), "--to", f"gguf:{qtype}",
                    "--force"], check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def compare(source: GGUFReader, theirs: GGUFReader, qtype: GGMLQuantizationType, limit: int | None):
    """(our squared error, their squared error, elements, our quantize seconds) over the tensors
    llama-quantize stored as ``qtype``."""
    originals = {t.name: t for t in source.tensors}
    ours_sq = theirs_sq = 0.0
    elements, seconds, done = 0, 0.0, 0
    for tensor in theirs.tensors:
        if tensor.tensor_type != qtype or (limit is not None and done >= limit):
            continue
        done += 1
        x = np.asarray(originals[tensor.name].data, dtype=np.float32).reshape(-1, int(tensor.shape[0]))
        start = time.perf_counter()
        packed = quantize(torch.from_numpy(x), qtype).numpy()
        seconds += time.perf_counter() - start
        mine = dequantize(packed, qtype).reshape(x.shape)
        their = dequantize(np.asarray(tensor.data), qtype).reshape(x.shape)
        ours_sq += float(((mine.astype(np.float64) - x) ** 2).sum())
        theirs_sq += float(((their.astype(np.float64) - x) ** 2).sum())
        elements += x.size
    return ours_sq, theirs_sq, elements, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="an F32 GGUF file")
    parser.add_argument("--llama-quantize", required=True, help="path of llama.cpp's llama-quantize")
    parser.add_argument("--types", default="Q4_K,Q5_K,Q6_K,Q8_0")
    parser.add_argument("--threads", type=int, default=2, help="threads for both (torch and llama-quantize)")
    parser.add_argument("--convert", action="store_true", help="also time our whole `toolkit convert`")
    parser.add_argument("--limit", type=int, default=None, help="compare only the first N quantized tensors")
    parser.add_argument("--keep", type=Path, default=None, help="keep llama-quantize's outputs in this folder")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    source = GGUFReader(str(args.source))
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench-quant-"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"{args.source}: {len(source.tensors)} tensors; threads {args.threads} (torch and llama-quantize)")
    print("type   rmse ours     rmse llama.cpp  ratio    quantize() s  convert s  llama-quantize s")
    for name in args.types.split(","):
        qtype = GGMLQuantizationType[name.strip().upper()]
        theirs_path = folder / f"llama-{qtype.name}.gguf"
        llama_s = run_llama_quantize(args.llama_quantize, args.source, theirs_path, qtype.name, args.threads)
        ours_sq, theirs_sq, elements, seconds = compare(source, GGUFReader(str(theirs_path)), qtype, args.limit)
        ours_rmse, theirs_rmse = (ours_sq / elements) ** 0.5, (theirs_sq / elements) ** 0.5
        convert_s = run_convert(args.source, folder / f"ours-{qtype.name}.gguf", qtype.name, args.threads) \
            if args.convert else float("nan")
        print(f"{qtype.name:6s} {ours_rmse:.6e}  {theirs_rmse:.6e}    {ours_rmse / theirs_rmse:.4f}   "
              f"{seconds:10.2f}  {convert_s:9.2f}  {llama_s:10.2f}", flush=True)


if __name__ == "__main__":
    main()
