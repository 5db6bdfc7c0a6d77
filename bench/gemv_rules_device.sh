#!/bin/bash
# One-token Gluon GEMV launch rules on the lent GPU machine: the kernels' GPU numerics, the launch sweep against the
# Triton GEMV, then the engine A/B of the rules it proposes.
#
#   bash bench/gemv_rules_device.sh all TYPES [SHAPES]     # one call: tests, sweep, models and A/B, stopped in time
#   bash bench/gemv_rules_device.sh sweep TYPES [SHAPES]   # call 1 of 2: sweep -> $OUT/sweep.json, A/B in background
#   bash bench/gemv_rules_device.sh collect                # call 2 of 2: wait for the A/B, print its table
#
# ``all`` is the one to reach for: a machine goes back 30 s after a call returns and a fresh start often fails, so a
# second call chained to the first is a risk. It runs the Gluon GEMV's GPU tests from a copy of tests/ (so the
# installed toolkit is imported, not the checkout's), makes the models in the background meanwhile, sweeps, then runs
# the A/B in the foreground and stops it DEADLINE_S (570) seconds after its own start, leaving every log in $OUT as
# it goes: a run cut short still returns what it measured.
# Run from the repository root with toolkit installed (the device recipe: wheels under .whl, PYTHONPATH=/tmp/site).
# Environment: MODELS (SIZE:TYPE of bench/make_gguf_models.py, default "1.5B:Q8_0"), ARMS (default "shipped
# swept:<the sweep's JSON>"), ROUNDS (2), SWEEP_S (seconds the sweep may take, 240), TEST_S (``all``'s tests, 120),
# LAUNCHES (space-separated, default the sweep's per-type list), TESTS (``all``'s test files, default both Gluon GEMV
# files). Work files go to /tmp/gemv. With little device time left, a short call still answers the first question
# (is the kernel right, and is it ahead): TESTS=tests/test_gluon_gemv_q8_0.py TEST_S=80 SWEEP_S=90 DEADLINE_S=170
# ... all Q8_0 4096x14336,14336x4096 (timeout_s 190).
set -u
start=$(date +%s); work=/tmp/gemv; out=${OUT:-/tmp/out}
export PYTHONUNBUFFERED=1
mkdir -p "$work" "$out"
specs=${MODELS:-1.5B:Q8_0}; models=""
for model in $specs; do models="$models $work/m/llama-${model%%:*}-${model#*:}.gguf"; done
make_models() { python3 bench/make_gguf_models.py --out "$work/m" --models $specs > "$work/models.log" 2>&1; }
run_sweep() {  # $1 TYPES, $2 SHAPES
  timeout "${SWEEP_S:-240}" python3 bench/sweep_gluon_gemv.py --types "$1" \
    --shapes "${2:-4096x14336,14336x4096,28672x4096,2048x8192,16384x2048,3072x2048,2048x2048,32000x2048}" \
    ${LAUNCHES:+--launches $LAUNCHES} --json "$out/sweep.json" 2>&1 | tee "$out/sweep.log"
}
ab_command() { echo python3 bench/ab_gemv_rules.py $models --rounds "${ROUNDS:-2}" --arms ${ARMS:-shipped swept:$1}; }
case "${1:-}" in
  all)
    [ -n "${2:-}" ] || { echo "usage: $0 all TYPES [SHAPES]"; exit 2; }
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/gpu.txt"
    make_models & maker=$!
    rm -rf "$work/t" && mkdir -p "$work/t" && cp -r tests pyproject.toml "$work/t/"
    (cd "$work/t" && timeout "${TEST_S:-120}" python3 -m pytest -q -m gpu \
      ${TESTS:-tests/test_gluon_gemv.py tests/test_gluon_gemv_q8_0.py} 2>&1 | tail -30 > "$out/tests.log")
    tail -5 "$out/tests.log"
    echo "tests done at $(( $(date +%s) - start )) s"
    wait $maker; tail -2 "$work/models.log"
    run_sweep "$2" "${3:-}"
    echo "sweep done at $(( $(date +%s) - start )) s"
    $(ab_command "$out/sweep.json") > "$out/ab.log" 2>&1 & ab=$!
    while kill -0 $ab 2>/dev/null; do
      [ $(( $(date +%s) - start )) -ge "${DEADLINE_S:-570}" ] && { pkill -P $ab; kill $ab; echo "A/B stopped at the deadline"; }
      sleep 2
    done
    cat "$out/ab.log"; echo "end at $(( $(date +%s) - start )) s" ;;
  sweep)
    [ -n "${2:-}" ] || { echo "usage: $0 sweep TYPES [SHAPES]"; exit 2; }
    run_sweep "$2" "${3:-}"
    cp "$out/sweep.json" "$work/" 2>/dev/null
    rm -f "$work/ab.done"
    setsid nohup bash -c "$(declare -f make_models); specs='$specs' work=$work make_models;
      $(ab_command "$work/sweep.json") > $work/ab.log 2>&1; touch $work/ab.done" > /dev/null 2>&1 < /dev/null &
    echo "A/B started in the background: $models" ;;
  collect)
    for i in $(seq "${WAIT_N:-180}"); do [ -f "$work/ab.done" ] && break; sleep 3; done
    tail -3 "$work/models.log"; cat "$work/ab.log" | tee "$out/ab.log"
    [ -f "$work/ab.done" ] || echo "A/B not done yet" ;;
  *) echo "usage: $0 all TYPES [SHAPES] | sweep TYPES [SHAPES] | collect"; exit 2 ;;
esac
