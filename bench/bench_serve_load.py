"""``toolkit serve`` under load, and its throughput next to ``toolkit bench`` on the same model.

load (default): a server on MODEL takes ``--rounds`` rounds of ``--requests`` requests at
``--concurrency`` (prompts of 2-24 words, 1-64 new tokens, half streamed), ``--disconnects`` of
which hang up mid-stream. Checked after each round: every other request completed with the
right token count, nothing runs or waits, no KV block (or state slot) is held, and the
server's resident memory did not grow from one round to the next (``--max-growth-mib``).
Exit status 1 if any check fails.

    python bench/bench_serve_load.py                      # a tiny random Llama, CPU, 300 x 32, 50 drops
    python bench/bench_serve_load.py --model PATH --device cuda

throughput (``--throughput 1,8,32``): ``toolkit bench MODEL --batch-sizes 1,8,32`` runs first
(in a subprocess), then the server gets, at each concurrency C, C streamed greedy requests of
``--input-len`` random token ids and exactly ``--output-len`` new tokens at once (after a
warm-up). Reported: output tokens/s of both, their ratio, and the server's overhead per token
(how much longer each sequence waits per token). The stream's chunk times are not used: with
random prompts, random models emit byte pieces that are held back until they form text.

    python bench/bench_serve_load.py --make-model /tmp/m --throughput 1,8,32 --device cuda --dtype bf16

Needs the ``serve`` and ``test`` extras (fastapi, uvicorn, prometheus-client, httpx).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from serve_load import ServerProcess, mixed_requests, run_round, throughput, wait_idle  # noqa: E402

HELD = ("toolkit_num_requests_running", "toolkit_num_requests_waiting", "toolkit_kv_cache_blocks_used",
        "toolkit_state_slots_used", "toolkit_server_requests_in_flight")


def make_model(path: Path, hidden: int, layers: int) -> None:
    """A random Llama with the tests' BPE tokenizer (so text prompts and streamed text work)."""
    import torch  # noqa: PLC0415
    from conftest import save_tiny_tokenizer  # noqa: PLC0415
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415

    path.mkdir(parents=True, exist_ok=True)
    vocab = save_tiny_tokenizer(path)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 8 // 3,
                         num_hidden_layers=layers, num_attention_heads=max(hidden // 64, 1),
                         num_key_value_heads=max(hidden // 256, 1), max_position_embeddings=2048,
                         bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.05)
    model.to(torch.bfloat16).save_pretrained(path)
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, vocab {vocab}", flush=True)


def engine_args(args) -> list[str]:
    options = ["--device", args.device, "--dtype", args.dtype] if args.dtype else ["--device", args.device]
    return options + (["--kv-cache-memory", args.kv_cache_memory] if args.kv_cache_memory else [])


def load_test(args, model: Path) -> bool:
    server = ServerProcess(model, *engine_args(args), "--served-model-name", "m", "--max-num-seqs",
                           str(args.concurrency), "--max-waiting", str(4 * args.concurrency), log=args.log)
    ok, resident = True, []
    try:
        server.wait_ready()
        for round_index in range(args.rounds):
            specs = mixed_requests(args.requests, args.disconnects, seed=round_index)
            result = asyncio.run(run_round(server.url, "m", specs, args.concurrency))
            metrics = wait_idle(server.url)
            resident.append(metrics["process_resident_memory_bytes"] / 2**20)
            held = {name: metrics[name] for name in HELD if metrics.get(name)}
            print(f"round {round_index + 1}: {result.completed} completed, {result.disconnected} dropped, "
                  f"{len(result.errors)} errors in {result.seconds:.1f} s ({result.output_tokens / result.seconds:.0f} "
                  f"out tok/s); held after: {held or 'nothing'}; server RSS {resident[-1]:.0f} MiB", flush=True)
            for error in result.errors[:5]:
                print(f"  error: {error}")
            ok &= not result.errors and not held and result.completed == args.requests - args.disconnects
            ok &= result.disconnected == args.disconnects
        growth = resident[-1] - resident[0] if len(resident) > 1 else 0.0
        print(f"memory growth from round 1 to round {len(resident)}: {growth:+.1f} MiB "
              f"(limit {args.max_growth_mib} MiB)")
        ok &= growth < args.max_growth_mib
    finally:
        server.stop()
    print("PASS" if ok else "FAIL")
    return ok


def engine_bench(args, model: Path, sizes: list[int]) -> dict[int, dict]:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "bench.json"
        subprocess.run([sys.executable, "-m", "toolkit", "bench", str(model), *engine_args(args), "--batch-sizes",
                        ",".join(map(str, sizes)), "--input-len", str(args.input_len), "--output-len",
                        str(args.output_len), "--json", str(out)], check=True)
        return {row["batch_size"]: row for row in json.loads(out.read_text())["results"]}


def throughput_test(args, model: Path) -> None:
    sizes = [int(size) for size in args.throughput.split(",")]
    engine_rows = engine_bench(args, model, sizes)
    server = ServerProcess(model, *engine_args(args), "--served-model-name", "m", "--max-num-seqs", str(max(sizes)),
                           log=args.log)
    rows = []
    try:
        server.wait_ready()
        vocab = args.vocab
        asyncio.run(throughput(server.url, "m", max(sizes), 16, 4, vocab, max(sizes), seed=10**6))  # warm-up
        for i, size in enumerate(sizes):
            rows.append(asyncio.run(throughput(server.url, "m", size, args.input_len, args.output_len, vocab, size,
                                               seed=i)))
    finally:
        server.stop()
    # per-token overhead: how much longer each sequence waits per token on the server than in the engine
    print(f"\n{'conc.':>5} {'bench tok/s':>12} {'serve tok/s':>12} {'serve/bench':>11} {'overhead ms/token':>17}")
    for size, row in zip(sizes, rows):
        bench, served = engine_rows[size]["output_tokens_per_s"], row["output_tokens_per_s"]
        print(f"{size:>5} {bench:>12.1f} {served:>12.1f} {served / bench:>11.2f} "
              f"{1e3 * size * (1 / served - 1 / bench):>17.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"engine": engine_rows, "server": rows}, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model to serve (default: a tiny random Llama written to a temp dir)")
    parser.add_argument("--make-model", help="write a random Llama (--hidden, --layers) here and serve it")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype")
    parser.add_argument("--kv-cache-memory")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--disconnects", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-growth-mib", type=float, default=32.0)
    parser.add_argument("--throughput", help="concurrencies, e.g. 1,8,32: compare with toolkit bench instead")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=500, help="random prompt ids are drawn below this")
    parser.add_argument("--log", type=Path, help="write the server's output here")
    parser.add_argument("--json", help="write throughput results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        model = Path(args.model or args.make_model or Path(folder) / "model")
        if not args.model:
            make_model(model, args.hidden, args.layers)
        if args.throughput:
            throughput_test(args, model)
        elif not load_test(args, model):
            sys.exit(1)


if __name__ == "__main__":
    main()
