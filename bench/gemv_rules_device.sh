#!/bin/bash
# One-token Gluon GEMV launch rules on the lent GPU machine, in one call: the kernel sweep against the Triton GEMV,
# then the engine A/B of the rules it proposes, in the background so that a second call can collect it (the machine
# is given back 30 s after a call returns; chain the calls at once).
#
#   call 1: bash bench/gemv_rules_device.sh sweep TYPES [SHAPES]   # sweep -> $OUT/sweep.json, then A/B in background
#   call 2: bash bench/gemv_rules_device.sh collect                # wait for the A/B, print its table
#
# Run from the repository root with toolkit installed (the device recipe: wheels under .whl, PYTHONPATH=/tmp/site).
# Environment: MODELS (SIZE:TYPE of bench/make_gguf_models.py, default "1.5B:Q8_0"), ARMS (default "shipped
# swept:/tmp/gemv/sweep.json"), ROUNDS (2), SWEEP_S (seconds the sweep may take, 240), LAUNCHES (space-separated,
# default the sweep's per-type list). Work files go to /tmp/gemv.
set -u
work=/tmp/gemv; out=${OUT:-/tmp/out}
export PYTHONUNBUFFERED=1
mkdir -p "$work" "$out"
case "${1:-}" in
  sweep)
    shapes=${3:-4096x14336,14336x4096,28672x4096,2048x8192,16384x2048,3072x2048,2048x2048,32000x2048}
    timeout "${SWEEP_S:-240}" python3 bench/sweep_gluon_gemv.py --types "$2" --shapes "$shapes" \
      ${LAUNCHES:+--launches $LAUNCHES} --json "$work/sweep.json" 2>&1 | tee "$out/sweep.log"
    cp "$work/sweep.json" "$out/" 2>/dev/null
    rm -f "$work/ab.done"
    specs=${MODELS:-1.5B:Q8_0}; models=""
    for model in $specs; do models="$models $work/m/llama-${model%%:*}-${model#*:}.gguf"; done
    setsid nohup bash -c "python3 bench/make_gguf_models.py --out $work/m --models $specs > $work/models.log 2>&1;
      python3 bench/ab_gemv_rules.py $models --rounds ${ROUNDS:-2} --arms ${ARMS:-shipped swept:$work/sweep.json} \
        > $work/ab.log 2>&1; touch $work/ab.done" > /dev/null 2>&1 < /dev/null &
    echo "A/B started in the background: $models" ;;
  collect)
    for i in $(seq "${WAIT_N:-180}"); do [ -f "$work/ab.done" ] && break; sleep 3; done
    tail -3 "$work/models.log"; cat "$work/ab.log" | tee "$out/ab.log"
    [ -f "$work/ab.done" ] || echo "A/B not done yet" ;;
  *) echo "usage: $0 sweep TYPES [SHAPES] | collect"; exit 2 ;;
esac
