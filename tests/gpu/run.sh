#!/usr/bin/env bash
# The prepared GPU check (issue: GPU pools): on a machine with an NVIDIA GPU and /usr/local/cuda,
# builds Tandem with CUDA on, runs every GPU check that exists today and prints one table, in at
# most 8 minutes (each step has its own time limit). On a machine without a GPU it says so and
# exits 77 (skipped) before building anything.
#   bash tests/gpu/run.sh [BUILD_DIR]        (default build-cuda; raw logs in BUILD_DIR/gpu-run/)
#
# What runs today: cuda_kernels_check (every kernel of common/engine/cuda/kernels.h and the
# cuBLAS GEMM against a CPU reference: max error vs tolerance) and nccl_transfer_check (the NCCL
# KV transfer between two processes on GPUs 0 and 1; needs two GPUs). The rows for the CUDA
# forward pass (greedy GPU vs CPU, the 1 prefill + 1 decode cluster over CUDA IPC, decode vs the
# HBM roofline, prefill vs the bf16 GEMM peak, KV transfer vs device-to-device copy) say
# "not built yet": there is no CUDA engine backend in this tree (`device: cuda` is refused).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
build=${1:-build-cuda}
started=$SECONDS

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "tests/gpu/run.sh: skipped: no NVIDIA GPU visible (nvidia-smi -L failed); run it on a GPU machine"
  exit 77
fi
if [[ ! -x /usr/local/cuda/bin/nvcc ]] && ! command -v nvcc >/dev/null; then
  echo "tests/gpu/run.sh: no nvcc (expected /usr/local/cuda/bin/nvcc): cannot build the CUDA backend"
  exit 1
fi
logs="$build/gpu-run"
mkdir -p "$logs"
nvidia-smi -L | tee "$logs/gpus.txt"
gpus=$(grep -c '^GPU ' "$logs/gpus.txt")

rows=()
row() { rows+=("$(printf '| %-34s | %-8s | %s |' "$1" "$2" "$3")"); }

# Build: the CUDA backend and its checks (ccache when present: a rerun rebuilds nothing).
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
if timeout 420 cmake -S . -B "$build" -G Ninja -DTANDEM_CUDA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
     "${launcher[@]}" >"$logs/configure.log" 2>&1 &&
   timeout $((420 - (SECONDS - started))) cmake --build "$build" -j"$(nproc)" \
     --target tandem cuda_kernels_check nccl_transfer_check >"$logs/build.log" 2>&1; then
  row "build (CUDA on)" "ok" "$((SECONDS - started)) s"
else
  row "build (CUDA on)" "FAIL" "see $logs/configure.log, $logs/build.log"
  tail -n 30 "$logs/build.log" 2>/dev/null
  printf '%s\n' "| check | result | detail |" "|---|---|---|" "${rows[@]}"
  exit 1
fi

failed=0
timeout 60 "$build/tests/gpu/cuda_kernels_check" >"$logs/cuda_kernels.log" 2>&1
rc=$?
pass=$(grep -c ' PASS$' "$logs/cuda_kernels.log")
fail=$(grep -c ' FAIL$' "$logs/cuda_kernels.log")
if ((rc == 0)); then
  row "kernels vs CPU reference" "ok" "$pass checks within tolerance"
else
  row "kernels vs CPU reference" "FAIL" "rc $rc, $fail of $((pass + fail)) over tolerance ($logs/cuda_kernels.log)"
  failed=1
fi

if ((gpus >= 2)); then
  timeout 120 "$build/tests/gpu/nccl_transfer_check" >"$logs/nccl.log" 2>&1
  rc=$?
  if ((rc == 0)); then
    row "NCCL KV transfer (GPU 0 -> 1)" "ok" "$(grep -iE 'GB/s' "$logs/nccl.log" | tail -n 1)"
  else
    row "NCCL KV transfer (GPU 0 -> 1)" "FAIL" "rc $rc ($logs/nccl.log)"
    failed=1
  fi
else
  row "NCCL KV transfer (GPU 0 -> 1)" "skipped" "needs two GPUs, $gpus visible"
fi

for missing in "greedy GPU vs CPU (SmolLM2, random)" "cluster over CUDA IPC (openai)" \
               "decode step vs HBM roofline" "prefill vs bf16 GEMM peak" \
               "KV transfer vs D2D copy"; do
  row "$missing" "n/a" "not built yet: no CUDA engine backend (device: cuda is refused)"
done

echo
printf '%s\n' "| check | result | detail |" "|---|---|---|" "${rows[@]}"
echo "tests/gpu/run.sh: $((SECONDS - started)) s; logs in $logs"
exit $failed
