#!/usr/bin/env bash
# The test command (README, .ci/run): installs dependencies, builds with CUDA off, runs every
# test through CTest, fuzzes the parsers for a bounded time (tests/fuzz), then builds the whole
# binary with CUDA on where nvcc exists and runs the unit tests against it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
started=$SECONDS
bash deploy/install-deps.sh

# ccache (repository's .ccache/): the CUDA-on build at the end compiles the same C++ again.
# NOHASHDIR: the build directory is not part of the key (it is only in the debug info).
export CCACHE_DIR="${CCACHE_DIR:-$PWD/.ccache}" CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
cmake -S . -B build -G Ninja -DTANDEM_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" >/dev/null
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

# CUDA-on build: the whole `tandem` binary with the CUDA backend (sm_90, cuBLAS, NCCL), the
# GPU checks and the unit tests, from the same C++ objects where they do not differ (ccache:
# only the CUDA sources, the backend seam's files and the test binary's path differ). The unit
# tests run again against it: config checks, the launcher, the CLI and the transfer factory
# take other branches where the CUDA backend is built in, and every shared host-side part must
# hold there too; tests/unit_cuda holds the CUDA backend's own host code that runs without a GPU. Nothing runs on a GPU here (none): tests/gpu/without_gpu.sh checks that the
# binary and the checks say so and refuse cleanly; tests/gpu/run.sh runs the checks on a GPU
# machine.
if [[ -x /usr/local/cuda/bin/nvcc ]] || command -v nvcc >/dev/null; then
  cmake -S . -B build-cuda -G Ninja -DTANDEM_CUDA=ON -DTANDEM_BUILD_TESTS=ON \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" >/dev/null
  cmake --build build-cuda -j2 --target tandem cuda_kernels_check cuda_forward_check \
    nccl_transfer_check tandem_unit_tests tandem_cuda_unit_tests
  ctest --test-dir build-cuda --output-on-failure --timeout 900 -j2 -R '^unit(_cuda)?/'
  bash tests/gpu/without_gpu.sh build-cuda
  echo "== CUDA build: $((SECONDS - started)) s (GPU checks skipped: no GPU on this machine; run tests/gpu/run.sh on one)"
else
  echo "== CUDA build skipped: no nvcc"
fi
