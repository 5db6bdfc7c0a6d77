"""Our GGUF quantization against llama-quantize on the same F32 GGUF: whole-file time and weight RMSE.

Part 1, whole files (``--recipes``, default Q8_0,Q4_K_M,Q6_K: llama.cpp's mixed recipes, not
--pure): llama-quantize and our ``toolkit convert SRC DEST --to gguf:TYPE`` each write the file,
with the same thread count (``--threads``; ours through OMP_NUM_THREADS), ``--repeats`` times,
interleaved; medians are printed. Per type:

* llama wall: llama-quantize's whole process; llama quant: the ``quantize time`` it prints (open,
  quantize and write, without process start);
* ours wall: the whole ``python -m toolkit convert`` process (interpreter start and imports
  included); ours convert: the ``time`` it prints (open, quantize and write);
* the ratios ours / llama of both (< 1: ours is faster).

Part 2, accuracy (``--types``, default Q4_K,Q5_K,Q6_K,Q8_0): llama-quantize ``--pure`` (every
matrix in that type) quantizes the file; our ``quantize()`` (the compiled CPU quantizer unless
TOOLKIT_GGUF_QUANT_COMPILED=0; same threads) quantizes every tensor llama-quantize quantized, to
the same type. Both are decoded with gguf-py's ``dequantize`` (an independent decoder) and compared
with the F32 weights: RMSE over all those tensors (ours, llama.cpp, ratio: < 1 means ours is
more accurate) and our quantize() seconds.

    # an F32 GGUF of a real model (dequantized Gemma 3 270M here)
    toolkit convert gemma-3-270m-q4_k_m.gguf g-f32.gguf --to gguf:F32
    LD_LIBRARY_PATH=/path/llama.cpp/build/bin python bench/bench_quantize_vs_llamacpp.py g-f32.gguf \\
        --llama-quantize /path/llama.cpp/build/bin/llama-quantize --threads 2 --repeats 3

``--recipes ''`` or ``--types ''`` skips a part; ``--limit N`` uses the first N tensors in part 2.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from toolkit.kernels.gguf_quant import quantize
from toolkit.plugins.loaders.gguf.reader import FastGGUFReader, open_reader


def run_llama_quantize(binary: str, source: Path, dest: Path, qtype: str, threads: int,
                       pure: bool = True) -> tuple[float, float]:
    """(wall seconds, the quantize time llama-quantize prints)."""
    start = time.perf_counter()
    done = subprocess.run([binary, *(["--pure"] if pure else []), str(source), str(dest), qtype, str(threads)],
                          check=True, capture_output=True, text=True)
    wall = time.perf_counter() - start
    printed = re.search(r"quantize time =\s*([0-9.]+) ms", done.stdout + done.stderr)
    return wall, float(printed.group(1)) / 1000 if printed else float("nan")


def run_convert(source: Path, dest: Path, qtype: str, threads: int) -> tuple[float, float]:
    """(wall seconds of the whole ``toolkit convert`` process, the ``time`` it prints)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "toolkit", "convert", str(source), str(dest), "--to", f"gguf:{qtype}",
                           "--force"], check=True, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    printed = re.search(r"^time\s+([0-9.]+)s", done.stdout, re.MULTILINE)
    return wall, float(printed.group(1)) if printed else float("nan")


def whole_files(args, folder: Path) -> None:
    print(f"\nwhole files (recipes), threads {args.threads}, median of {args.repeats} interleaved runs")
    print("type     llama wall  llama quant   ours wall  ours convert   wall ratio  inner ratio")
    for recipe in filter(None, (r.strip().upper() for r in args.recipes.split(","))):
        llama, ours = [], []
        for _ in range(args.repeats):
            llama.append(run_llama_quantize(args.llama_quantize, args.source, folder / f"llama-{recipe}.gguf", recipe,
                                            args.threads, pure=False))
            ours.append(run_convert(args.source, folder / f"ours-{recipe}.gguf", recipe, args.threads))
        lw, lq = (statistics.median(r[i] for r in llama) for i in (0, 1))
        ow, oq = (statistics.median(r[i] for r in ours) for i in (0, 1))
        print(f"{recipe:8s} {lw:10.2f}  {lq:11.2f}  {ow:10.2f}  {oq:12.2f}  {ow / lw:11.2f}  {oq / lq:11.2f}",
              flush=True)


def compare(source: FastGGUFReader, theirs: FastGGUFReader, qtype: GGMLQuantizationType, limit: int | None):
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


def accuracy(args, folder: Path) -> None:
    source = open_reader(args.source)  # gguf-py's reader parses a 262k vocabulary for ~13 s
    print(f"\n--pure per type: {len(source.tensors)} tensors; threads {args.threads} (torch and llama-quantize)")
    print("type   rmse ours     rmse llama.cpp  ratio    quantize() s  llama-quantize s")
    for name in filter(None, (t.strip().upper() for t in args.types.split(","))):
        qtype = GGMLQuantizationType[name]
        theirs_path = folder / f"llama-pure-{qtype.name}.gguf"
        llama_s, _ = run_llama_quantize(args.llama_quantize, args.source, theirs_path, qtype.name, args.threads)
        ours_sq, theirs_sq, elements, seconds = compare(source, open_reader(theirs_path), qtype, args.limit)
        ours_rmse, theirs_rmse = (ours_sq / elements) ** 0.5, (theirs_sq / elements) ** 0.5
        print(f"{qtype.name:6s} {ours_rmse:.6e}  {theirs_rmse:.6e}    {ours_rmse / theirs_rmse:.4f}   "
              f"{seconds:10.2f}  {llama_s:10.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="an F32 GGUF file")
    parser.add_argument("--llama-quantize", required=True, help="path of llama.cpp's llama-quantize")
    parser.add_argument("--recipes", default="Q8_0,Q4_K_M,Q6_K", help="part 1: whole-file types ('' skips it)")
    parser.add_argument("--types", default="Q4_K,Q5_K,Q6_K,Q8_0", help="part 2: --pure RMSE types ('' skips it)")
    parser.add_argument("--threads", type=int, default=2, help="threads for both (torch and llama-quantize)")
    parser.add_argument("--repeats", type=int, default=3, help="part 1: runs of each (medians are printed)")
    parser.add_argument("--limit", type=int, default=None, help="part 2: compare only the first N quantized tensors")
    parser.add_argument("--keep", type=Path, default=None, help="keep the outputs in this folder")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench-quant-"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"{args.source}; threads {args.threads}; compiled quantizer "
          f"{'off' if os.environ.get('TOOLKIT_GGUF_QUANT_COMPILED') == '0' else 'on'}")
    try:
        if args.recipes:
            whole_files(args, folder)
        if args.types:
            accuracy(args, folder)
    finally:
        if args.keep is None:
            for path in folder.glob("*.gguf"):
                path.unlink()
            folder.rmdir()


if __name__ == "__main__":
    main()
