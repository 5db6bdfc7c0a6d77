"""GGUF conversion throughput: our torch quantizer against gguf-py's numpy quantizer.

Both quantize the same random float32 tensor (default 4096 x 4096, a typical projection)
in one run. gguf-py always runs on the CPU (numpy); ours runs on ``--device``. For the
types gguf-py implements (Q8_0, Q4_0 by default) the outputs are also compared byte for
byte. K-quants (gguf-py has no quantizer for them) are timed for ours alone, with their
relative RMS error after ``gguf.quants.dequantize``.

    python bench/bench_quantize.py --device cpu
    python bench/bench_quantize.py --device cuda --types Q8_0,Q4_0,Q4_K,Q6_K --json out.json
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from toolkit.kernels.gguf_quant import quantize


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def best_seconds(fn, repeats: int, device: str) -> float:
    """Fastest of ``repeats`` timed calls, after one warm-up call."""
    fn()
    sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return min(times)


def bench_type(name: str, x: torch.Tensor, args) -> dict:
    qtype = GGMLQuantizationType[name]
    on_device = x.to(args.device)
    ours_s = best_seconds(lambda: quantize(on_device, qtype), args.repeats, args.device)
    ours = quantize(on_device, qtype).cpu().numpy()
    row = {"type": name, "device": args.device, "elements": x.numel(), "ours_s": ours_s,
           "ours_melem_per_s": x.numel() / ours_s / 1e6}
    decoded = gguf_dequantize(ours, qtype)
    row["rel_rmse"] = float(np.sqrt(((decoded - x.numpy()) ** 2).mean() / (x.numpy() ** 2).mean()))
    try:
        reference = gguf_quantize(x.numpy(), qtype)
    except NotImplementedError:
        return row  # gguf-py has no quantizer for this type
    gguf_s = best_seconds(lambda: gguf_quantize(x.numpy(), qtype), args.gguf_repeats, "cpu")
    row.update(gguf_py_s=gguf_s, gguf_py_melem_per_s=x.numel() / gguf_s / 1e6, speedup=gguf_s / ours_s,
               byte_identical=bool(np.array_equal(ours, reference)))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="where our quantizer runs (cpu, cuda, cuda:1)")
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--types", default="Q8_0,Q4_0", help="comma list, e.g. Q8_0,Q4_0,Q5_1,Q4_K,Q6_K")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of ours (best is reported)")
    parser.add_argument("--gguf-repeats", type=int, default=2, help="timed runs of gguf-py (slow)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    x = torch.randn(args.rows, args.cols, generator=torch.Generator().manual_seed(0)) * 0.02
    print(f"tensor {args.rows}x{args.cols} float32; ours on {args.device}, gguf-py (numpy) on cpu; "
          f"torch threads {torch.get_num_threads()}", flush=True)
    rows = []
    for name in args.types.split(","):
        row = bench_type(name.strip().upper(), x, args)
        rows.append(row)
        peer = (f"gguf-py {row['gguf_py_s']:.3f}s  speedup x{row['speedup']:.1f}  identical {row['byte_identical']}"
                if "gguf_py_s" in row else "gguf-py: no quantizer")
        print(f"{row['type']:5s} ours {row['ours_s']:.3f}s ({row['ours_melem_per_s']:.0f} Melem/s)  {peer}  "
              f"rel rmse {row['rel_rmse']:.4f}", flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
