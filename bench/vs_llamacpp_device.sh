#!/bin/bash
# The side-by-side comparison with llama.cpp on the lent GPU machine, in two back-to-back calls
# (the CUDA build of llama.cpp takes ~10-12 minutes, longer than one call may run, and the machine
# is given back 30 s after a call returns, so the second call must follow at once).
#
#   call 1:  bash bench/vs_llamacpp_device.sh start  SRC.tgz          # build in the background, make the GGUFs
#   call 2:  bash bench/vs_llamacpp_device.sh finish [MORE.gguf ...]  # wait for the build, run both engines
#
# Run from the repository root with toolkit importable (PYTHONPATH); results go to $OUT/vs.
# Environment: WORK (default /tmp/w: llama.cpp source and build), MODELS (default /tmp/m).
set -u
work=${WORK:-/tmp/w}; models=${MODELS:-/tmp/m}; out=${OUT:-/tmp/out}
export PYTHONUNBUFFERED=1
case "$1" in
  start)
    mkdir -p "$work" "$models"
    setsid nohup bash bench/build_llamacpp.sh "$(realpath "$2")" "$work" 16 > "$work/build.log" 2>&1 < /dev/null &
    python3 bench/make_gguf_models.py --out "$models"          # 1.5B Q4_0, 1.5B Q4_K_M, 8B Q4_K_M
    for i in $(seq 80); do [ -f "$work/build.done" ] && break; sleep 5; done   # use the rest of the call
    tail -2 "$work/build.log" ;;
  finish)
    shift
    for i in $(seq 100); do [ -f "$work/build.done" ] && break; sleep 5; done
    [ -f "$work/build.done" ] || { echo "llama.cpp build not done:"; tail -5 "$work/build.log"; exit 1; }
    python3 bench/bench_vs_llamacpp.py --llama-build "$work/llama.cpp/build" --out "$out/vs" --models \
        "$models/llama-1.5B-Q4_0.gguf" "$models/llama-1.5B-Q4_K_M.gguf" "$models/llama-8B-Q4_K_M.gguf" "$@" ;;
  *) echo "usage: $0 start SRC.tgz | finish [MORE.gguf ...]"; exit 2 ;;
esac
