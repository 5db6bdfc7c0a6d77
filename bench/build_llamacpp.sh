#!/bin/bash
# Build llama.cpp's llama-bench and llama-batched-bench with CUDA for sm_90 (H100/H200) from a
# source tarball of the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp (docs/benchmarks.md says
# how to make the stripped tarball). Usage: bench/build_llamacpp.sh SRC.tgz WORKDIR [JOBS]
# Leaves WORKDIR/llama.cpp/build/bin/{llama-bench,llama-batched-bench} and WORKDIR/build.done.
set -eu
tgz=$1; work=$2; jobs=${3:-16}
mkdir -p "$work"
if [ -x "$work/llama.cpp/build/bin/llama-batched-bench" ]; then touch "$work/build.done"; exit 0; fi
tar xzf "$tgz" -C "$work"
cd "$work/llama.cpp"
cmake -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF
cmake --build build -j"$jobs" --target llama-bench llama-batched-bench
touch "$work/build.done"
