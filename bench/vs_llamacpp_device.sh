#!/bin/bash
# The side-by-side comparison with llama.cpp on the lent GPU machine, in back-to-back calls
# (the CUDA build of llama.cpp takes ~10-12 minutes, longer than one call may run, and the machine
# is given back 30 s after a call returns, so the calls must follow each other at once).
#
#   call 1:  bash bench/vs_llamacpp_device.sh start  SRC.tgz [SETS]  # build in the background, make the GGUFs
#   call 2+: bash bench/vs_llamacpp_device.sh finish SET            # wait for the build, run both engines
#
# SET: dense (1.5B Q4_0, 1.5B Q4_K_M, 8B Q4_K_M; issue 16), loads (the two 1.5B files' loads alone, 12 in
# turns, no speed runs: needs the dense files), moe (Qwen3-30B-A3B-shaped Q4_K_M,
# batches 1/8/32; issue 12), hybrid (Qwen3.5-9B-shaped Q4_K_M, batches 1/8/32/64; issue 11).
# `start` makes the files of SETS (default: "dense moe hybrid").
# Run from the repository root with toolkit importable (PYTHONPATH); results go to $OUT/vs-SET.
# Environment: WORK (default /tmp/w: llama.cpp source and build), MODELS (default /tmp/m).
set -u
work=${WORK:-/tmp/w}; models=${MODELS:-/tmp/m}; out=${OUT:-/tmp/out}
export PYTHONUNBUFFERED=1
make_set() {
  case "$1" in
    dense)  python3 bench/make_gguf_models.py --out "$models" ;;
    moe)    [ -f "$models/qwen3-30b-a3b-Q4_K_M.gguf" ] || python3 bench/make_moe_gguf.py "$models/qwen3-30b-a3b-Q4_K_M.gguf" ;;
    hybrid) [ -f "$models/qwen35-9b-Q4_K_M.gguf" ] || python3 bench/make_qwen35_9b_gguf.py "$models/qwen35-9b-Q4_K_M.gguf" ;;
  esac
}
case "$1" in
  start)
    mkdir -p "$work" "$models"
    setsid nohup bash bench/build_llamacpp.sh "$(realpath "$2")" "$work" 16 > "$work/build.log" 2>&1 < /dev/null &
    for set in ${3:-dense moe hybrid}; do time make_set "$set"; done
    ls -la "$models"; df -h "$models" | tail -1
    for i in $(seq 60); do [ -f "$work/build.done" ] && break; sleep 5; done   # use the rest of the call
    tail -2 "$work/build.log" ;;
  finish)
    for i in $(seq 100); do [ -f "$work/build.done" ] && break; sleep 5; done
    [ -f "$work/build.done" ] || { echo "llama.cpp build not done:"; tail -5 "$work/build.log"; exit 1; }
    build="$work/llama.cpp/build"
    # byte-compile toolkit and gguf-py as a normal pip install would have: a --no-compile --target install
    # (the device recipe) otherwise compiles every module from source inside the timed load, every time, as the
    # image sets PYTHONDONTWRITEBYTECODE=1 (~0.1 s on a 2-core box; gguf-py alone 0.056 s on the H100). The image's
    # Triton has no bytecode either: its import and the first token compiled ~80 of its modules (session 33's profile)
    for package in toolkit gguf triton; do
      python3 -m compileall -q "$(python3 -c "import os, $package; print(os.path.dirname($package.__file__))")" > /dev/null
    done
    case "$2" in
      dense)  python3 bench/bench_vs_llamacpp.py --llama-build "$build" --out "$out/vs-dense" --models \
                "$models/llama-1.5B-Q4_0.gguf" "$models/llama-1.5B-Q4_K_M.gguf" "$models/llama-8B-Q4_K_M.gguf" ;;
      moe)    python3 bench/bench_vs_llamacpp.py --llama-build "$build" --out "$out/vs-moe" --batch-sizes 1,8,32 \
                --models "$models/qwen3-30b-a3b-Q4_K_M.gguf" ;;
      hybrid) python3 bench/bench_vs_llamacpp.py --llama-build "$build" --out "$out/vs-hybrid" \
                --models "$models/qwen35-9b-Q4_K_M.gguf" ;;
      loads)  python3 bench/bench_vs_llamacpp.py --llama-build "$build" --out "$out/vs-loads" --loads-only \
                --load-runs 12 --models "$models/llama-1.5B-Q4_0.gguf" "$models/llama-1.5B-Q4_K_M.gguf" ;;
      *) echo "unknown set $2"; exit 2 ;;
    esac ;;
  *) echo "usage: $0 start SRC.tgz [SETS] | finish dense|loads|moe|hybrid"; exit 2 ;;
esac
