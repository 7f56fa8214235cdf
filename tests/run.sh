#!/usr/bin/env bash
# The test command (README, .ci/run): installs dependencies, builds with CUDA off, runs every
# test through CTest, fuzzes the parsers for a bounded time (tests/fuzz), then checks that the
# CUDA backend compiles where nvcc exists.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
started=$SECONDS
bash deploy/install-deps.sh

cmake -S . -B build -G Ninja -DTANDEM_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j2
echo "== build: $((SECONDS - started)) s"
ctest --test-dir build --output-on-failure --timeout 900 -j2
echo "== tests: $((SECONDS - started)) s"

# Fuzzing (tests/fuzz/README.md): a clang build with libFuzzer, ASan and UBSan of the fuzz
# targets alone, each run for a bounded time on a scratch copy of its seed corpus; any crash or
# broken property fails CI.
fuzz_started=$SECONDS
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DTANDEM_FUZZ=ON -DTANDEM_BUILD_TESTS=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j2 --target tandem_fuzzers
echo "== fuzz build: $((SECONDS - fuzz_started)) s"
bash tests/fuzz/run.sh build-fuzz 20
echo "== fuzz: $((SECONDS - started)) s (fuzz build and runs: $((SECONDS - fuzz_started)) s)"

# CUDA-on build: every CUDA source must compile for sm_90 (the target that compiles them and
# nothing else, so that CI does not build the whole tree twice). Nothing runs here (no GPU);
# tests/gpu/ runs on a lent GPU machine.
if [[ -x /usr/local/cuda/bin/nvcc ]] || command -v nvcc >/dev/null; then
  cmake -S . -B build-cuda -G Ninja -DTANDEM_CUDA=ON -DTANDEM_BUILD_TESTS=OFF >/dev/null
  cmake --build build-cuda -j2 --target tandem_cuda_objects
  echo "== CUDA build: $((SECONDS - started)) s"
else
  echo "== CUDA build skipped: no nvcc"
fi
