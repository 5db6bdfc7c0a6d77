"""bitsandbytes NF4 / int8 decode through the engine against dense bf16 on the same random model.

A random Llama of TinyLlama 1.1B's shape (``make_gguf_models.write_checkpoint``) is loaded as
dense bf16 and quantized on the fly by each scheme; ``toolkit``'s engine benchmark runs each at
batch 1 and 8 (128 prompt + 128 new tokens). Reported: TPOT p50 and its ratio to dense (the
issue's target is <= 1.3x), and whether the engine replayed CUDA graphs or fell back to eager.
Decode-sized bnb matmuls run the Triton kernels of ``toolkit.kernels.bnb``; ``--bitsandbytes``
turns them off (``TOOLKIT_BNB_TRITON=0``), so bitsandbytes' own path can be timed in the same run.

    python bench/bench_bnb_decode.py --out /tmp/bnb
    python bench/bench_bnb_decode.py --out /tmp/bnb --bitsandbytes    # also bitsandbytes' path
    python bench/bench_bnb_decode.py --out /tmp/bnb --without-mma     # also 2..16 tokens without the
                                                                      # tensor-core kernels (TOOLKIT_BNB_MMA=0)
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import warnings
from pathlib import Path

import torch

SCHEMES = (None, "bnb-nf4", "bnb-nf4:double_quant=true", "bnb-int8:threshold=0", "bnb-int8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--size", default="1.1B")
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--bitsandbytes", action="store_true",
                        help="also run each bnb scheme with the Triton kernels off (bitsandbytes' own matmuls)")
    parser.add_argument("--schemes", default=",".join(s or "dense" for s in SCHEMES),
                        help="comma list of the schemes to run (dense: dense bf16)")
    parser.add_argument("--without-mma", action="store_true",
                        help="also run each bnb scheme with the tensor-core kernels off (TOOLKIT_BNB_MMA=0)")
    args = parser.parse_args()

    import toolkit  # noqa: PLC0415
    from toolkit.kernels import runtime  # noqa: PLC0415
    from toolkit.core.engine import benchmark  # noqa: PLC0415

    from make_gguf_models import write_checkpoint  # noqa: PLC0415

    path = args.out / f"{args.size}-bf16"
    if not (path / "config.json").exists():
        write_checkpoint(path, args.size)
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    rows = []
    schemes = [None if s == "dense" else s for s in args.schemes.split(",")]
    runs = [(scheme, "1", "1") for scheme in schemes]  # (scheme, TOOLKIT_BNB_TRITON, TOOLKIT_BNB_MMA)
    if args.without_mma:
        runs += [(scheme, "1", "0") for scheme in schemes if scheme]
    if args.bitsandbytes:
        runs += [(scheme, "0", "1") for scheme in schemes if scheme]
    for scheme, triton_on, mma_on in runs:
        os.environ["TOOLKIT_BNB_TRITON"], os.environ["TOOLKIT_BNB_MMA"] = triton_on, mma_on
        runtime.invalidate()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            llm = toolkit.LLM(str(path), quant=scheme, dtype="bf16", device="cuda", max_num_seqs=max(sizes),
                              enable_prefix_caching=False, kv_cache_memory="2GiB")
        runner = llm.executor.runner
        result = benchmark.run(llm, sizes, 128, 128)
        for row in result:
            label = (scheme or "dense bf16") + ("" if not scheme else " (bitsandbytes)" if triton_on == "0"
                                                else " (no mma)" if mma_on == "0" else "")
            rows.append({"scheme": label, "batch": row["batch_size"], "tpot_ms": row["tpot_p50_ms"],
                         "graphs": runner.graphs is not None, "note": runner.graph_note})
            print(json.dumps(rows[-1]), flush=True)
        del caught
        llm.close()
        del llm, runner
        gc.collect()
        torch.cuda.empty_cache()
    dense = {r["batch"]: r["tpot_ms"] for r in rows if r["scheme"] == "dense bf16"}
    print(f"\ndevice: {torch.cuda.get_device_name()}\n| scheme | batch | TPOT ms | x dense | CUDA graphs |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['scheme']} | {r['batch']} | {r['tpot_ms']:.2f} | {r['tpot_ms'] / dense[r['batch']]:.2f} | "
              f"{'yes' if r['graphs'] else 'no: ' + str(r['note'])} |")
    (args.out / "bnb_decode.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
