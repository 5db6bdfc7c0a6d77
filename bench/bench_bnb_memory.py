"""Peak host memory of on-the-fly NF4 loading: toolkit vs transformers + bitsandbytes.

A random Llama (default ~250M parameters: hidden 1024, 12 layers, 16 heads / 8 KV heads,
intermediate 4096, vocab 32000, untied head) is written as bf16 safetensors to a temporary
directory. Each side then loads it with NF4 on-the-fly quantization in a fresh subprocess,
runs one forward pass (so the model is really usable) and reports its peak resident set size
(``ru_maxrss``) and the RSS after imports, before loading. The table shows both and the
toolkit/transformers ratio of the load's own increase (peak minus after-imports).

    python bench/bench_bnb_memory.py [--device cpu] [--double-quant] [--json out.json]

transformers' bitsandbytes path needs ``accelerate``; without it only toolkit is measured.

Reading the numbers: peak RSS counts the checkpoint's memory-mapped file pages on both sides.
transformers keeps unquantized tensors (embedding, LM head) mapped from the file, so they are
file pages, not anonymous memory; toolkit copies them into its own (vocab-padded) tables. glibc's
heap fragmentation varies run to run; ``MALLOC_MMAP_THRESHOLD_=65536`` in the environment (the
children inherit it) takes it out of the comparison.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch


def make_model(path: Path, args) -> int:
    """Write config.json and model.safetensors with random bf16 weights; returns the parameter count."""
    from safetensors.torch import save_file  # noqa: PLC0415
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415

    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, tie_word_embeddings=False, dtype="bfloat16")
    with torch.device("meta"):  # names and shapes only; values are drawn tensor by tensor below
        shapes = {name: p.shape for name, p in LlamaForCausalLM(config).state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    tensors = {name: (torch.randn(shape, generator=generator) * 0.05).to(torch.bfloat16)
               for name, shape in shapes.items()}
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(path)
    return sum(t.numel() for t in tensors.values())


def status_mib(key: str = "VmRSS") -> float:
    """A memory line of /proc/self/status (VmRSS, RssAnon, RssFile), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rss_mib() -> float:
    return status_mib("VmRSS")


class AnonPeak:
    """Samples RssAnon every ``interval`` seconds on a thread: the peak of memory the process owns,
    without the file pages of memory-mapped checkpoints that ru_maxrss also counts."""

    def __init__(self, interval: float = 0.002):
        self.interval, self.peak, self._stop = interval, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, status_mib("RssAnon"))
            time.sleep(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, status_mib("RssAnon"))


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def child(side: str, path: str, device: str, double_quant: bool) -> None:
    """Runs in the subprocess: import, measure, load + forward, measure; prints one JSON line."""
    import bitsandbytes  # noqa: F401, PLC0415 - both sides use it: not part of either load's cost
    import transformers  # noqa: F401, PLC0415

    if side == "toolkit":
        from toolkit.core.registry import default_registry  # noqa: PLC0415

        default_registry()  # plugin imports happen here, before the baseline
    after_imports, anon_after_imports = rss_mib(), status_mib("RssAnon")
    with AnonPeak() as anon:
        logits = (_toolkit if side == "toolkit" else _transformers)(path, device, double_quant)
    print(json.dumps({"side": side, "after_imports_mib": after_imports, "peak_mib": peak_mib(),
                      "anon_after_imports_mib": anon_after_imports, "anon_peak_mib": anon.peak,
                      "finite": bool(torch.isfinite(logits.float()).all())}), flush=True)


PROMPT = list(range(1, 17))


def _toolkit(path: str, device: str, double_quant: bool) -> torch.Tensor:
    import toolkit  # noqa: PLC0415

    spec = "bnb-nf4:double_quant=true" if double_quant else "bnb-nf4"
    return toolkit.load(path, quant=spec, dtype="bf16", device=device).logits(PROMPT)


def _transformers(path: str, device: str, double_quant: bool) -> torch.Tensor:
    import transformers  # noqa: PLC0415

    config = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                             bnb_4bit_use_double_quant=double_quant,
                                             bnb_4bit_compute_dtype=torch.bfloat16)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, quantization_config=config,
                                                              dtype=torch.bfloat16, device_map=device)
    with torch.no_grad():
        return model(torch.tensor([PROMPT], device=device)).logits[0]


def measure(side: str, path: Path, args) -> dict:
    command = [sys.executable, __file__, "--child", side, "--path", str(path), "--device", args.device]
    command += ["--double-quant"] if args.double_quant else []
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{side} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--double-quant", action="store_true")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--model", help="measure this existing checkpoint directory instead of a generated one")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--child", choices=["toolkit", "transformers"], help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.path, args.device, args.double_quant)
    with tempfile.TemporaryDirectory(prefix="bench-bnb-") as tmp:
        path = Path(args.model or tmp)
        num_params = count_parameters(path) if args.model else make_model(path, args)
        file_mib = sum(f.stat().st_size for f in path.glob("*.safetensors")) / 2**20
        print(f"model: {num_params / 1e6:.0f}M parameters, {file_mib:.0f} MiB safetensors", flush=True)
        sides = ["toolkit"] + (["transformers"] if importlib.util.find_spec("accelerate") else [])
        results = {side: measure(side, path, args) for side in sides}
    report(results, num_params, file_mib, args)


def count_parameters(path: Path) -> int:
    from safetensors import safe_open  # noqa: PLC0415

    total = 0
    for file in path.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                total += math.prod(handle.get_slice(name).get_shape())
    return total


def report(results: dict, num_params: int, file_mib: float, args) -> None:
    print(f"MiB; NF4{' + double quant' if args.double_quant else ''} on {args.device}; 'load' = peak minus "
          "after imports; anon = RssAnon (excludes the mmapped checkpoint's file pages)")
    print(f"{'side':<14}{'after imports':>15}{'peak RSS':>10}{'load RSS':>10}{'peak anon':>11}{'load anon':>11}")
    for side, row in results.items():
        row["load_mib"] = row["peak_mib"] - row["after_imports_mib"]
        row["load_anon_mib"] = row["anon_peak_mib"] - row["anon_after_imports_mib"]
        print(f"{side:<14}{row['after_imports_mib']:>15.0f}{row['peak_mib']:>10.0f}{row['load_mib']:>10.0f}"
              f"{row['anon_peak_mib']:>11.0f}{row['load_anon_mib']:>11.0f}"
              f"{'' if row['finite'] else '  (non-finite logits!)'}")
    summary = {"parameters": num_params, "file_mib": file_mib, "results": results}
    if "transformers" in results:
        ours, theirs = results["toolkit"], results["transformers"]
        summary["ratios"] = {key: ours[key] / theirs[key] for key in ("peak_mib", "load_mib", "load_anon_mib")}
        print("toolkit / transformers: " + ", ".join(f"{key.removesuffix('_mib')} {value:.2f}x"
                                                     for key, value in summary["ratios"].items()))
    else:
        print("transformers not measured: its bitsandbytes path needs accelerate")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
